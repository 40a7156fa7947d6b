"""Run the benchmark: every variant of every shape, timed, with memory, accuracy and paths.

Variants are the columns of docs/contract.md §8: ``L0-eager`` (``mixstack.mixing_stack``
at level 0), ``L0-compile`` (``torch.compile`` of ``mixstack.stack.reference``),
``L1``, ``L2`` and ``L3`` (``mixstack.mixing_stack`` at that level).  For each
shape the runner

1. draws random non-zero inputs (``shapes.make_inputs``);
2. *probes* each variant with one untimed forward+backward (compilation and
   autotuning happen here, outside any timing), then a second one that
   records the peak device memory above the inputs, the ``dispatch_log`` paths
   that really ran, and the relative error of the result, ``grad_u0`` and
   ``grad_alpha`` against a float64 reference on the first ``check_edges``
   edges (the stack is row-independent, so those rows of the full run are
   exactly the subset's result);
3. times each pass — ``fwd``, ``bwd`` (the backward alone: the forward runs
   untimed before every sample) and ``both`` (forward + backward) — with
   ``timing.time_interleaved``, variants interleaved in rotating order.

Backward means the force path: ``torch.autograd.grad(out, [u0, alpha], g)``
with weights that do not require grad.  TF32 is off for the whole run
(``float32_matmul_precision = "highest"``), so level 0 and the roofs are
exact fp32 like the Triton levels.  The fp32 roof is measured in the same run
with a large matmul, and a copy roof with a device-to-device copy.

The stack, model, training and grid benches start from ``start`` (device, clock, progress); the
first three measure inside ``measuring`` and begin their records with ``record_head``.

Library code: nothing here prints.  Progress goes to the ``on_step`` callback.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .. import tuning
from ..dispatch.levels import use_level
from ..dispatch.log import dispatch_log
from ..measure import counts, env
from ..measure.shapes import SMALL, STANDARD, BenchShape, StackInputs, make_inputs
from ..measure.timing import Clock, Task, clock_for, time_interleaved
from ..stack import reference
from ..stack.functional import mixing_stack
from ..tuning.configs import fused_supported
from ..tuning.products import use_products

log = logging.getLogger(__name__)

SCHEMA = "mixstack-bench/1"
VARIANTS = {"0": "L0-eager", "0c": "L0-compile", "1": "L1", "2": "L2", "2f": "L2-fused", "3": "L3", "3r": "L3-rule",
            "1b": "L1-blas", "2b": "L2-blas"}
LEVEL_OF = {"0": 0, "0c": 0, "1": 1, "2": 2, "2f": 2, "3": 3, "3r": 3, "1b": 1, "2b": 2}
# "1b", "2b": levels 1 and 2 with every exact product on the BLAS (``tuning.products``, forced for
# the variant's runs), timed beside the Triton products at the same keys: a grid run of both
# decides the keys the route takes (its ``products.json``).
FORCED_BLAS = ("1b", "2b")
# "3r": level 3's compensated kernels with the policy's rule config (``tuning.policy``) forced
# for the shape's key while the variant runs, once that config has passed level 3's float64
# validation there (else the variant fails, saying so): level 3 measured where the policy is
# not sure (the grid bench runs it there), so that a measured verdict can engage it.
DEFAULT_VARIANTS = tuple(k for k in VARIANTS if k != "3r" and k not in FORCED_BLAS)   # "3r": the grid's
# "2f": level 2 with the fused backward forced (registered for the shape's key while
# the variant runs, whatever the tables say), so that relay and fused can be timed
# side by side.  The config: the best fused candidate of both H200 sweeps of the S1
# key (BENCHMARKS.md, "The fused backward"); another key's best may differ (``mixstack tune``
# finds it).
FUSED_BENCH_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
PASSES = counts.PASSES
PASS_LABELS = {"fwd": "fwd", "bwd": "bwd", "both": "fwd+bwd"}


@dataclass(frozen=True)
class BenchConfig:
    """What to run.  ``variants`` are keys of ``VARIANTS`` (``"0"``, ``"0c"``, ``"1"``, ...)."""

    shapes: tuple[BenchShape, ...]
    variants: tuple[str, ...]
    passes: tuple[str, ...] = PASSES
    rounds: int = 20
    warmup: int = 3
    device: str | None = None
    check_edges: int = 4096
    roof_n: int | None = None          # matmul size of the fp32 roof; None: by device
    seed: int = 0
    notes: tuple[str, ...] = field(default=())   # why defaults left something out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shapes"] = [s.to_dict() for s in self.shapes]
        d["variants"] = [VARIANTS[v] for v in self.variants]
        return d


def parse_variants(text: str) -> tuple[str, ...]:
    """``"0,0c,1,2"`` (or variant names like ``"L0-eager,L1"``) -> variant keys."""
    by_name = {name.lower(): key for key, name in VARIANTS.items()}
    keys = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key = item.lower()
        key = key[1:] if key.startswith("l") and key[1:] in VARIANTS else key
        key = by_name.get(key, key)
        if key not in VARIANTS:
            raise ValueError(f"unknown level/variant {item!r}; use {', '.join(VARIANTS)} "
                             f"or {', '.join(VARIANTS.values())}")
        if key not in keys:
            keys.append(key)
    if not keys:
        raise ValueError("no levels given")
    return tuple(keys)


def default_config(device=None, *, quick: bool = False) -> BenchConfig:
    """The embedded defaults: docs/contract.md §8 shapes and every level on a GPU; small
    shapes at level 0 on a CPU (about a minute); ``quick`` for a smoke run."""
    device = env.resolve_device(device)
    if device.type == "cuda":
        shapes = (STANDARD["S1"],) if quick else tuple(STANDARD.values())
        return BenchConfig(shapes, DEFAULT_VARIANTS, rounds=5 if quick else 20,
                           warmup=1 if quick else 3, device=str(device))
    shapes = (SMALL["C1"],) if quick else tuple(SMALL.values())
    notes = ["L0-compile is left out on the CPU by default (its compile time exceeds the "
             "benchmark's); ask for it with --levels 0,0c"]
    triton_keys = tuple(k for k in DEFAULT_VARIANTS if LEVEL_OF[k] > 0)
    if skip_reason(triton_keys[0], device) is None:    # the interpreter: far too slow by default
        notes.append("L1-L3 are left out on the CPU by default (the Triton interpreter is "
                     "slow); ask for them with --levels 0,1")
        triton_keys = ()
    return BenchConfig(shapes, ("0",) + triton_keys, rounds=3 if quick else 10, warmup=1,
                       device=str(device), notes=tuple(notes))


def skip_reason(key: str, device) -> str | None:
    """Why variant ``key`` cannot run on ``device``, or ``None`` when it can."""
    if LEVEL_OF[key] == 0:
        return None
    ok, why = env.triton_levels_status(device)
    return None if ok else why


@contextlib.contextmanager
def exact_fp32():
    """No TF32 anywhere inside: ``torch.float32_matmul_precision = "highest"``, and the
    newer per-backend switch ``torch.backends.cuda.matmul.fp32_precision = "ieee"``
    (its default ``"none"`` is not a promise that generated code avoids TF32)."""
    previous = torch.get_float32_matmul_precision()
    matmul = torch.backends.cuda.matmul
    previous_backend = getattr(matmul, "fp32_precision", None)
    torch.set_float32_matmul_precision("highest")
    if previous_backend is not None:
        matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        if previous_backend is not None:
            matmul.fp32_precision = previous_backend


def start(config, *, on_step: Callable[[str], None] | None = None,
          clock: Clock | None = None) -> tuple[torch.device, Clock, Callable[[str], None]]:
    """What every bench run starts from: the device ``config.device`` names, the clock that times
    it (``clock``, else ``clock_for`` the device) and the progress callback (``on_step``, else none)."""
    device = env.resolve_device(config.device)
    return device, clock or clock_for(device), on_step or (lambda _desc: None)


@contextlib.contextmanager
def measuring(device: torch.device):
    """The scope a bench run measures in: ``device`` the current CUDA device, TF32 off (``exact_fp32``)."""
    with (torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()), exact_fp32():
        yield


def record_head(schema: str, command: str | None, config, device, skipped: list[dict]) -> dict:
    """The fields every bench record begins with: its schema, the command as typed, the run's
    environment, the config with its notes, and the variants skipped with why."""
    return {"schema": schema, "command": command, "env": env.collect(device), "config": config.to_dict(),
            "notes": list(config.notes), "skipped": skipped}


def measure_roofs(device, clock: Clock, *, n: int, copy_mib: int, rounds: int = 5,
                  warmup: int = 2) -> dict:
    """The device's fp32 matmul rate (``n^3``, TF32 off) and copy bandwidth, timed
    with the same loop as the variants."""
    kw = dict(device=device, dtype=torch.float32)
    a, b, c = torch.randn(n, n, **kw), torch.randn(n, n, **kw), torch.empty(n, n, **kw)
    src = torch.randn(copy_mib * 2 ** 18, **kw)
    dst = torch.empty_like(src)
    with exact_fp32():
        s = time_interleaved({"matmul": lambda: torch.mm(a, b, out=c), "copy": lambda: dst.copy_(src)},
                             rounds=rounds, warmup=warmup, clock=clock)
    moved = 2 * src.numel() * src.element_size()                 # read + write
    return {"fp32_matmul_n": n, "fp32_tflops": 2 * n ** 3 / s["matmul"].median / 1e12,
            "copy_mib": copy_mib, "copy_gbps": moved / s["copy"].median / 1e9,
            "matmul": s["matmul"].to_dict(), "copy": s["copy"].to_dict()}


def _peak_above(device: torch.device, fn: Callable[[], object]):
    """Run ``fn``; return its result and the peak memory it allocated above what
    was allocated before (``None`` off CUDA)."""
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    return result, torch.cuda.max_memory_allocated(device) - base


def _rel_err(x: torch.Tensor, x64: torch.Tensor) -> float:
    x, x64 = x.detach().double(), x64.detach().double()
    den = torch.linalg.vector_norm(x64).item()
    num = torch.linalg.vector_norm(x - x64).item()
    return num / den if den > 0 else num


_VALIDATED: dict[tuple[str, str], dict] = {}


def forced_level3_config(shape: BenchShape, device) -> dict:
    """The rule config of ``shape``'s key for ``"3r"``, validated against float64 on ``device``
    (once per process); ``ValueError`` naming the key where the validation fails."""
    from ..stack import level3
    from ..tuning.policy import rule_config
    key = shape.tuning_key()
    cfg = rule_config(key)
    cache = (str(key), str(torch.device(device)))
    if cache not in _VALIDATED:
        _VALIDATED[cache] = level3.validate(key, cfg, device)
    verdict = _VALIDATED[cache]
    if not verdict["ok"]:
        raise ValueError(f"{shape.name}: level 3 with the rule config {cfg} failed its float64 validation "
                         f"({verdict['why']})")
    return cfg


def _scope(key: str, shape: BenchShape, device) -> Callable[[], contextlib.AbstractContextManager]:
    """What each run of variant ``key`` (forward and backward) runs inside: for ``"2f"``
    the fused backward's registration (the backward looks its config up when it runs); for
    ``"3r"`` the validated rule config's ``stack_compensated`` registration; for ``"1b"`` and
    ``"2b"`` the products on the BLAS."""
    if key == "3r":
        cfg = forced_level3_config(shape, device)
        return lambda: tuning.registration("stack_compensated", shape.tuning_key(), dict(cfg))
    if key in FORCED_BLAS:
        return lambda: use_products("blas")
    if key != "2f":
        return contextlib.nullcontext
    if not fused_supported(shape.layout):
        raise ValueError(f"{shape.name}: Cf = {shape.focus_dim} is outside the fused backward's regime")
    return lambda: tuning.registration("stack_bwd_fused", shape.tuning_key(), dict(FUSED_BENCH_CONFIG))


def forward_fn(key: str, shape: BenchShape, inp: StackInputs) -> Callable:
    """``fwd(u0, alpha) -> result`` of variant ``key`` on ``inp``'s weights."""
    kw = dict(lmax=shape.lmax, focus_dim=shape.focus_dim, apply_alpha=shape.apply_alpha)
    w0, w1, gw = inp.w0, inp.w1, inp.gw
    if key == "0c":
        torch.compiler.reset()           # a fresh cache per shape: never hit the recompile limit
        compiled = torch.compile(reference.mixing_stack, dynamic=False, fullgraph=True)
        return lambda u0, alpha: compiled(u0, alpha, w0, w1, gw, **kw)
    level = LEVEL_OF[key]

    def fwd(u0, alpha):
        with use_level(level):
            return mixing_stack(u0, alpha, w0, w1, gw, **kw)

    return fwd


def differentiable(shape: BenchShape, inp: StackInputs):
    """``(u0, alpha, wrt)``: ``inp``'s activations and alpha made to require grad (in place),
    and what a forward + backward takes the gradient of (``alpha`` only where the shape
    applies it)."""
    u0, alpha = inp.u0.requires_grad_(), inp.alpha.requires_grad_()
    return u0, alpha, [u0, alpha] if shape.apply_alpha else [u0]


def _reference64(shape: BenchShape, inp: StackInputs, n: int) -> dict:
    """Result, ``grad_u0`` and ``grad_alpha`` in float64 on the first ``n`` edges."""
    u0 = inp.u0[:, :n].detach().double().requires_grad_()
    alpha = inp.alpha[:n].detach().double().requires_grad_()
    out, _ = reference.forward(u0, alpha, inp.w0.double(), inp.w1.double(), inp.gw.double(),
                               lmax=shape.lmax, focus_dim=shape.focus_dim, apply_alpha=shape.apply_alpha)
    wrt = [u0, alpha] if shape.apply_alpha else [u0]
    grads = torch.autograd.grad(out, wrt, inp.grad_out[:n].double())
    ref = {"out": out.detach(), "grad_u0": grads[0]}
    if shape.apply_alpha:
        ref["grad_alpha"] = grads[1]
    return ref


def _probe(key, fwd, scope, shape, inp, u0, alpha, wrt, ref, n, device) -> dict:
    """Compile/warm, then one measured fwd+bwd: peak memory, dispatch paths, errors."""
    t0 = time.perf_counter()
    with scope():
        torch.autograd.grad(fwd(u0, alpha), wrt, inp.grad_out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_call_s = time.perf_counter() - t0

    def run():
        with scope():
            out = fwd(u0, alpha)
            return out, torch.autograd.grad(out, wrt, inp.grad_out)

    with dispatch_log() as paths:
        (out, grads), peak = _peak_above(device, run)
    errors = {"out": _rel_err(out[:n], ref["out"]), "grad_u0": _rel_err(grads[0][:, :n], ref["grad_u0"])}
    if shape.apply_alpha:
        errors["grad_alpha"] = _rel_err(grads[1][:n], ref["grad_alpha"])
    return {"variant": VARIANTS[key], "level": LEVEL_OF[key], "dispatch": dict(sorted(paths.items())),
            "peak_mib": None if peak is None else peak / 2 ** 20,
            "first_call_s": first_call_s, "rel_error": errors, "note": None, "failed": None}


def _path_notes(records: dict[str, dict]) -> None:
    """Say, from the dispatch paths, what really ran where a name could mislead."""
    for key, rec in records.items():
        paths = rec["dispatch"]
        if rec["failed"]:
            continue
        if key == "0c":
            rec["note"] = "torch.compile of mixstack.reference (outside mixstack's dispatch)"
        elif LEVEL_OF[key] >= 1 and any(p.startswith("fwd:reference") for p in paths):
            rec["note"] = "fell back to the reference: no Triton kernel ran"
        elif key in ("3", "3r") and not any("compensated" in p for p in paths):
            rec["note"] = "no compensated path ran: same as L2 until compensated kernels exist"
        elif key == "2f" and "bwd:fused" not in paths:
            rec["note"] = "the fused backward did not run"
        elif key == "2" and "1" in records and paths == records["1"]["dispatch"]:
            rec["note"] = "same dispatch paths as L1 (no tuned fused backward engaged)"


def pass_task(pass_: str, fwd, scope, u0, alpha, wrt, g) -> Task:
    def forward():
        with scope():
            return fwd(u0, alpha)

    def backward(out):
        with scope():
            return torch.autograd.grad(out, wrt, g)
    if pass_ == "fwd":
        return Task(run=forward)
    if pass_ == "bwd":
        return Task(setup=forward, run=backward)
    return Task(run=lambda: backward(forward()))


def _timing_row(shape, name, pass_, samples, roof) -> dict:
    fl, by = counts.flops(shape, pass_), counts.min_bytes(shape, pass_)
    med = samples.median
    row = {"shape": shape.name, "variant": name, "pass": pass_, "rounds": len(samples.times),
           **samples.to_dict(), "flops": fl, "min_bytes": by,
           "tflops": fl / med / 1e12, "gbps": by / med / 1e9}
    row["fp32_roof_fraction"] = row["tflops"] / roof["fp32_tflops"]
    row["copy_roof_fraction"] = row["gbps"] / roof["copy_gbps"]
    return row


def plan(config, *, variants: dict | None = None, skip=None) -> tuple[list[str], list[dict]]:
    """The variants that run on the config's device, and the skipped ones with why.

    ``config``: anything with ``device`` and ``variants`` (the model bench passes
    its own variant names and ``skip`` rule)."""
    variants = VARIANTS if variants is None else variants
    skip = skip_reason if skip is None else skip
    device = env.resolve_device(config.device)
    run, skipped = [], []
    for key in config.variants:
        why = skip(key, device)
        if why is None:
            run.append(key)
        else:
            skipped.append({"variant": variants[key], "reason": why})
    return run, skipped


def total_steps(config: BenchConfig) -> int:
    """How many ``on_step`` calls ``run_bench`` makes (for a progress bar's total)."""
    n = len(plan(config)[0])
    per_shape = 1 + n + len(config.passes) * n * (config.warmup + config.rounds)
    return 1 + len(config.shapes) * per_shape


def run_bench(config: BenchConfig, *, on_step: Callable[[str], None] | None = None,
              clock: Clock | None = None, command: str | None = None) -> dict:
    """Run ``config``; return the results record (JSON-serialisable, see ``report``)."""
    device, clock, step = start(config, on_step=on_step, clock=clock)
    keys, skipped = plan(config)
    with measuring(device):
        record = {**record_head(SCHEMA, command, config, device, skipped), "shapes": [], "timings": []}
        cuda = device.type == "cuda"
        step("measuring the fp32 and copy roofs")
        record["roof"] = measure_roofs(device, clock, n=config.roof_n or (8192 if cuda else 1024),
                                       copy_mib=1024 if cuda else 64)
        for shape in config.shapes:
            record["shapes"].append(_run_shape(config, shape, keys, device, clock, step,
                                               record["roof"], record["timings"]))
            if cuda:
                torch.cuda.empty_cache()
    return record


def _run_shape(config, shape, keys, device, clock, step, roof, timings, make_forward=None) -> dict:
    """Probe and time every variant of ``keys`` on ``shape``; timing rows go to ``timings``.
    ``make_forward(key, shape, inp)``: the forward factory (default ``forward_fn``; the grid
    bench passes one that keeps a compiled reference across keys)."""
    make_forward = make_forward or forward_fn
    log.info("bench %s on %s", shape.describe(), device)
    inp = make_inputs(shape, device, seed=config.seed)
    u0, alpha, wrt = differentiable(shape, inp)
    n = min(config.check_edges, shape.edges)
    step(f"{shape.name}: float64 reference on {n} edges")
    t0 = time.perf_counter()
    ref = _reference64(shape, inp, n)
    reference_s = time.perf_counter() - t0
    records, fwds = {}, {}
    for key in keys:
        step(f"{shape.name}: warming up {VARIANTS[key]}")
        t0 = time.perf_counter()
        try:
            # setup: the variant's scope and forward (level 3 forced onto a config validates it here)
            scope = _scope(key, shape, device)
            fwd = make_forward(key, shape, inp)
            setup_s = time.perf_counter() - t0
            records[key] = {**_probe(key, fwd, scope, shape, inp, u0, alpha, wrt, ref, n, device), "setup_s": setup_s}
            fwds[key] = (fwd, scope)
        except Exception as exc:                      # recorded and shown; the rest still runs
            records[key] = {"variant": VARIANTS[key], "level": LEVEL_OF[key], "dispatch": {},
                            "peak_mib": None, "first_call_s": None, "setup_s": time.perf_counter() - t0,
                            "rel_error": {}, "note": None,
                            "failed": _failure(exc, f"{VARIANTS[key]} on {shape.name}", device)}
    _path_notes(records)
    failed_passes = {}
    for pass_ in config.passes:
        tasks = {VARIANTS[k]: pass_task(pass_, f, sc, u0, alpha, wrt, inp.grad_out) for k, (f, sc) in fwds.items()}
        if not tasks:
            continue
        try:
            samples = time_interleaved(
                tasks, rounds=config.rounds, warmup=config.warmup, clock=clock,
                on_sample=lambda name, timed, p=pass_: step(f"{shape.name} {PASS_LABELS[p]}: {name}"))
        except Exception as exc:                      # keep the other passes and shapes
            failed_passes[pass_] = _failure(exc, f"timing {pass_} on {shape.name}", device)
            continue
        timings.extend(_timing_row(shape, name, pass_, s, roof) for name, s in samples.items())
    return {**shape.to_dict(), "check_edges": n, "reference64_s": reference_s, "variants": list(records.values()),
            "failed_passes": failed_passes}


def _failure(exc: Exception, what: str, device: torch.device) -> str:
    """Log a failed run, release its memory, and describe it for the record."""
    log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return f"{type(exc).__name__}: {exc}"
