"""``mixstack bench grid``: every supported shape key, every level, against the compiled reference.

The grid is ``Cf`` in {16, 32, ..., 128}, ``lmax`` 1..6 and ``F`` in {1, 2, 4} (n_layers 4,
alpha on): 144 keys.  Per key the variants ``0c`` (``torch.compile`` of the reference),
``0`` (eager; "never slower than eager" needs it), ``1``, ``2`` and ``3`` are probed
(peak memory, the paths that ran, float64 errors on the first ``check_edges`` edges) and
timed by the one timing loop (``measure.timing``: interleaved, rotating order, medians),
forward + backward by default (the gradients of ``u0`` and ``alpha``), as
``runner`` does for the standard shapes.

The edge count per key holds a fixed number of row floats, by default half of
``EDGE_ROW_FLOATS`` = the tuner's timing set (2**18 edges at S1's width, F * ROW = 640; the
speed-ups over the compiled reference held within 2.4% at half, BENCHMARKS.md "The whole grid"):
at the full set about 50 waves of 64-row tiles on 132 SMs at S1's width, whose forward + backward lasts far longer than a call costs
on the host (BENCHMARKS.md, "The grid run"); wider rows get fewer edges but more work per edge
(the products grow with ROW), narrow ones more edges (2.6 M at Cf 16, lmax 1, F 1).  Every
surface is then ~0.67 GB, so the eager reference's peak (~7 surfaces) fits at every key.

Compile time is the grid's main cost (BENCHMARKS.md, "The grid run"), so the compiled
reference is compiled once per ``(Cf, lmax)`` and reused for its
keys: the edge count and, for F > 1, the focus count are marked dynamic
(``torch._dynamo.mark_dynamic``; F = 1 is specialised by dynamo's 0/1 rule, so it takes
a second compile).  Each key records how many graphs dynamo compiled for it and how long
its first call took.

Compile ahead (``warm_workers``; ``measure.prewarm``): first, before anything is measured,
worker processes compile every group's reference, by the same ``CompiledReference`` on the same
inputs (the real edge counts: Inductor's kernels depend on size hints), the same F order and
under the same ``stack_bench.exact_fp32``, so that dynamo re-traces in the measuring process but
Inductor's FX graph and AOTAutograd caches hit (these tasks run a forward and backward on the GPU,
which would disturb a timing beside them).  Then the keys are measured in batches of ``(Cf,
lmax)`` groups (``batch_groups``, default one per worker); each batch is handed to the workers
``batches_ahead`` batches before it is measured: the Triton kernels of levels 1-3 at every key,
recorded from the launches the measured run makes (``key_launches``: the tables' configs, level
3's first-use validation where the policy engages it), one task per distinct compile, compiled
without a launch; and each key's level-3 validations run ahead (``warm_validations``, milliseconds
on the GPU), which compile what the recording misses.  The measuring process pins
``TRITON_CACHE_DIR`` first (``prewarm.pin_triton_cache``), so that it looks where the workers
wrote.  Each key records its batch's warm-up and the references' warm-up.

Resumable and bounded: each key's record is written to ``<out>/keys/<key>.json`` as it
finishes; ``resume`` skips keys that have one; ``seconds`` stops cleanly before a key
that would not fit (estimated from the keys measured so far), and before a batch whose
warm-up and first key would not fit (estimated from the batches warmed so far).  ``write_outputs`` builds
``grid.json``, ``grid.csv`` (long format: one row per measurement with GPU, versions and
date), ``grid.md``, ``grid.png`` (speed-up over the compiled reference per key and level,
and where level 3 ran compensated kernels) and ``level3.json`` (the level-3 verdicts
``tuning.policy`` reads) from every key file in the folder, so slices run at different
times add up.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ..measure import env, prewarm, report
from ..measure.compile_log import compile_log
from ..measure.shapes import BenchShape, make_inputs
from ..stack import level3, reference
from ..tuning import products
from . import stack_bench

log = logging.getLogger(__name__)

SCHEMA = "mixstack-grid/1"
GRID_FOCUS_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
GRID_LMAX = (1, 2, 3, 4, 5, 6)
GRID_FOCUS = (1, 2, 4)
DEFAULT_VARIANTS = ("0c", "0", "1", "2", "3", "3r")
EDGE_ROW_FLOATS = 2 ** 18 * 640        # E * F * ROW per key: the tuner's timing set
MAX_EDGES = 2 ** 22
LEVEL_VARIANTS = ("L1", "L2", "L3")
SLOWER_THAN_COMPILED = 0.05            # the done-when bar: no level more than 5% slower than 0c


def grid_edges(focus: int, focus_dim: int, lmax: int, scale: float = 1.0) -> int:
    """Edges of a key: ``scale`` x ``EDGE_ROW_FLOATS`` row floats, odd (a partial last tile
    everywhere)."""
    row = (3 * lmax + 1) * focus_dim
    edges = min(MAX_EDGES, int(EDGE_ROW_FLOATS * scale) // (focus * row))
    return max(edges, 1) | 1


@dataclass(frozen=True)
class GridConfig:
    """What a grid run measures.  ``edges``: a fixed edge count for every key (tests; default
    ``grid_edges``).  ``seconds``: stop before a key that would not fit.  ``compile_backend``:
    the ``torch.compile`` backend of ``0c`` (tests count recompiles with ``"eager"``)."""

    focus_dims: tuple[int, ...] = GRID_FOCUS_DIMS
    lmaxes: tuple[int, ...] = GRID_LMAX
    focus: tuple[int, ...] = GRID_FOCUS
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    passes: tuple[str, ...] = ("both",)
    rounds: int = 5
    warmup: int = 1
    edges: int | None = None
    edge_scale: float = 0.5              # half the timing set's row floats: the ratios held within 2.4%
    check_edges: int = 4096
    device: str | None = None
    seed: int = 0
    seconds: float | None = None
    resume: bool = False
    compile_backend: str = "inductor"
    warm_workers: int = 0
    batch_groups: int = 0                # (Cf, lmax) groups per warm-up batch (0: one per worker)
    warm_validations: bool = True        # the workers also run each key's level-3 validations
    references_first: bool = True        # every group's reference compiled before any measuring
    batches_ahead: int = 1               # batches handed to the workers beyond the one measured next

    def keys(self) -> list[tuple[int, int, int]]:
        """``(Cf, lmax, F)`` in run order: the F values of one ``(Cf, lmax)`` together (they
        share its compiled reference)."""
        return list(itertools.product(self.focus_dims, self.lmaxes, self.focus))

    def shape(self, cf: int, lmax: int, focus: int) -> BenchShape:
        edges = self.edges or grid_edges(focus, cf, lmax, self.edge_scale)
        return BenchShape(key_name(cf, lmax, focus), edges, focus, cf, lmax)

    def bench_config(self, shape: BenchShape) -> stack_bench.BenchConfig:
        """The runner's config for one key: ``"3r"`` (level 3 forced to the rule config) only
        where level 3 would not run compensated kernels by itself (``level3_unsure``)."""
        variants = self.variants
        if "3r" in variants and not level3_unsure(shape, self.device):
            variants = tuple(v for v in variants if v != "3r")
        return stack_bench.BenchConfig((shape,), variants, self.passes, self.rounds, self.warmup, self.device,
                                  self.check_edges, seed=self.seed)


def level3_unsure(shape: BenchShape, device=None) -> bool:
    """Whether level 3 at ``shape``'s key would run level 2 with no table entry deciding so: the
    policy names no config (a key the grid measures with ``"3r"`` too)."""
    from ..tuning import validity
    plan = level3.resolve(shape.tuning_key(), validity.device_name(env.resolve_device(device)))
    return plan.source == "level2"


def key_name(cf: int, lmax: int, focus: int) -> str:
    return f"Cf{cf}-l{lmax}-F{focus}"


class CompiledReference:
    """``torch.compile`` of ``mixstack.stack.reference.mixing_stack``, one per ``(Cf, lmax)``, with the
    edge count (and F > 1) dynamic, so the keys of one ``(Cf, lmax)`` share it."""

    def __init__(self, backend: str = "inductor"):
        self.backend = backend
        self.group = None
        self.fn = None

    def forward(self, shape: BenchShape, inp) -> Callable:
        group = (shape.focus_dim, shape.lmax)
        if group != self.group:
            torch.compiler.reset()              # a fresh cache per (Cf, lmax): never the recompile limit
            self.fn = torch.compile(reference.mixing_stack, fullgraph=True, backend=self.backend)
            self.group = group
        fn, w0, w1, gw = self.fn, inp.w0, inp.w1, inp.gw
        kw = dict(lmax=shape.lmax, focus_dim=shape.focus_dim, apply_alpha=shape.apply_alpha)
        dims = {"u0": (1,), "alpha": (0,), "grad": (0,)}
        if shape.focus > 1:
            dims = {"u0": (0, 1), "alpha": (0, 1), "grad": (0, 1)}
            for w in (w0, w1, gw):
                torch._dynamo.mark_dynamic(w, 1)
        torch._dynamo.mark_dynamic(inp.grad_out, dims["grad"])

        def fwd(u0, alpha):
            torch._dynamo.mark_dynamic(u0, dims["u0"])
            torch._dynamo.mark_dynamic(alpha, dims["alpha"])
            return fn(u0, alpha, w0, w1, gw, **kw)
        return fwd


def _graphs() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def run_key(cfg: GridConfig, cf: int, lmax: int, focus: int, compiled: CompiledReference, *, device, clock,
            roof: dict, on_step=None) -> dict:
    """Measure one key (see the module doc); its record."""
    shape = cfg.shape(cf, lmax, focus)
    bench = cfg.bench_config(shape)
    keys, skipped = stack_bench.plan(bench)

    def make_forward(key, shape_, inp):
        if key == "0c":
            return compiled.forward(shape_, inp)
        return stack_bench.forward_fn(key, shape_, inp)

    t0 = time.perf_counter()
    graphs = _graphs()
    timings: list[dict] = []
    step = on_step or (lambda _d: None)
    with compile_log() as compiles:
        rec = stack_bench._run_shape(bench, shape, keys, device, clock, step, roof, timings, make_forward=make_forward)
    first = {v["variant"]: v["first_call_s"] for v in rec["variants"]}
    return {"schema": SCHEMA, "key": {"focus_dim": cf, "lmax": lmax, "focus": focus, "edges": shape.edges},
            "env": env.collect(device), "roof": roof, "shape": rec, "timings": timings, "skipped": skipped,
            "compile": {"graphs": _graphs() - graphs, "first_call_s": first.get(stack_bench.VARIANTS["0c"])},
            "triton_compiles": compiles.to_dict(),
            "seconds": time.perf_counter() - t0,
            "config": {"rounds": cfg.rounds, "warmup": cfg.warmup, "passes": list(cfg.passes),
                       "variants": [stack_bench.VARIANTS[v] for v in cfg.variants], "check_edges": cfg.check_edges}}


def first_uses(rec: dict, at_least: float = 0.5) -> str:
    """Where a key's seconds went before its timed runs: each variant's setup (a forced level 3
    validates its config there) plus first call, where at least ``at_least`` seconds, and the
    kernels Triton compiled in this process (the warm-up missed them) rather than loaded."""
    spent = [(v["variant"], (v.get("setup_s") or 0) + (v["first_call_s"] or 0)) for v in rec["shape"]["variants"]]
    parts = [f"{name} {seconds:.1f} s" for name, seconds in spent if seconds >= at_least]
    ref = rec["shape"].get("reference64_s")
    if ref is not None and ref >= at_least:
        parts.insert(0, f"float64 reference {ref:.1f} s")
    out = "; setup + first call: " + ", ".join(parts) if parts else ""
    compiles = rec.get("triton_compiles") or {}
    if compiles.get("compiled"):
        out += (f"; Triton compiled {len(compiles['compiled'])} kernels here ({compiles['compiled_seconds']:.1f} s), "
                f"loaded {compiles['loaded']}")
    return out


def key_path(out: str | os.PathLike, cf: int, lmax: int, focus: int) -> Path:
    return Path(out) / "keys" / f"{key_name(cf, lmax, focus)}.json"


TRITON_VARIANTS = ("1", "2", "2f", "3", "3r", "1b", "2b")


def key_launches(cfg: GridConfig, cf: int, lmax: int, focus: int, device) -> list:
    """The Triton kernel launches the measurement of one key makes (variants 1, 2, 2f and 3
    that ``stack_bench.plan`` keeps), recorded instead of run on inputs of the key's real edge
    count (``prewarm.record``): with the tables' configs in force, and for level 3 the
    first-use validation ``level3.prepare`` will run where the policy engages it, then the
    run with the policy's config (recorded, the validation could not pass: its outputs are
    garbage, so it must not write a verdict)."""
    shape = cfg.shape(cf, lmax, focus)
    keys = [k for k in stack_bench.plan(cfg.bench_config(shape))[0] if k in TRITON_VARIANTS]
    if not keys:
        return []
    device = torch.device(device)
    inp = make_inputs(shape, device, seed=cfg.seed)
    u0, alpha, wrt = stack_bench.differentiable(shape, inp)
    out: list = []
    from ..tuning import registry, validity
    from ..tuning.policy import rule_config
    for key in keys:
        fwd = stack_bench.forward_fn(key, shape, inp)
        scope, pinned, validated = contextlib.nullcontext, None, None
        if key == "3r":                                     # the rule's config, forced once validated
            validated = rule_config(shape.tuning_key())
        elif key == "3":                                    # the policy's, where it engages
            validated = level3.pending(shape.tuning_key(), validity.device_name(device))
        else:
            scope = stack_bench._scope(key, shape, device)
        if validated is not None:
            for n in level3.validation_edges(device):        # each: a recorded check fails at the first
                out += prewarm.record(level3.validate, shape.tuning_key(), validated, device, (n,))
            pinned = registry.registration(level3.FAMILY, shape.tuning_key(), validated)

        def run(scope=scope, fwd=fwd):
            with scope():
                torch.autograd.grad(fwd(u0, alpha), wrt, inp.grad_out)
        with pinned or contextlib.nullcontext():
            out += prewarm.record(run)
    return out


def warm_compiled_reference(cfg: GridConfig, cf: int, lmax: int, focus: tuple[int, ...], device: str) -> None:
    """A worker's warm-up of one ``(Cf, lmax)``'s compiled reference: what ``run_key`` does
    with it for the keys ``focus`` (in that order), up to the first call: a fresh
    ``CompiledReference``, each key's inputs at its real edge count, one forward and
    backward, under ``stack_bench.exact_fp32``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:      # "cuda" alone: the current device already
        torch.cuda.set_device(dev)
    compiled = CompiledReference(cfg.compile_backend)
    with stack_bench.exact_fp32():
        for f in focus:
            shape = cfg.shape(cf, lmax, f)
            inp = make_inputs(shape, dev, seed=cfg.seed)
            u0, alpha, wrt = stack_bench.differentiable(shape, inp)
            torch.autograd.grad(compiled.forward(shape, inp)(u0, alpha), wrt, inp.grad_out)
            del inp, u0, alpha, wrt
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def warm_validations(cfg: GridConfig, cf: int, lmax: int, focus: int, device: str) -> None:
    """A worker's run of the float64 validations one key's measurement starts with: level 3's
    rule config where ``"3r"`` is measured, the policy's where level 3 engages by itself, each at
    ``level3.validation_edges`` (a few thousand edges and single rows: milliseconds on the GPU).
    Triton compiles what their launches need that the recorded launches missed, so that the
    measuring process only loads; a failed validation is the measurement's to report."""
    from ..tuning import validity
    from ..tuning.policy import rule_config
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    shape = cfg.shape(cf, lmax, focus)
    key = shape.tuning_key()
    for variant in stack_bench.plan(cfg.bench_config(shape))[0]:
        config = (rule_config(key) if variant == "3r" else
                  level3.pending(key, validity.device_name(dev)) if variant == "3" else None)
        if config is not None:
            level3.validate(key, config, dev)


def reference_tasks(cfg: GridConfig, groups, device) -> list[prewarm.Task]:
    """One warm-up task per ``(Cf, lmax)`` group compiling its reference (where ``0c`` is measured)."""
    if not groups or "0c" not in stack_bench.plan(cfg.bench_config(cfg.shape(*groups[0][0], groups[0][1][0])))[0]:
        return []
    return [prewarm.Task(f"0c Cf{cf}-l{lmax}", warm_compiled_reference, (cfg, cf, lmax, tuple(fs), str(device)))
            for (cf, lmax), fs in groups]


def _warm_references(cfg: GridConfig, pool: prewarm.Pool, groups, device, say) -> dict:
    """Compile every group's reference before anything is measured: those tasks run a forward and
    backward on the GPU, which would disturb a measurement beside them (BENCHMARKS.md, "The whole
    grid")."""
    summary = pool.run(reference_tasks(cfg, groups, device))
    say("warm", f"{len(groups)} (Cf, lmax)", f"{len(summary.results)} compiled references in {summary.seconds:.1f} s "
        f"on {pool.processes} workers" + (f"; {len(summary.failed)} failed" if summary.failed else ""))
    return {"seconds": summary.seconds, "reference_seconds": {r.name: r.seconds for r in summary.results
                                                              if r.error is None},
            "failed": [f"{r.name}: {r.error.splitlines()[0]}" for r in summary.failed]}


def _warm_batch(cfg: GridConfig, pool: prewarm.Pool, batch, device, seen: set, say) -> Callable[[], dict]:
    """Hand the workers what measuring ``batch`` (``[((Cf, lmax), [F, ...]), ...]``) will compile:
    the compiled reference per group unless they were compiled first (submitted first: the longest
    tasks), the Triton launches of every key (compiled, not run), and each key's level-3
    validations (``warm_validations``); returns at once.  The returned ``finish()`` waits for them and gives the batch's
    warm-up record."""
    tasks = [] if cfg.references_first else reference_tasks(cfg, batch, device)
    n_ref = len(tasks)
    for (cf, lmax), fs in batch:
        for f in fs:
            try:
                tasks += prewarm.launch_tasks(key_launches(cfg, cf, lmax, f, device), seen)
            except Exception as exc:            # the measurement will show it; the warm-up only logs
                log.info("grid: cannot record the launches of %s: %s: %s", key_name(cf, lmax, f),
                         type(exc).__name__, exc)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    n_launch = len(tasks) - n_ref
    tasks += [prewarm.Task(f"validate {key_name(cf, lmax, f)}", warm_validations, (cfg, cf, lmax, f, str(device)))
              for (cf, lmax), fs in batch for f in fs if cfg.warm_validations]     # last: they mostly load
    pending = pool.submit(tasks)

    def finish() -> dict:
        summary = pending.wait()
        refs = {r.name: r.seconds for r in summary.results if r.name.startswith("0c ") and r.error is None}
        info = {"workers": pool.processes, "seconds": summary.seconds, "groups": len(batch),
                "kernels": n_launch, "compiled_references": n_ref, "reference_seconds": refs,
                "validations": len(tasks) - n_ref - n_launch,
                "failed": [f"{r.name}: {r.error.splitlines()[0]}" for r in summary.failed]}
        say("warm", f"{len(batch)} (Cf, lmax)", f"{info['kernels']} kernels, {n_ref} compiled references and "
            f"{info['validations']} keys' validations in "
            f"{summary.seconds:.1f} s on {pool.processes} workers"
            + (f"; {len(summary.failed)} failed (compiled when measured)" if summary.failed else ""))
        return info
    return finish


def run_grid(cfg: GridConfig, out: str | os.PathLike, *, on_key=None, on_step=None, clock=None,
             now: Callable[[], float] = time.monotonic) -> dict:
    """Measure the keys of ``cfg`` into ``out`` (see the module doc).  ``on_key(event, name,
    detail)`` reports progress ("skip", "warm", "start", "done", "stop").  Returns ``{"measured": [...],
    "skipped": [...], "stopped": [...]}`` (key names).  With warm-up workers, the next batch
    compiles while this one is measured."""
    prewarm.pin_triton_cache()              # before the compiled reference can move it
    device, clock, step = stack_bench.start(cfg, on_step=on_step, clock=clock)
    run = _GridRun(cfg, out, device, clock, on_key or (lambda *_a: None), step, now)
    groups = run.pending_groups()
    workers = cfg.warm_workers
    size = max(1, cfg.batch_groups or workers) if workers else max(1, len(groups))
    seen: set = set()
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(prewarm.Pool(workers)) if workers else None
        stack.enter_context(stack_bench.exact_fp32())
        i = 0

        def next_batch(queued: int = 0):
            """The next batch that fits the budget after ``queued`` keys still to measure, its
            warm-up handed to the workers; ``None`` at the end (the rest stopped)."""
            nonlocal i
            batch = groups[i:i + size]
            if batch and pool is not None and cfg.seconds is not None:
                batch = run.batch_that_fits(batch, queued)
                if not batch:
                    run.stop(groups[i:])
                    i = len(groups)
            if not batch:
                return None
            i += len(batch)
            return batch, (run.warm_start(pool, batch, seen) if pool is not None else None)

        ahead: collections.deque = collections.deque()     # batches handed over, not measured yet

        def top_up(limit: int, queued: int = 0) -> None:
            """Hand over batches until ``limit`` are ahead; ``queued``: keys still to measure
            besides theirs."""
            while len(ahead) < limit and i < len(groups):
                nxt = next_batch(queued + sum(len(fs) for b, _ in ahead for _, fs in b))
                if nxt is None:
                    break
                ahead.append(nxt)

        if pool is not None and cfg.references_first and groups:
            run.references = _warm_references(cfg, pool, groups, device, run.say)
        ahead_limit = cfg.batches_ahead if pool is not None else 0
        top_up(1 + ahead_limit)
        while ahead:
            batch, started = ahead.popleft()
            info = run.warm_finish(started, batch) if started is not None else None
            top_up(max(ahead_limit, 1), sum(len(fs) for _, fs in batch))     # compiles beside this batch
            for (cf, lmax), fs in batch:
                for focus in fs:
                    run.measure(cf, lmax, focus, info)
    if run.done["stopped"]:
        run.say("stop", f"{len(run.done['stopped'])} keys", "--seconds reached; run again with --resume")
    return run.done


class _GridRun:
    """One ``run_grid`` call: where the key records go, the budget and its clock, what the keys
    measured so far took (the estimates the budget is held to), and the keys done."""

    def __init__(self, cfg: GridConfig, out, device, clock, say, on_step, now):
        self.cfg, self.out, self.device, self.clock, self.say, self.on_step, self.now = (
            cfg, out, device, clock, say, on_step, now)
        (Path(out) / "keys").mkdir(parents=True, exist_ok=True)
        self.start = now()
        self.compiled = CompiledReference(cfg.compile_backend)
        self.done = {"measured": [], "skipped": [], "stopped": []}
        self.roof = None
        self.durations: list[float] = []
        self.warm_per_group = 0.0                 # the last batch's warm-up seconds per group, waited
        self.references = None                    # the up-front warm-up of every group's reference

    def estimate(self) -> float:
        """The seconds a key is expected to take: a quarter more than the mean of the last 12
        (four groups' F 1, 2 and 4; the first keys of a run wait for its first warm-up)."""
        recent = self.durations[-12:]
        return 1.25 * sum(recent) / len(recent) if recent else 0.0

    def pending_groups(self) -> list[tuple[tuple[int, int], list[int]]]:
        """The ``(Cf, lmax)`` groups in run order with the F values to measure; with ``resume``,
        the keys that have a record are skipped."""
        groups: list[tuple[tuple[int, int], list[int]]] = []
        for cf, lmax, focus in self.cfg.keys():
            name = key_name(cf, lmax, focus)
            if self.cfg.resume and key_path(self.out, cf, lmax, focus).exists():
                self.done["skipped"].append(name)
                self.say("skip", name, "measured already")
                continue
            if not groups or groups[-1][0] != (cf, lmax):
                groups.append(((cf, lmax), []))
            groups[-1][1].append(focus)
        return groups

    def batch_that_fits(self, batch: list, queued: int = 0) -> list:
        """The leading groups of ``batch`` whose warm-up and keys fit the budget after ``queued``
        keys still to measure (at least one, where its warm-up and a first key fit), or ``[]``: no
        group warmed that would not be measured."""
        seconds, estimate = self.cfg.seconds, self.estimate()
        elapsed = self.now() - self.start + queued * estimate
        if seconds <= 0 or elapsed + self.warm_per_group + estimate > seconds:
            return []
        fit, need = 0, elapsed
        for _, fs in batch:
            need += self.warm_per_group + len(fs) * estimate
            if fit and need > seconds:
                break
            fit += 1
        return batch[:fit]

    def stop(self, groups: list) -> None:
        for (cf, lmax), fs in groups:
            self.done["stopped"] += [key_name(cf, lmax, f) for f in fs]

    def warm_start(self, pool: prewarm.Pool, batch: list, seen: set) -> tuple[Callable[[], dict], float]:
        """Hand the workers what measuring ``batch`` will compile (``_warm_batch``); the seconds
        spent recording its launches count as waiting."""
        t0 = self.now()
        finish = _warm_batch(self.cfg, pool, batch, self.device, seen, self.say)
        return finish, self.now() - t0

    def warm_finish(self, started: tuple[Callable[[], dict], float], batch: list) -> dict:
        """Wait for ``batch``'s warm-up; the seconds this process waited for it (recording
        included: a warm-up that ran beside the measurement of earlier batches costs only the
        rest) per group are what the budget expects of the next."""
        finish, recorded = started
        t0 = self.now()
        info = finish()
        waited = recorded + self.now() - t0
        self.warm_per_group = waited / len(batch)
        info["waited_seconds"] = waited
        return info

    def measure(self, cf: int, lmax: int, focus: int, warm_info: dict | None) -> None:
        """Measure one key and write its record, unless it would not fit the budget (``seconds``
        0: measure nothing, only rebuild the outputs)."""
        name, path = key_name(cf, lmax, focus), key_path(self.out, cf, lmax, focus)
        if self.cfg.seconds is not None:
            estimate = self.estimate()
            if self.now() - self.start + estimate > self.cfg.seconds:
                self.done["stopped"].append(name)
                return
        if self.roof is None:
            cuda = self.device.type == "cuda"
            self.roof = stack_bench.measure_roofs(self.device, self.clock, n=8192 if cuda else 256,
                                                  copy_mib=1024 if cuda else 16)
        self.say("start", name, "")
        t0 = self.now()
        rec = run_key(self.cfg, cf, lmax, focus, self.compiled, device=self.device, clock=self.clock,
                      roof=self.roof, on_step=self.on_step)
        rec["warmup"] = warm_info
        rec["reference_warmup"] = self.references
        _write_json(path, rec)
        self.durations.append(self.now() - t0)
        self.done["measured"].append(name)
        comp = rec["compile"]
        first = "" if comp["first_call_s"] is None else f"; 0c first call {comp['first_call_s']:.1f} s"
        self.say("done", name, f"{self.durations[-1]:.1f} s ({comp['graphs']} graphs compiled{first}"
                               f"{first_uses(rec)})")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _write_json(path: Path, rec: dict) -> None:
    """Write ``rec`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- outputs

def load_records(out: str | os.PathLike) -> list[dict]:
    """Every key record in ``out/keys``, in grid order."""
    recs = []
    for path in sorted((Path(out) / "keys").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("grid: ignoring %s: %s", path, exc)
            continue
        if rec.get("schema") == SCHEMA:
            recs.append(rec)
    return sorted(recs, key=lambda r: (r["key"]["focus_dim"], r["key"]["lmax"], r["key"]["focus"]))


def _medians(rec: dict, pass_: str) -> dict[str, float]:
    return {t["variant"]: t["median_ms"] for t in rec["timings"] if t["pass"] == pass_}


def _variant(rec: dict, name: str) -> dict | None:
    return next((v for v in rec["shape"]["variants"] if v["variant"] == name), None)


def compensated_ran(rec: dict, variant: str = "L3") -> bool | None:
    """Whether ``variant`` (level 3 as it dispatches, or ``"L3-rule"``) ran compensated kernels
    at this key (``None``: not measured)."""
    v = _variant(rec, variant)
    if v is None or v["failed"]:
        return None
    return any(p.endswith(":compensated") for p in v["dispatch"])


def compensated_ms(rec: dict, pass_: str | None = None) -> tuple[float | None, str | None]:
    """Level 3's time on compensated kernels at this key and the variant that measured it:
    ``L3`` where it ran them by itself, else ``L3-rule`` (forced) where that ran; ``(None,
    None)`` where neither did."""
    med = _medians(rec, _pass(rec, pass_))
    for variant in ("L3", "L3-rule"):
        if compensated_ran(rec, variant) and med.get(variant):
            return med[variant], variant
    return None, None


def _pass(rec: dict, pass_: str | None) -> str:
    """``pass_``, or the key's forward + backward, or the first pass it measured."""
    passes = rec.get("config", {}).get("passes") or ["both"]
    return pass_ or ("both" if "both" in passes else passes[0])


def summary(rec: dict, pass_: str | None = None) -> dict:
    """Speed-ups over the compiled reference (and eager) of each level at one key (forward +
    backward where measured)."""
    med = _medians(rec, _pass(rec, pass_))
    base, eager = med.get("L0-compile"), med.get("L0-eager")
    comp, comp_variant = compensated_ms(rec, pass_)
    row = {"key": key_name(rec["key"]["focus_dim"], rec["key"]["lmax"], rec["key"]["focus"]), **rec["key"],
           "compiled_ms": base, "eager_ms": eager, "level3_compensated": compensated_ran(rec),
           "compensated_ms": comp, "compensated_variant": comp_variant,
           "compensated_vs_l2": med["L2"] / comp if comp and med.get("L2") else None}
    for lv in LEVEL_VARIANTS:
        t = med.get(lv)
        row[f"{lv}_ms"] = t
        row[f"{lv}_vs_compiled"] = base / t if base and t else None
        row[f"{lv}_vs_eager"] = eager / t if eager and t else None
    return row


def long_rows(records: list[dict]) -> list[dict]:
    """One row per measurement (time statistics per pass, speed-up over the compiled reference,
    peak memory, float64 errors, first-call time), each with its key and environment."""
    rows = []
    for rec in records:
        head = {**report.env_columns(rec), "bench": "grid",
                "case": key_name(rec["key"]["focus_dim"], rec["key"]["lmax"], rec["key"]["focus"]),
                "focus_dim": rec["key"]["focus_dim"], "lmax": rec["key"]["lmax"], "focus": rec["key"]["focus"],
                "edges": rec["key"]["edges"]}
        base = {p: _medians(rec, p).get("L0-compile") for p in rec["config"]["passes"]}
        for t in rec["timings"]:
            for stat in ("median", "p20", "p80"):
                rows.append({**head, "variant": t["variant"], "metric": f"time_{stat}_{t['pass']}",
                             "value": t[f"{stat}_ms"], "unit": "ms"})
            if base.get(t["pass"]):
                rows.append({**head, "variant": t["variant"], "metric": f"speedup_vs_compiled_{t['pass']}",
                             "value": base[t["pass"]] / t["median_ms"], "unit": "x"})
        for v in rec["shape"]["variants"]:
            if v["peak_mib"] is not None:
                rows.append({**head, "variant": v["variant"], "metric": "peak_memory", "value": v["peak_mib"],
                             "unit": "MiB"})
            for name, err in v["rel_error"].items():
                rows.append({**head, "variant": v["variant"], "metric": f"rel_error_{name}", "value": err,
                             "unit": "1"})
            if v["first_call_s"] is not None:
                rows.append({**head, "variant": v["variant"], "metric": "first_call", "value": v["first_call_s"],
                             "unit": "s"})
            if v.get("setup_s") is not None:
                rows.append({**head, "variant": v["variant"], "metric": "setup", "value": v["setup_s"], "unit": "s"})
        engaged = compensated_ran(rec)
        if engaged is not None:
            rows.append({**head, "variant": "L3", "metric": "compensated_ran", "value": int(engaged), "unit": "1"})
    return rows


def level3_verdicts(records: list[dict], pass_: str | None = None) -> dict:
    """What ``tuning.policy`` reads (``<device>.level3.json``): per measured key, level 2's time
    over level 3's on compensated kernels (``L3``, or ``L3-rule`` where level 3 ran level 2 by
    itself), the config that ran (the rule's) and the variant that measured it."""
    from ..tuning.keys import shape_key
    from ..tuning.policy import rule_config
    out = {}
    for rec in records:
        med = _medians(rec, _pass(rec, pass_))
        comp, variant = compensated_ms(rec, pass_)
        if comp and med.get("L2"):
            k = rec["key"]
            key = shape_key(focus_dim=k["focus_dim"], lmax=k["lmax"], n_focus=k["focus"], apply_alpha=True)
            out[str(key)] = {"speedup": med["L2"] / comp, "config": rule_config(key),
                             "l2_ms": med["L2"], "l3_ms": comp, "measured_by": variant}
    return out


def overlaid_verdicts(folders: list[str | os.PathLike]) -> dict:
    """What ships as a device's ``.level3.json``: the verdicts of each grid folder in turn, a later
    folder's replacing an earlier one's at the keys it measured; ``sources`` names the folders."""
    verdicts: dict = {}
    device = None
    for folder in folders:
        records = load_records(folder)
        verdicts.update(level3_verdicts(records))
        device = records[-1]["env"]["device"]["name"] if records else device
    return {"device": device, "sources": [Path(f).as_posix() for f in folders], "verdicts": verdicts}


def _products_verdicts(records: list[dict]) -> list[dict] | None:
    """``tuning.products.verdicts`` of a run that measured the BLAS variants, else ``None``."""
    if not any(_medians(r, "both").get("L1-blas") for r in records):
        return None
    return products.verdicts(records)


def as_shipped(records: list[dict], pass_: str | None = None) -> dict[str, dict]:
    """Per key, each level's time as it runs once this run's own verdicts ship: levels 1 and 2 on
    the BLAS at the ``(Cf, lmax)`` groups of its ``products.json``, level 3 on compensated kernels
    where it ran them by itself or its ``level3.json`` engages them, else level 2 as shipped.  Each
    time is one this run measured; the choice uses the same medians, so a key near a verdict's
    margin reads a little better than a later run would (the guard, ``--check``, says).
    ``compensated``: whether level 3 runs its compensated kernels there as shipped."""
    from ..tuning.keys import shape_key
    from ..tuning.policy import VERDICT_MARGIN
    blas = {(b["focus_dim"], b["lmax"]) for b in (_products_verdicts(records) or [])}
    engaged = {k for k, v in level3_verdicts(records, pass_).items() if v["speedup"] >= 1 + VERDICT_MARGIN}
    out = {}
    for rec in records:
        k = rec["key"]
        med = _medians(rec, _pass(rec, pass_))
        route = "-blas" if (k["focus_dim"], k["lmax"]) in blas else ""
        t1, t2 = med.get("L1" + route), med.get("L2" + route)
        comp, _ = compensated_ms(rec, pass_)
        ran = bool(compensated_ran(rec))
        on = ran or bool(comp and str(shape_key(focus_dim=k["focus_dim"], lmax=k["lmax"], n_focus=k["focus"],
                                               apply_alpha=True)) in engaged)
        if ran:
            t3 = med.get("L3")               # compensated by itself
        elif on:
            t3 = comp                        # engaged by this run's verdict
        elif route:
            t3 = t2                          # level 2 on the route
        else:
            t3 = med.get("L3")               # level 2 on Triton's products, as it ran
        out[key_name(k["focus_dim"], k["lmax"], k["focus"])] = {"L1": t1, "L2": t2, "L3": t3, "compensated": on}
    return out


def markdown(records: list[dict]) -> str:
    rows = [summary(r) for r in records]
    lines = ["# mixstack bench grid\n"]
    if records:
        lines.append("\n".join(f"- {x}" for x in report.header_lines({**records[-1], "command": None})) + "\n")
    n = len(rows)
    bad = {lv: [r["key"] for r in rows if r[f"{lv}_vs_compiled"] and r[f"{lv}_vs_compiled"] < 1 - SLOWER_THAN_COMPILED]
           for lv in LEVEL_VARIANTS}
    eager = {lv: [r["key"] for r in rows if r[f"{lv}_vs_eager"] and r[f"{lv}_vs_eager"] < 1] for lv in LEVEL_VARIANTS}
    from ..tuning.policy import VERDICT_MARGIN
    faster = [r for r in rows if r["compensated_vs_l2"] and r["compensated_vs_l2"] >= 1 + VERDICT_MARGIN]
    lines.append(f"{n} keys measured (forward + backward, medians). Speed-up = compiled reference's time / "
                 "the level's.\n")
    for lv in LEVEL_VARIANTS:
        lines.append(f"- {lv}: more than {100 * SLOWER_THAN_COMPILED:.0f}% slower than the compiled reference "
                     f"at {len(bad[lv])} keys ({', '.join(bad[lv]) or 'none'}); slower than eager at "
                     f"{len(eager[lv])} ({', '.join(eager[lv]) or 'none'})")
    if faster:
        ran = sum(1 for r in faster if r["level3_compensated"])
        lines.append(f"- level 3 on compensated kernels at least {100 * VERDICT_MARGIN:.0f}% faster than level 2 "
                     f"at {len(faster)} keys; level 3 ran them by itself at {ran} of them "
                     f"({100 * ran / len(faster):.0f}%); at the others (measured as L3-rule) it runs them once "
                     "this run's level3.json ships beside the device's table (or, copied into the tuning cache, "
                     "applies on this machine: docs/tuning.md)")
    blas = _products_verdicts(records)
    if blas is not None:
        groups = ", ".join(f"Cf{b['focus_dim']}-l{b['lmax']}" for b in blas) or "none"
        lines.append(f"- exact products on the BLAS at least {100 * products.VERDICT_MARGIN:.0f}% faster than "
                     f"Triton's at both levels and every F: {len(blas)} (Cf, lmax) groups ({groups}); "
                     "this run's products.json ships beside the device's table (or, copied into the tuning cache, "
                     "applies on this machine: docs/tuning.md)")
    shipped = as_shipped(records)
    if blas is not None or any(r["compensated_variant"] == "L3-rule" for r in rows):
        slow = {lv: [r["key"] for r in rows if r["compiled_ms"] and shipped[r["key"]][lv]
                     and r["compiled_ms"] / shipped[r["key"]][lv] < 1 - SLOWER_THAN_COMPILED] for lv in LEVEL_VARIANTS}
        comp = sum(1 for r in rows if shipped[r["key"]]["compensated"])
        lines.append("- as shipped with this run's verdicts (the \"shipped\" column: L1 / L2 / L3 on the route and "
                     "the level-3 engagement they choose): "
                     + "; ".join(f"{lv} more than {100 * SLOWER_THAN_COMPILED:.0f}% slower than the compiled "
                                 f"reference at {len(slow[lv])} keys ({', '.join(slow[lv]) or 'none'})"
                                 for lv in LEVEL_VARIANTS)
                     + f"; level 3 on compensated kernels at {comp} of {n} keys")
    compile_s = [r["compile"]["first_call_s"] for r in records if r["compile"]["graphs"]]
    if compile_s:
        lines.append(f"- torch.compile of the reference: {sum(r['compile']['graphs'] for r in records)} graphs "
                     f"over {n} keys, {sum(compile_s):.0f} s in the first calls that compiled")
    lines.append("")
    table = [{"key": r["key"], "edges": r["edges"], "0c ms": _f(r["compiled_ms"]), "eager ms": _f(r["eager_ms"]),
              **{f"{lv} x": _f(r[f"{lv}_vs_compiled"]) for lv in LEVEL_VARIANTS},
              "shipped x": "/".join(_f(r["compiled_ms"] / t if r["compiled_ms"] and t else None)
                                    for t in (shipped[r["key"]][lv] for lv in LEVEL_VARIANTS)),
              "L3 compensated": {True: "yes", False: "no", None: "—"}[r["level3_compensated"]],
              "compensated / L2": (f"{_f(r['compensated_vs_l2'])}" + (" (rule)" if r["compensated_variant"] == "L3-rule"
                                                                     else "")) if r["compensated_vs_l2"] else "—"}
             for r in rows]
    lines.append(report.markdown_table(table))
    return "\n".join(lines)


def _f(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def plot(records: list[dict], path: str | os.PathLike) -> Path:
    """Heat maps: per F (rows) the speed-up over the compiled reference of each level, and
    whether level 3 ran compensated kernels."""
    matplotlib = report.require_extra("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    rows = [summary(r) for r in records]
    focus = sorted({r["focus"] for r in rows}) or [1]
    cfs = sorted({r["focus_dim"] for r in rows}) or [16]
    lmaxes = sorted({r["lmax"] for r in rows}) or [1]
    cols = list(LEVEL_VARIANTS) + ["L3 engaged"]
    fig, axes = plt.subplots(len(focus), len(cols), figsize=(3.3 * len(cols), 2.9 * len(focus)), squeeze=False)
    norm = TwoSlopeNorm(vmin=0.25, vcenter=1.0, vmax=4.0)
    for i, f in enumerate(focus):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            grid = [[math.nan] * len(lmaxes) for _ in cfs]
            for r in rows:
                if r["focus"] != f:
                    continue
                y, x = cfs.index(r["focus_dim"]), lmaxes.index(r["lmax"])
                if col == "L3 engaged":
                    v = r["level3_compensated"]
                    grid[y][x] = math.nan if v is None else float(v)
                else:
                    v = r[f"{col}_vs_compiled"]
                    grid[y][x] = math.nan if v is None else v
            if col == "L3 engaged":
                ax.imshow(grid, cmap="Blues", vmin=-0.3, vmax=2.5, aspect="auto", origin="lower")
                text = {0.0: "L2", 1.0: "comp"}
            else:
                ax.imshow([[max(min(v, 4.0), 0.25) if v == v else v for v in row] for row in grid],
                          cmap="RdYlGn", norm=norm, aspect="auto", origin="lower")
                text = None
            for y, row in enumerate(grid):
                for x, v in enumerate(row):
                    if v == v:
                        ax.text(x, y, text[v] if text else f"{v:.2f}", ha="center", va="center", fontsize=6,
                                color="tab:red" if (text and v == 0.0) else "black")
            ax.set_xticks(range(len(lmaxes)), lmaxes, fontsize=7)
            ax.set_yticks(range(len(cfs)), cfs, fontsize=7)
            ax.set_xlabel("lmax", fontsize=7)
            ax.set_ylabel("Cf", fontsize=7)
            ax.set_title(f"F {f}: {col}" + ("" if col == "L3 engaged" else " / compiled ref."), fontsize=8)
    head = report.header_lines({**records[-1], "command": None}) if records else ["", "", ""]
    fig.suptitle("mixstack bench grid: fwd+bwd speed-up over torch.compile of the reference — "
                 + head[0].removeprefix("device: "), fontsize=9)
    fig.text(0.01, 0.005, head[1] + "\n" + head[2], fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(out: str | os.PathLike, *, with_plot: bool = True) -> dict[str, Path]:
    """``grid.json``, ``grid.csv``, ``grid.md``, ``level3.json`` and ``grid.png`` in ``out``, from
    every key record there.  The plot last, so a missing matplotlib loses nothing."""
    out = Path(out)
    records = load_records(out)
    paths = {"json": out / "grid.json", "csv": out / "grid.csv", "markdown": out / "grid.md",
             "level3": out / "level3.json"}
    paths["json"].write_text(json.dumps({"schema": SCHEMA, "keys": records}, indent=1) + "\n")
    report.write_csv(long_rows(records), paths["csv"])
    paths["markdown"].write_text(markdown(records))
    device = records[-1]["env"]["device"]["name"] if records else None
    paths["level3"].write_text(json.dumps({"device": device, "verdicts": level3_verdicts(records)}, indent=1,
                                          sort_keys=True) + "\n")
    blas = _products_verdicts(records)
    if blas is not None:
        paths["products"] = out / "products.json"
        paths["products"].write_text(json.dumps({"device": device, "blas": blas}, indent=1, sort_keys=True) + "\n")
    if with_plot:
        paths["plot"] = plot(records, out / "grid.png")
    return paths


def with_subset(cfg: GridConfig, *, focus_dims=None, lmaxes=None, focus=None) -> GridConfig:
    """``cfg`` restricted to the given values (``None``: keep)."""
    return replace(cfg, focus_dims=tuple(focus_dims or cfg.focus_dims), lmaxes=tuple(lmaxes or cfg.lmaxes),
                   focus=tuple(focus or cfg.focus))
