"""deepmd-kit's own levels against the accelerated model, on one device in one run.

``mixstack bench deepmd --atoms 500 2000 4000`` (its options: ``mixstack.cli.bench.deepmd``).  A
frame is deepmd-kit's own forward of a SeZM model: ``model(coord, atype, box)`` in evaluation,
energy, forces and virial (its neighbour list included).  Variants:

* ``dp0``, ``dp2``, ``dp3``: deepmd-kit at ``DP_TRITON_INFER`` 0, 2, 3 (read when a model is
  built, so each variant is its own model with the same weights);
* ``ms2``, ``ms3`` (any ``msN``): ``mixstack.deepmd.accelerate`` at mixstack level N, on a model
  built at ``DP_TRITON_INFER`` ``--rest-level`` (deepmd-kit's kernels for the rest of the model);
* suffixes, in this order: ``c`` deepmd-kit's compiled inference (``DP_COMPILE_INFER=1``: its
  ``core_compute`` traced by ``make_fx`` and compiled by Inductor, mixstack's operators inside
  for ``msNc``), ``t`` its TF32 inference (``DP_TF32_INFER=1``: TF32 products, not float32), ``g``
  the frame through ``mixstack.deepmd.FrameRunner`` (a kept neighbour list in fixed buffers,
  replayed from a CUDA graph on a GPU) instead of ``model(coord, atype, box)``: ``dp2c``,
  ``ms3cg``.

Per case (config x system x size): the median frame time of interleaved rounds in rotating
order after warm-up (``mixstack.bench.timing``, CUDA events), peak memory above the resident
models (for a ``g`` variant with what its runner holds: the graph's whole memory pool, reserved
for its replays, and its buffers),
and energy, forces and virial against the float64 model (deepmd-kit's path, same
weights); with ``--breakdown``, each variant's device time per stage, forward and backward
(``deepmd_ranges``: the edge build and the value path apart from the rest; a ``g`` variant's
frame profiled eagerly, the graph replays the same kernels), the busy time (the sum of kernel
times) and the host gap (the frame's median less that); with ``--md-steps N``, each variant's
NVE throughput through an ASE calculator (``deepmd_md``: deepmd-kit's own for a frame of its
model, ``mixstack.deepmd.DeepmdCalculator`` for a ``g`` variant; the variant's model, already
compiled and captured, in both; steps per second, ns per day, energy drift; the variants run
one after another, not interleaved).  Results:
``deepmd_bench.json``, ``.md`` and ``.csv``.  The models are untrained: weights perturbed
(``configs.perturb``).

A case runs in steps (``Progress``): the float64 reference frame; each variant built with its
first frame (Triton's compiles and autotuning land here), then its peak memory; the timing; each
breakdown; each MD run.  Each step is said as it ends (``on_step``, with its seconds) and the
record is written as each starts and ends (``on_write``), so a run cut off leaves what it
finished and the step it was in; with a time budget (``--seconds``) no step starts once it is
spent, and what was left says why (``not_run``, ``steps_not_run``).  Nothing here prints.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import re
import tempfile
import time
from typing import NamedTuple

import torch

from ..deepmd import configs, systems
from ..measure import env, report
from ..measure.timing import Task, clock_for, time_interleaved
from . import breakdown, deepmd_md
from .deepmd_ranges import KERNEL_STAGES, STAGES

log = logging.getLogger(__name__)

SYSTEMS = {"water": (systems.water, ["O", "H"]), "rocksalt": (systems.rocksalt, ["Ni", "O"])}


class Variant(NamedTuple):
    """A parsed variant name: who runs the value path (``"dp"`` or ``"ms"``), the level, and the
    suffixes ``c`` (compiled inference), ``p`` / ``k`` (the rest of the model's products compensated
    in ATen operations / by mixstack's kernel, ``ms`` compiled only), ``f`` (the compiled graph
    lowered with Inductor's own fusion, ``lowering="fused"``, ``ms`` compiled only), ``t`` (TF32
    inference), ``g`` (``FrameRunner``)."""

    who: str
    level: int
    compiled: bool = False
    tf32: bool = False
    graphed: bool = False
    products: str = "exact"
    lowering: str = "deepmd"


_VARIANT = re.compile(r"(dp|ms)([0-3])(c?)([pk]?)(f?)(t?)(g?)")
_PRODUCTS = {"": "exact", "p": "compensated", "k": "kernel"}


def parse_variant(key: str) -> Variant:
    """``"ms3cg"`` -> ``Variant("ms", 3, compiled=True, graphed=True)``."""
    m = _VARIANT.fullmatch(key) if isinstance(key, str) else None
    if m is None or (m[4] or m[5]) and (m[1] != "ms" or not m[3]):
        raise ValueError(f"variant must be dpN or msN (N in 0..3) with optional suffixes c, p or k, f, t, g in "
                         f"that order (p, k, f: ms with c only), got {key!r}")
    return Variant(m[1], int(m[2]), bool(m[3]), bool(m[6]), bool(m[7]), _PRODUCTS[m[4]],
                   "fused" if m[5] else "deepmd")


@contextlib.contextmanager
def _deepmd_env(**values):
    """deepmd-kit's inference knobs, read when a model is built, set for the ``with`` body."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(v) for name, v in values.items()})
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def build_variant(key: str, config: dict, state: dict, device, rest_level: int):
    """The model of variant ``key``: ``config`` built with its deepmd-kit knobs, ``state`` loaded,
    on ``device`` in evaluation (accelerated for ``ms``); returns ``(model, report or None)``."""
    v = parse_variant(key)
    with _deepmd_env(DP_TRITON_INFER=v.level if v.who == "dp" else rest_level,
                     DP_COMPILE_INFER=int(v.compiled), DP_TF32_INFER=int(v.tf32)):
        model = configs.build_model(config)
    model.load_state_dict(state)
    model = model.to(device).eval()
    if v.who == "dp":
        return model, None
    from ..deepmd.accelerate import accelerate
    return model, accelerate(model, level=v.level, rest_products=v.products, lowering=v.lowering)


def _frame(model, inputs):
    coord, atype, box = inputs
    return model(coord, atype, box)


def _deviation(out, ref) -> dict:
    dev = {}
    for key in ("energy", "force", "virial"):
        diff = (out[key].detach().double() - ref[key].detach().double()).abs().max().item()
        scale = ref[key].detach().abs().max().item()
        dev[f"{key}_max_abs"], dev[f"{key}_rel"] = diff, diff / scale if scale else None
    return dev


def _frame_memory(fn, device) -> tuple[int, int]:
    """``(allocated, reserved)``: what one call of ``fn`` allocates at its peak, and how much more
    the caching allocator reserves from the device for it, from an emptied cache (its free blocks
    back on the device first): the device memory the call takes, fragmentation included."""
    base = _reserved(device)
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - resident,
            torch.cuda.max_memory_reserved(device) - base)


def _profiled_frame(key: str, built: Built, inputs):
    """The frame the breakdown profiles: a ``g`` variant's frame run eagerly on a runner of its
    own (a graph replays the same kernels, which the profiler does not split into stages)."""
    if built.runner is None:
        return built.run
    eager = _eager_runner(key, built)
    return lambda: eager(*inputs)


def _stage_times(run, model, device, rounds: int) -> dict:
    from .deepmd_ranges import kernel_split, ranges

    cuda = torch.device(device).type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    run()                                                  # a first call outside the profile (a fresh runner's list)
    if cuda:
        torch.cuda.synchronize(device)
    with ranges(model), torch.profiler.profile(activities=activities) as prof:
        for _ in range(rounds):
            run()
            if cuda:
                torch.cuda.synchronize(device)
    events = prof.events()
    times, _, total = breakdown.attribute(events, "cuda" if cuda else "cpu")
    per = 1e-3 / rounds
    stages = {s: {f"{p}_ms": times.get((s, p), 0.0) * per for p in breakdown.PASSES}
              for s in (*STAGES, breakdown.OTHER)}
    out = {"device_time": "CUDA kernel time" if cuda else "CPU time of the operators",
           "busy_ms": total * per, "stages": stages}
    if cuda:                  # a compiled frame's ranges hold nothing: its kernels by name, every variant alike
        out["kernels"] = {f"{s}_ms": t * per for s, t in kernel_split(events).items()}
    return out


def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class Progress:
    """A run's steps and its time budget.  ``step(label)`` times a step: the record is written
    (``on_write(record)``) as it starts, naming it (``record["running"]``: a run cut off leaves
    the step it was in on disk), and as it ends, when ``on_step(text)`` says its seconds; a step
    that raises is named in ``record["failed"]``, written, and the error goes on.  With
    ``seconds``, no step starts once that many have gone from ``start`` (a ``clock`` reading,
    default now): ``out_of_time`` says why, and ``record["stopped"]`` too."""

    def __init__(self, record: dict, *, seconds: float | None = None, start: float | None = None,
                 on_step=None, on_write=None, clock=time.monotonic):
        self.record, self.seconds, self.clock = record, seconds, clock
        self.start = clock() if start is None else start
        self.on_step = on_step or (lambda _text: None)
        self.on_write = on_write or (lambda _record: None)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def out_of_time(self) -> str | None:
        """Why no step may start now, or ``None`` while the budget lasts."""
        if self.seconds is None or self.elapsed() < self.seconds:
            return None
        return self.record.setdefault("stopped", f"out of time (--seconds {self.seconds:g})")

    @contextlib.contextmanager
    def step(self, label: str):
        """Time the body as step ``label``; it yields a list the body adds notes to (said after the time)."""
        notes: list[str] = []
        self.record["running"] = {"step": label, "from_s": round(self.elapsed(), 1)}
        self.on_write(self.record)
        t0 = self.clock()
        try:
            yield notes
        except BaseException as err:
            del self.record["running"]
            first = str(err).splitlines()[0][:200] if str(err) else ""
            self.record["failed"] = {"step": label, "error": f"{type(err).__name__}: {first}".rstrip(": ")}
            self.on_write(self.record)
            raise
        del self.record["running"]
        self.on_step(f"{label}: {self.clock() - t0:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""))
        self.on_write(self.record)


# A variant's fields a step fills, as the tables and "not run" notes name them.
STEP_NAMES = {"memory": "peak memory", "other_pool": "the other pool", "time": "timing", "breakdown": "breakdown", "md": "MD"}


def _mark(entries, field: str, why: str) -> None:
    for entry in entries:
        entry.setdefault("steps_not_run", {})[field] = why


def _step(progress: Progress, label: str, entry: dict, field: str, fn, say=None) -> bool:
    """``entry[field] = fn()`` as step ``label`` (``say(value)`` its note), or, out of time,
    why not in ``entry["steps_not_run"][field]``; whether it ran."""
    why = progress.out_of_time()
    if why:
        _mark([entry], field, why)
        return False
    with progress.step(label) as notes:
        entry[field] = fn()
        if say:
            notes.append(say(entry[field]))
    return True


class Built(NamedTuple):
    """A variant ready to time: its model, its ``FrameRunner`` (``g``; else ``None``), the frame
    to time, and ``accelerate``'s report (``ms``; else ``None``)."""

    model: torch.nn.Module
    runner: object
    run: object
    report: object


def _md_one(built: Built, path, atoms, args, device) -> dict:
    runner = built.runner
    if runner is not None:
        from ..deepmd.calculator import DeepmdCalculator
        calc = DeepmdCalculator(runner)
    else:
        calc = deepmd_md.deepmd_calculator(path, built.model)
    start = {}

    def before():                                  # the runner's counters as the timed steps begin
        if runner is not None:
            start.update(rebuilds=runner.rebuilds, captures=runner.captures, calls=runner.calls, **runner.seconds)
    record = deepmd_md.md_throughput(calc, atoms, steps=args.md_steps, warmup=args.md_warmup,
                                     dt_fs=args.md_dt, device=device, before=before)
    if runner is not None:                         # counted over the whole run, the timing's frames too
        record["rebuilds"], record["captures"] = runner.rebuilds, runner.captures
        # over the timed steps only: what the MD step's upkeep beside the frame is made of
        record["md_rebuilds"] = runner.rebuilds - start["rebuilds"]
        record["md_captures"] = runner.captures - start["captures"]
        record["md_rebuild_s"] = round(runner.seconds["rebuild"] - start["rebuild"], 4)
        record["md_capture_s"] = round(runner.seconds["capture"] - start["capture"], 4)
        record["md_events"] = [e for e in runner.events if e["call"] > start["calls"]]
    return {**record, "accelerated": None if built.report is None else [c.runs_on for c in built.report]}


def _md_line(md: dict) -> str:
    """The progress line of one MD run: steps/s, and a runner's rebuilds and captures in it."""
    line = f"{md['steps_per_s']:.2f} steps/s"
    if "md_rebuilds" in md:
        line += (f"; over the timed steps {md['md_rebuilds']} rebuild(s) {md['md_rebuild_s']:.2f} s, "
                 f"{md['md_captures']} capture(s) {md['md_capture_s']:.2f} s")
        captures = [e for e in md.get("md_events", ()) if e.get("what") == "capture" and "record_s" in e]
        if captures:
            parts = {key: sum(e.get(key, 0.0) for e in captures)
                     for key in ("before_s", "enter_s", "record_s", "instantiate_s")}
            line += (f" (warm-ups and pools {parts['before_s']:.2f}, entering {parts['enter_s']:.2f}, "
                     f"recording {parts['record_s']:.2f}, instantiating {parts['instantiate_s']:.2f})")
            pools = [e["pool"] for e in captures if "pool" in e]     # kept, scaled or measured (FrameRunner)
            if pools:
                line += f"; pools {', '.join(pools)}"
    return line


def md_runs(config: dict, model, frame, type_map, case: dict, variants: dict, args, progress: Progress) -> None:
    """Each variant's ``md`` in ``case`` (``variants``: ``{key: Local or Remote}``): NVE through an
    ASE calculator on the variant's own model (deepmd-kit's calculator on ``model``'s weights
    written as a checkpoint, its model then the variant's; ``DeepmdCalculator`` on a ``g``
    variant's runner), one variant after another, a step each."""
    why = progress.out_of_time()
    if why or not variants:
        _mark([case["variants"][k] for k in variants], "md", why)
        return
    atoms = deepmd_md.atoms_of(frame, type_map)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        deepmd_md.save_checkpoint(model, config, path)
        for key, v in variants.items():
            _step(progress, f"MD {key}", case["variants"][key], "md", lambda v=v: v.md(path, atoms),
                  say=_md_line)


def _reference(case: dict, type_map, frame, args, device):
    """The perturbed float32 weights (a model at ``DP_TRITON_INFER`` 0 and its state) and the
    float64 model's energy, forces and virial on ``frame`` (same weights)."""
    cut = {"rcut": args.rcut} if args.rcut else {}
    config = configs.model_config(case["config"], type_map=type_map, **cut)
    with _deepmd_env(DP_TRITON_INFER=0):
        base = configs.perturb(configs.build_model(config), seed=args.seed)
        ref_model = configs.build_model(configs.model_config(case["config"], type_map=type_map,
                                                             precision="float64", **cut))
    state = base.state_dict()
    ref_model.load_state_dict(state)
    try:
        ref = _reference_frame(ref_model, frame, device)
    except torch.OutOfMemoryError:
        # the float64 frame of a large model outgrows an 80 GB GPU (2-stream, ~4,000 atoms): the host holds it
        _free(device)
        case["reference_device"] = "cpu (the float64 frame did not fit the GPU's memory)"
        log.warning("the float64 reference frame did not fit %s: computing it on the CPU", device)
        ref = {k: v.to(device) for k, v in _reference_frame(ref_model, frame, torch.device("cpu")).items()}
    del ref_model
    _free(device)                                          # the float64 frame's memory, before the variants
    return config, base, state, ref


def _reference_frame(model, frame, device) -> dict:
    """The float64 ``model``'s energy, forces and virial on ``frame``, computed on ``device``."""
    inputs64 = tuple(None if t is None else t.to(device) for t in frame)
    return {k: v.detach() for k, v in _frame(model.to(device).eval(), inputs64).items()
            if k in ("energy", "force", "virial")}


def _first_frame(key: str, model, inputs, args, notes: list):
    """``(runner or None, run)``: variant ``key``'s frame, run once (compiles, captures)."""
    from ..deepmd.frame import FrameRunner, warm_eager

    v = parse_variant(key)
    if v.compiled:
        warm_eager(model, *inputs)                # level 3's first-use checks before the trace
    if not v.graphed:
        _frame(model, inputs)
        return None, lambda: _frame(model, inputs)
    runner = FrameRunner(model, skin=args.skin)
    runner(*inputs)
    notes.append(f"{runner.captures} CUDA graph(s) captured, {runner.edge_capacity} edge slots"
                 if runner.captures else f"{runner.edge_capacity} edge slots, eager (no CUDA)")
    return runner, lambda: runner(*inputs)


def _eager_runner(key: str, built: Built):
    """A runner of its own on a ``g`` variant's model that runs the same frame eagerly."""
    from ..deepmd.frame import FrameRunner
    return FrameRunner(built.model, skin=built.runner.skin, graph=False, compile=parse_variant(key).compiled)


def _max_diff(a: dict, b: dict) -> dict:
    """The largest difference of each output of two frames (0: bitwise)."""
    return {k: (a[k].double() - b[k].double()).abs().max().item() for k in ("energy", "force", "virial")}


def _replay_check(key: str, built: Built, inputs) -> dict | None:
    """A ``g`` variant on a GPU: its replayed frame against the same frame run eagerly (same
    kept list and capacity): the largest difference of each output (0: bitwise)."""
    if built.runner is None or not built.runner.captures:
        return None
    return _max_diff(built.run(), _eager_runner(key, built)(*inputs))


def build_variant_step(key: str, entry: dict, config: dict, state: dict, inputs, ref, args, device,
                       progress: Progress) -> Built:
    """Variant ``key`` built and its first frame against ``ref`` as one step, its peak memory as
    another (on a GPU), into ``entry``: a ``Built`` to time (in this process, or in a worker's:
    ``deepmd_workers``)."""
    cuda = torch.device(device).type == "cuda"
    with progress.step(f"{key}: built + first frame") as notes:
        model, acc_report = build_variant(key, config, state, device, args.rest_level)
        entry["accelerated"] = None if acc_report is None else [c.runs_on for c in acc_report]
        runner, run = _first_frame(key, model, inputs, args, notes)
        built = Built(model, runner, run, acc_report)
        if runner is not None and runner.fallback_reason:
            entry["graph_fallback"] = runner.fallback_reason
            notes.append(f"no CUDA graph: {runner.fallback_reason}")
        first = run()
        entry["accuracy"] = _deviation(first, ref)
        notes.append(f"force max abs {entry['accuracy']['force_max_abs']:.1e}")
        entry["run_to_run"] = _max_diff(first, run())        # the same frame again: deterministic where 0
        notes.append(f"run to run force max abs {entry['run_to_run']['force']:.1e}")
        if (replay := _replay_check(key, built, inputs)) is not None:
            entry["replay_vs_eager"] = replay
            notes.append(f"replay vs eager force max abs {replay['force']:.1e}")
    if not cuda:
        entry["peak_memory_bytes"] = entry["device_memory_bytes"] = None
    else:
        graphed = runner is not None and runner.captures > 0
        # a graph's memory from a runner of its own: the first one's also held the compiler's
        measure = (lambda: _graph_memory(built, inputs, ref, device, runner.presize)) if graphed else \
            (lambda: _memory(run, device))
        _step(progress, f"{key}: peak memory", entry, "memory", measure,
              say=lambda m: f"{m['peak_memory_bytes'] / 2 ** 20:.0f} MiB allocated at the peak, "
                            f"{m['device_memory_bytes'] / 2 ** 20:.0f} MiB taken from the device")
        entry.update({k: v for k, v in (entry.pop("memory", None) or {}).items() if k.endswith("_bytes")})
        if graphed:
            _step(progress, f"{key}: {'plain' if runner.presize else 'presized'} pool", entry, "other_pool",
                  lambda: _graph_memory(built, inputs, ref, device, not runner.presize),
                  say=lambda m: f"{m['device_memory_bytes'] / 2 ** 20:.0f} MiB taken from the device, "
                                f"force max abs {m['force_max_abs']:.1e}")
    return built


def _graph_memory(built: Built, inputs, ref, device, presize: bool) -> dict:
    """A ``g`` variant's graph captured again by a runner of its own on the same (compiled, warm)
    model, into a fresh pool or one that held the frame's peak in one block first
    (``FrameRunner(presize=...)``): the tensors alive together at its warm-up and capture
    (``peak_memory_bytes``), the device memory it takes (its buffers and its pool), and its
    forces against float64."""
    from ..deepmd.frame import FrameRunner

    base = _reserved(device)
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)             # a presized capture resets it once more
    runner = FrameRunner(built.model, skin=built.runner.skin, presize=presize)
    out = runner(*inputs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - resident
    held = _reserved(device) - base
    dev = _deviation(out, ref)
    del runner, out
    _free(device)
    return {"presize": presize, "peak_memory_bytes": peak, "device_memory_bytes": held,
            "force_max_abs": dev["force_max_abs"]}


class Local:
    """A variant built in this process, as ``run_case`` uses it: a task for the interleaved
    timing, its breakdown, its MD run (``deepmd_workers.Remote`` is the same for a worker's)."""

    clock = None                                   # the device's own (``timing.clock_for``)

    def __init__(self, key: str, built: Built, inputs, args, device):
        self.key, self.built, self.inputs, self.args, self.device = key, built, inputs, args, device

    @property
    def run(self):
        """One frame."""
        return self.built.run

    def task(self) -> Task:
        return Task(run=self.built.run)

    def breakdown(self) -> dict:
        return _stage_times(_profiled_frame(self.key, self.built, self.inputs), self.built.model, self.device,
                            self.args.breakdown_rounds)

    def md(self, path: str, atoms) -> dict:
        return _md_one(self.built, path, atoms, self.args, self.device)

    def close(self) -> None:
        pass


def _memory(run, device) -> dict:
    """An eager frame's memory above the resident models: ``peak_memory_bytes`` its tensors alive
    together at its peak, ``device_memory_bytes`` what the caching allocator reserves from the
    device for it, from an emptied cache."""
    allocated, reserved = _frame_memory(run, device)
    return {"peak_memory_bytes": allocated, "device_memory_bytes": reserved}


def _allocated(device) -> int:
    torch.cuda.synchronize(device)
    gc.collect()
    return torch.cuda.memory_allocated(device)


def _reserved(device) -> int:
    """The memory the caching allocator holds once its free blocks went back: a CUDA graph's
    private pool stays whole (its replays reuse all of it), what no tensor or pool holds does not."""
    _allocated(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


def _time_all(case: dict, tasks: dict, args, device, progress: Progress, clock=None) -> None:
    """The variants of ``tasks`` timed in interleaved rounds (``time_interleaved``) as one step,
    with ``clock`` (default the device's)."""
    why = progress.out_of_time()
    if why:
        _mark([case["variants"][key] for key in tasks], "time", why)
        return
    with progress.step(f"timing {args.rounds} rounds (after {args.warmup} warm-up) x {len(tasks)} variants"):
        samples = time_interleaved(tasks, rounds=args.rounds, warmup=args.warmup, clock=clock or clock_for(device))
        for key, s in samples.items():
            case["variants"][key]["time"] = s.to_dict()


def _not_run(case: dict, variants, why: str) -> dict:
    case["not_run"] = why
    case["variants"] = {key: {"not_run": why} for key in variants}
    return case


class Prepared(NamedTuple):
    """A case made ready to build: its frame, the float64 reference, the model config and weights."""

    config: dict
    base: object
    state: dict
    ref: dict
    frame: tuple
    type_map: list
    inputs: tuple


def prepare_case(case: dict, variants, args, device, progress: Progress) -> Prepared | None:
    """``case``'s frame and float64 reference frame (``None``, the case marked not run, out of time)."""
    make_frame, type_map = SYSTEMS[case["system"]]
    coord, atype, box = frame = make_frame(case["atoms"], seed=args.seed)
    case["atoms"] = int(atype.numel())
    why = progress.out_of_time()
    if why:
        _not_run(case, variants, why)
        return None
    with progress.step("float64 reference frame"):
        config, base, state, ref = _reference(case, type_map, frame, args, device)
    inputs = (coord.float(), atype, None if box is None else box.float())
    return Prepared(config, base, state, ref, frame, type_map, inputs)


def run_case(case: dict, variants, args, device, progress: Progress) -> dict:
    """One config on one system size (``case``: ``config``, ``system``, ``atoms`` asked for and
    ``variants``, filled in place, step by step): the float64 reference frame, every variant
    built with its first frame and peak memory (here, or with ``args.processes`` each in a process
    of its own, all at once: ``deepmd_workers``), timed, its breakdown, its MD."""
    prepared = prepare_case(case, variants, args, device, progress)
    if prepared is not None:
        run_built(case, prepared, _build_all(case, variants, prepared, args, device, progress), args, device, progress)
    return case


def run_built(case: dict, prepared: Prepared, built: dict, args, device, progress: Progress) -> None:
    """``case``'s ``built`` variants timed, broken down and run in MD, then closed."""
    try:
        if built:
            clock = next(iter(built.values())).clock
            _time_all(case, {key: b.task() for key, b in built.items()}, args, device, progress, clock=clock)
        if args.breakdown:
            for key, b in built.items():
                _step(progress, f"breakdown {key}", case["variants"][key], "breakdown", b.breakdown)
        if args.md_steps > 0:
            md_runs(prepared.config, prepared.base, prepared.frame, prepared.type_map, case, built, args, progress)
    finally:
        _close_all([built])


def _keys_in_time(case: dict, variants, progress: Progress) -> list:
    """The variants that may start building: the others marked not run (out of time)."""
    keys = []
    for key in variants:
        entry = case["variants"].setdefault(key, {})
        why = progress.out_of_time()
        if why:
            entry["not_run"] = why
        else:
            keys.append(key)
    return keys


def _payload(prepared: Prepared, args, device) -> dict:
    """What a worker builds a variant of the case from (``build_in_worker``)."""
    return {"build": build_in_worker, "device": str(device), "args": args, "config": prepared.config,
            "state": prepared.state, "inputs": prepared.inputs, "ref": {k: v.cpu() for k, v in prepared.ref.items()}}


def run_cases_built_ahead(cases: list, args, device, progress: Progress, *, on_case=None) -> None:
    """``--build-ahead``: every case's (``(case, variants, label)``) float64 reference, then
    every case's variants building in workers of their own all at once (``deepmd_workers.start``),
    all of them waited for before any is timed (a build's GPU work would disturb another case's
    timing), then each case timed, broken down and run in MD in turn.  Every variant of every case
    holds its memory until its case ends.  ``on_case(label)`` as each case is prepared and as it is
    timed."""
    from .deepmd_workers import collect, start

    share = sum(len(variants) for _, variants, _ in cases)
    labels = {id(case): label for case, _, label in cases}
    references = []                  # every reference first: none shares the device with a build
    for case, variants, label in cases:
        if on_case:
            on_case(f"{label}: the float64 reference")
        prepared = prepare_case(case, variants, args, device, progress)
        if prepared is not None:
            references.append((case, variants, prepared))
    pending = []
    try:
        for case, variants, prepared in references:
            keys = _keys_in_time(case, variants, progress)
            pending.append((case, prepared, start(keys, _payload(prepared, args, device), share=share) if keys else {}))
    except BaseException:
        _close_all((workers for _, _, workers in pending), wait=0)
        raise
    ready = []
    for i, (case, prepared, workers) in enumerate(pending):
        try:
            ready.append((case, prepared, collect(workers, case, progress)))
        except BaseException:
            _close_all((later for _, _, later in pending[i + 1:]), wait=0)
            _close_all(built for _, _, built in ready)
            raise
    for i, (case, prepared, built) in enumerate(ready):
        if on_case:
            on_case(labels[id(case)])
        try:
            run_built(case, prepared, built, args, device, progress)
        except BaseException:
            _close_all(later for _, _, later in ready[i + 1:])
            raise


def _close_all(groups, **kwargs) -> None:
    """Every worker or built variant in ``groups`` (dicts of them) closed, with ``kwargs``."""
    for group in groups:
        for item in group.values():
            item.close(**kwargs)


def _build_all(case: dict, variants, prepared: Prepared, args, device, progress: Progress):
    """``{key: Local or Remote}``: every variant built (``build_variant_step``), one after another
    here or, with ``args.processes``, each in a worker of its own at once."""
    keys = _keys_in_time(case, variants, progress)
    if getattr(args, "processes", False) and keys:
        from .deepmd_workers import build_all
        return build_all(keys, case, _payload(prepared, args, device), progress)
    built = {}
    p = prepared
    for key in keys:
        try:
            built[key] = _build_local(key, case["variants"][key], p.config, p.state, p.inputs, p.ref, args, device,
                                      progress)
        except Exception:                          # one variant that cannot build leaves the others
            log.warning("variant %s failed", key, exc_info=True)
            _free(device)
    return built


def _build_local(key: str, entry: dict, config: dict, state: dict, inputs, ref, args, device,
                 progress: Progress) -> Local:
    """``build_variant_step`` in this process on the host ``inputs`` moved to ``device``; a build that
    raised marks ``entry["not_run"]`` with its step and error before the error goes on."""
    on_device = tuple(None if t is None else t.to(device) for t in inputs)
    try:
        return Local(key, build_variant_step(key, entry, config, state, on_device, ref, args, device, progress),
                     on_device, args, device)
    except Exception as err:
        failed = progress.record.pop("failed", {})
        entry["not_run"] = f"failed in {failed.get('step', key)}: {failed.get('error', err)}"
        raise


def build_in_worker(key: str, entry: dict, payload: dict, on_step) -> Local:
    """A worker's build (``deepmd_workers.serve``): ``_build_local`` on ``payload``'s case, with a
    progress of its own that says each step through ``on_step``."""
    device = torch.device(payload["device"])
    if device.type == "cuda" and device.index is not None:     # "cuda" alone: the current device
        torch.cuda.set_device(device)
    ref = {k: v.to(device) for k, v in payload["ref"].items()}
    return _build_local(key, entry, payload["config"], payload["state"], payload["inputs"], ref, payload["args"],
                        device, Progress({}, on_step=on_step))


def _stage_sum(stages, names) -> float | None:
    return None if not stages else sum(stages[s]["forward_ms"] + stages[s]["backward_ms"] for s in names)


def _value_path_ms(v: dict) -> float | None:
    """The Wigner rows to aggregation, forward and backward: the ranges' figure, or where they hold
    none (a compiled frame), the value path's kernels by name."""
    b = v.get("breakdown", {})
    ranged = _stage_sum(b.get("stages"), ("wigner", "value_path"))
    kernels = b.get("kernels")
    if not ranged and kernels:
        return kernels["wigner_ms"] + kernels["value_path_ms"]
    return ranged


def _stage_rows(record: dict) -> list[str]:
    """Where each variant's device time goes: the value path (Wigner rows to aggregation) apart
    from the rest of the convolution and of the model, forward / backward; and the same frame's
    kernels by name (``deepmd_ranges.kernel_split``), which a compiled frame's ranges cannot split."""
    lines = ["", "Device time per stage (ms a frame; ranges forward / backward, `deepmd_ranges`; kernels by "
             "name, forward + backward, `deepmd_ranges.kernel_split`):", "",
             "| config | system | atoms | variant | edges | wigner | value path | rest of convolution | rest of model "
             "| kernels: wigner | value path | deepmd-kit's products | other |",
             "|" + "---|" * 13]
    for case in record["cases"]:
        for key, v in case["variants"].items():
            stages = v.get("breakdown", {}).get("stages")
            if not stages:
                continue
            cells = [f"{stages[s]['forward_ms']:.2f} / {stages[s]['backward_ms']:.2f}"
                     for s in (*STAGES, breakdown.OTHER)]
            kernels = v["breakdown"].get("kernels")
            cells += [report.fmt(None if kernels is None else kernels[f"{s}_ms"], ".2f") for s in KERNEL_STAGES]
            lines.append("| " + " | ".join([case["config"], case["system"], str(case["atoms"]), key, *cells]) + " |")
    return lines if len(lines) > 5 else []


def not_run_text(variant: dict) -> str | None:
    """Why a variant, or some of its steps, did not run (``"timing, MD: out of time (--seconds 60)"``),
    or ``None``."""
    if variant.get("not_run"):
        return variant["not_run"]
    by_reason: dict[str, list[str]] = {}
    for field, why in variant.get("steps_not_run", {}).items():
        by_reason.setdefault(why, []).append(STEP_NAMES[field])
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items()) or None


def _status_lines(record: dict) -> list[str]:
    """Where a run stood when its record was written: the step it was in (a run cut off), the
    step that failed, the budget that stopped it."""
    lines = []
    if record.get("running"):
        r = record["running"]
        lines.append(f"unfinished: written while running {r['step']} (from {r['from_s']:.0f} s into the run)")
    if record.get("failed"):
        lines.append(f"failed in {record['failed']['step']}: {record['failed']['error']}")
    if record.get("stopped"):
        lines.append(f"stopped: {record['stopped']}; what it left is marked not run")
    return lines


def _not_run_section(record: dict) -> list[str]:
    lines = []
    for case in record["cases"]:
        label = f"{case['config']} / {case['system']} / {case['atoms']} atoms"
        if case.get("not_run"):
            lines.append(f"- {label}: {case['not_run']}")
            continue
        lines += [f"- {label}, {key}: {text}" for key, v in case["variants"].items() if (text := not_run_text(v))]
    return ["", "## Not run", "", *lines] if lines else []


FLOAT32_BAND = 8        # a variant at float32 accuracy: forces within this factor of the case's most accurate


def fastest_deepmd(case: dict) -> tuple[str, float] | None:
    """The case's fastest timed deepmd-kit variant (``dp...``) at float32 accuracy and its median,
    or ``None``: its forces within ``FLOAT32_BAND`` times the most accurate variant's error
    against float64 (deepmd-kit's fp16x3 stack at lmax 3 and two streams is ~40x that: a faster
    frame at another accuracy is not the anchor), every timed ``dp`` variant where none has one."""
    timed = [(v["time"]["median_ms"], key) for key, v in _deepmd_in_band(case).items() if v.get("time")]
    return (min(timed)[1], min(timed)[0]) if timed else None


def against_deepmd(case: dict) -> dict[str, dict[str, float | None]]:
    """Per variant, its frame, GPU-busy time and MD rate against deepmd-kit's: the frame and busy
    time against the anchor (``fastest_deepmd``), the MD steps/s against the fastest of the deepmd-kit
    variants in the float32 band (each ``x`` above 1 is faster than deepmd-kit)."""
    best = fastest_deepmd(case)
    anchor = case["variants"][best[0]] if best else {}
    anchor_busy = anchor.get("breakdown", {}).get("busy_ms")
    md_rates = [r for v in _deepmd_in_band(case).values() if (r := v.get("md", {}).get("steps_per_s"))]
    out = {}
    for key, v in case["variants"].items():
        t, busy, md = v.get("time"), v.get("breakdown", {}).get("busy_ms"), v.get("md", {}).get("steps_per_s")
        out[key] = {"frame": best[1] / t["median_ms"] if best and t else None,
                    "busy": anchor_busy / busy if anchor_busy and busy else None,
                    "md": md / max(md_rates) if md and md_rates else None}
    return out


def _deepmd_in_band(case: dict) -> dict:
    """The case's deepmd-kit variants (``dp...``) whose forces are within ``FLOAT32_BAND`` of the case's
    most accurate variant's (or unknown)."""
    def err(v):
        return v.get("accuracy", {}).get("force_max_abs")

    errors = [e for v in case["variants"].values() if (e := err(v)) is not None]
    limit = FLOAT32_BAND * max(min(errors), 1e-30) if errors else math.inf
    return {key: v for key, v in case["variants"].items()
            if key.startswith("dp") and (err(v) is None or err(v) <= limit)}


def _gap(v: dict) -> float | None:
    busy = v.get("breakdown", {}).get("busy_ms")
    return None if busy is None or not v.get("time") else v["time"]["median_ms"] - busy


def markdown(record: dict) -> str:
    lines = ["# deepmd-kit SeZM: deepmd-kit's levels against mixstack", ""]
    lines += [f"- {line}" for line in report.header_lines(record) + _status_lines(record)] + [""]
    lines += ["| config | system | atoms | variant | median ms | p20-p80 ms | x fastest dp | busy ms | host gap ms | "
              "x dp busy | peak MiB | device MiB | force max abs | energy rel | edges, fwd ms | "
              "Wigner to aggregation, fwd+bwd ms | rest, fwd+bwd ms | MD steps/s | MD ns/day | x dp MD | "
              "drift meV/atom/ps |",
              "|" + "---|" * 21]
    for case in record["cases"]:
        ratios = against_deepmd(case)
        for key, v in case["variants"].items():
            t = v.get("time")
            acc = v.get("accuracy", {})
            stages = v.get("breakdown", {}).get("stages")
            busy, value_path = v.get("breakdown", {}).get("busy_ms"), _value_path_ms(v)
            rest = None if value_path is None or not busy else busy - value_path - (_stage_sum(stages, ("edges",)) or 0)
            md = v.get("md", {})
            peak, held = v.get("peak_memory_bytes"), v.get("device_memory_bytes")
            cells = [case["config"], case["system"], str(case["atoms"]), key,
                     (v.get("not_run") or v.get("steps_not_run", {}).get("time") or "—") if t is None
                     else f"{t['median_ms']:.2f}",
                     "—" if t is None else f"{t['p20_ms']:.2f}-{t['p80_ms']:.2f}",
                     report.fmt(ratios[key]["frame"], ".2f"),
                     report.fmt(busy, ".2f"), report.fmt(_gap(v), ".2f"), report.fmt(ratios[key]["busy"], ".2f"),
                     report.fmt(None if peak is None else peak / 2 ** 20, ".0f"),
                     report.fmt(None if held is None else held / 2 ** 20, ".0f"),
                     report.fmt(acc.get("force_max_abs")), report.fmt(acc.get("energy_rel")),
                     report.fmt(_stage_sum(stages, ("edges",)), ".2f"),
                     report.fmt(value_path, ".2f"), report.fmt(rest, ".2f"),
                     report.fmt(md.get("steps_per_s"), ".2f"), report.fmt(md.get("ns_per_day"), ".3f"),
                     report.fmt(ratios[key]["md"], ".2f"), _drift_cell(md)]
            lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {case['config']} / {case['atoms']} atoms: x fastest dp is against {best[0]} ({best[1]:.2f} ms), "
             f"the fastest deepmd-kit variant whose forces are within {FLOAT32_BAND}x the case's most accurate; "
             f"x dp busy against its GPU-busy time, x dp MD against the fastest MD of those variants"
             for case in record["cases"] if (best := fastest_deepmd(case))]
    notes += [f"- {case['config']} / {case['atoms']} atoms: the float64 reference frame ran on the "
              f"{case['reference_device']}" for case in record["cases"] if case.get("reference_device")]
    notes += [f"- {case['config']} / {case['atoms']} atoms, {key}: captured into a "
              f"{'presized' if p['presize'] else 'plain'} pool instead, "
              f"{p['device_memory_bytes'] / 2 ** 20:.0f} MiB from the device (force max abs {p['force_max_abs']:.1e})"
              for case in record["cases"] for key, v in case["variants"].items() if (p := v.get("other_pool"))]
    notes += _drift_notes(record)
    notes += _determinism_notes(record)
    return "\n".join(lines + ([""] + notes if notes else []) + _stage_rows(record) + _not_run_section(record)) + "\n"


def _determinism_notes(record: dict) -> list[str]:
    """Per case, the variants whose frame differs run to run or whose replay differs from its eager
    frame (the largest force difference; variants not named were bitwise)."""
    notes = []
    for case in record["cases"]:
        for field, what in (("run_to_run", "run to run"), ("replay_vs_eager", "replayed against eager")):
            diffs = [f"{key} {d['force']:.1e}" for key, v in case["variants"].items()
                     if (d := v.get(field)) and any(d.values())]
            if diffs:
                notes.append(f"- {case['config']} / {case['atoms']} atoms: frames not bitwise {what} "
                             f"(force max abs): {', '.join(diffs)}")
    return notes


def _drift_notes(record: dict) -> list[str]:
    """Per case, each mixstack variant's |drift| against the smallest of deepmd-kit's variants', in
    standard errors of their difference: within two of them the two drifts are not told apart."""
    notes = []
    for case in record["cases"]:
        drifts = {key: (md["drift_mev_atom_ps"], md["drift_se_mev_atom_ps"])
                  for key, v in case["variants"].items() if (md := v.get("md"))
                  and md.get("drift_mev_atom_ps") is not None and md.get("drift_se_mev_atom_ps") is not None}
        theirs = [(abs(d), key) for key, (d, _) in drifts.items() if key.startswith("dp")]
        if not theirs:
            continue
        anchor = min(theirs)[1]
        d0, se0 = drifts[anchor]
        for key, (d, se) in drifts.items():
            if key.startswith("dp"):
                continue
            excess = (abs(d) - abs(d0)) / max(math.hypot(se, se0), 1e-300)
            verdict = ("no larger" if excess <= 0 else "larger, within two standard errors" if excess <= 2
                       else f"larger by {excess:.1f} standard errors")
            notes.append(f"- {case['config']} / {case['atoms']} atoms: |drift| of {key} {abs(d):.3g} ± {se:.2g} "
                         f"against {anchor}'s {abs(d0):.3g} ± {se0:.2g} meV/atom/ps (deepmd-kit's smallest): "
                         f"{verdict}")
    return notes


def _drift_cell(md: dict) -> str:
    """The drift and, where the record has it, its standard error: ``1.02e-03 ± 4.1e-05``."""
    slope, se = md.get("drift_mev_atom_ps"), md.get("drift_se_mev_atom_ps")
    if slope is None or se is None:
        return report.fmt(slope, ".3g")
    return f"{report.fmt(slope, '.3g')} ± {report.fmt(se, '.2g')}"


def long_rows(record: dict) -> list[dict]:
    rows = []
    cols = report.env_columns(record)
    for case in record["cases"]:
        ratios = against_deepmd(case)
        for key, v in case["variants"].items():
            row = {"config": case["config"], "system": case["system"], "atoms": case["atoms"], "variant": key,
                   **{f"x_dp_{what}": x for what, x in ratios[key].items()},
                   "median_ms": v.get("time", {}).get("median_ms"), "peak_memory_bytes": v.get("peak_memory_bytes"),
                   "device_memory_bytes": v.get("device_memory_bytes"),
                   "busy_ms": v.get("breakdown", {}).get("busy_ms"), "host_gap_ms": _gap(v),
                   **{k: val for k, val in v.get("accuracy", {}).items()}, "not_run": not_run_text(v), **cols}
            for stage, t in v.get("breakdown", {}).get("stages", {}).items():
                row[f"{stage}_forward_ms"], row[f"{stage}_backward_ms"] = t["forward_ms"], t["backward_ms"]
            for stage, t in v.get("breakdown", {}).get("kernels", {}).items():
                row[f"kernels_{stage}"] = t
            for field in ("steps_per_s", "ns_per_day", "drift_mev_atom_ps", "drift_se_mev_atom_ps"):
                row[f"md_{field}"] = v.get("md", {}).get(field)
            rows.append(row)
    return rows


def variants_of(args, config: str) -> tuple[str, ...]:
    """The variants ``config`` runs: its own list (``--variants-for``) or ``--variants``."""
    return (getattr(args, "variants_for", None) or {}).get(config, args.variants)


def run_deepmd_bench(args, device, *, command: str, on_case=None, on_step=None, on_write=None,
                     start: float | None = None) -> dict:
    """Every config x system x size of the parsed ``mixstack bench deepmd`` options ``args`` on
    ``device``: the record.  ``on_case(label)`` before each case; ``on_step(text)`` as each step
    ends and ``on_write(record)``, the record so far, as each starts and ends (``Progress``);
    with ``args.seconds``, no step starts once that many seconds have gone from ``start`` (a
    ``time.monotonic()`` reading, default now): what was not run says why."""
    from ..deepmd.compat import deepmd_pt

    deepmd_pt()
    import deepmd
    seconds = getattr(args, "seconds", None)
    record = {"env": {**env.collect(device), "deepmd_kit": deepmd.__version__}, "command": command,
              "rest_level": args.rest_level, "rounds": args.rounds, "warmup": args.warmup, "seconds": seconds,
              "cases": []}
    progress = Progress(record, seconds=seconds, start=start, on_step=on_step, on_write=on_write)
    ahead = []
    for config_name in args.configs:
        for system in args.systems:
            for atoms in args.atoms:
                case = {"config": config_name, "system": system, "atoms": atoms, "variants": {}}
                record["cases"].append(case)
                label = f"{config_name} / {system} / {atoms} atoms"
                if getattr(args, "build_ahead", False):
                    ahead.append((case, variants_of(args, config_name), label))
                    continue
                if on_case:
                    on_case(label)
                run_case(case, variants_of(args, config_name), args, device, progress)
    if ahead:
        run_cases_built_ahead(ahead, args, device, progress, on_case=on_case)
    return record


def write(record: dict, out, *, with_plot: bool = False) -> dict:
    """``deepmd_bench.json``, ``.md`` and ``.csv`` in ``out`` (the bench draws no plot)."""
    return report.write(record, out, with_plot=with_plot, names=("deepmd_bench.json", "deepmd_bench.md", ""),
                        render_markdown=markdown, render_rows=long_rows)
