"""Where a frame's time goes: the device time of each stage of a potential's frame, forward and
backward (``mixstack bench model --breakdown``).

A frame is the energy and ``autograd.grad`` of it, as the model bench times it.  The potential
calls each stage through ``potential.stages.run``; here a runner wraps every stage call in a
profiler range ``stage::<name>``, and, for a compiled variant, compiles each stage on its own
(so every stage is one compiled graph with one backward node, instead of one graph whose
fused kernels span stages).  ``torch.profiler`` then records ``rounds`` frames, and every
operator's self time on the device (CUDA kernel time; on a CPU, its own CPU time) is charged:

- in the forward, to the stage range it ran inside;
- in the backward, to the stage whose forward created the autograd node it ran inside: the
  profiler gives each forward operator a sequence number and each backward node
  (``autograd::engine::evaluate_function: ...``) the sequence number and thread of the forward
  operator that made it, so a backward kernel's stage is its node's forward operator's;
- ``other`` where there is no stage (the embedding, the readout, the sum over atoms).

The numbers add up by construction: the stages and ``other`` sum to the device's busy time
per frame (the sum of every kernel's time; ``unattributed`` holds kernels the profiler tied to
no operator), and ``idle`` is the profiled frame's wall time minus that busy time: launch gaps
and host work the device waited for.  On a CPU the device is the host: Python between
operators is charged to the stage it runs in (``other`` outside the stages), so idle is zero.  The staged frame is
also timed without the profiler, whose overhead per operator is large on a CPU and small on a
GPU.  Per-stage compiling loses the
fusions across stages, so a compiled variant's staged frame is slower than its whole-frame
compile; both times are reported.

The neighbour list is built on the host, outside the frame; the model bench times it per cell
(a fresh list, and the per-step cut of a kept Verlet list).
"""

from __future__ import annotations

import collections
import math
from typing import Callable

import torch

from ..dispatch.levels import use_level
from ..measure.timing import Task, time_interleaved

STAGE_PREFIX = "stage::"
FRAME_RANGE = "mixstack::frame"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
OTHER = "other"
PASSES = ("forward", "backward")


def own_copy(fn: Callable, tag: str) -> Callable:
    """``fn`` with a code object of its own: ``torch.compile`` keeps one cache per code object, and
    the level, read while tracing, is not one of its guards, so each compiled variant needs its own."""
    import types
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _calling(fn):
    def stage_call(*args):
        return fn(*args)
    return stage_call


def staged_frame(model, level: int, compile_stages: bool, tag: str = "staged") -> Callable:
    """``frame(inputs) -> (energy, forces)`` whose stages run inside profiler ranges (and, with
    ``compile_stages``, each under its own ``torch.compile``, cached under ``tag``)."""
    from ..potential import stages
    compiled: dict = {}

    def runner(name, fn, *args):
        if compile_stages:
            key = (id(getattr(fn, "__self__", None)), getattr(fn, "__func__", fn))
            if key not in compiled:
                compiled[key] = torch.compile(own_copy(_calling(fn), f"{tag}_{len(compiled)}"), dynamic=False)
            fn = compiled[key]
        with torch.profiler.record_function(STAGE_PREFIX + name):
            return fn(*args)

    def frame(inp):
        with stages.staged(runner), use_level(level), torch.enable_grad():
            pos = inp.positions.detach().requires_grad_(True)
            energy, _ = model.energy(pos, *inp[1:])
            (grad,) = torch.autograd.grad(energy, pos)
        return energy.detach(), -grad

    return frame


def _stage_of(event):
    """``(stage, backward node)``: the stage range around ``event`` in the forward, or the backward
    node it ran inside (``None`` where it has neither: ``(OTHER, None)``)."""
    e = event
    while e is not None:
        if e.name.startswith(STAGE_PREFIX):
            return e.name[len(STAGE_PREFIX):], None
        if e.name.startswith(BACKWARD_PREFIX):
            return None, e
        e = e.cpu_parent
    return OTHER, None


def attribute(events, device_type: str) -> tuple[dict, float, float]:
    """Charge the self time of every host-side event in ``events`` (a profiler's ``events()``) to
    ``(stage, pass)``.  Returns ``(times µs by (stage, pass), attributed µs, device total µs)``;
    ``device_type`` is ``"cuda"`` (self CUDA time of each operator; the total is every kernel's
    time) or ``"cpu"`` (self CPU time; the total is the attributed time)."""
    from torch.autograd import DeviceType
    host = [e for e in events if e.device_type == DeviceType.CPU]
    forward_stage = {}
    for e in host:
        if e.sequence_nr >= 0:
            stage, node = _stage_of(e)
            if node is None:
                forward_stage.setdefault((e.thread, e.sequence_nr), stage)
    times: dict = collections.defaultdict(float)
    for e in host:
        t = e.self_device_time_total if device_type == "cuda" else e.self_cpu_time_total
        if t <= 0:
            continue
        stage, node = _stage_of(e)
        if node is not None:
            stage = forward_stage.get((node.fwd_thread, node.sequence_nr), OTHER)
            times[(stage, "backward")] += t
        else:
            times[(stage, "forward")] += t
    attributed = sum(times.values())
    total = (kernel_time(events) or attributed) if device_type == "cuda" else attributed
    return dict(times), attributed, max(total, attributed)


def kernel_time(events) -> float:
    """µs of device work in ``events``: every device-side event except the profiler's copies of
    the ranges this module opens (Kineto projects each ``record_function`` range onto the GPU
    timeline as a ``gpu_user_annotation`` spanning its kernels; counting those counted each
    kernel again under the frame and its stage)."""
    from torch.autograd import DeviceType
    return sum(e.device_time for e in events
               if e.device_type == DeviceType.CUDA and not _is_own_range(e.name))


def _is_own_range(name: str) -> bool:
    return name.startswith(STAGE_PREFIX) or name == FRAME_RANGE


def measure(model, inp, key: str, level: int, device, clock, *, rounds: int = 3, warmup: int = 1,
            stage_order=()) -> dict:
    """The breakdown of variant ``key`` (``"0c"``, ``"2"``, ...) on one cell's inputs: the staged
    frame's wall time and the device time of every stage, forward and backward, per frame."""
    compile_stages = key.endswith("c")
    frame = staged_frame(model, level, compile_stages, tag=f"staged_{key}")
    for _ in range(max(warmup, 1)):             # compiles each stage on the first call
        frame(inp)
    samples = time_interleaved({"staged": Task(run=lambda: frame(inp))}, rounds=rounds, warmup=0, clock=clock)
    activities = [torch.profiler.ProfilerActivity.CPU]
    cuda = torch.device(device).type == "cuda"
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(rounds):
            with torch.profiler.record_function(FRAME_RANGE):
                frame(inp)
                if cuda:
                    torch.cuda.synchronize(device)
    events = prof.events()
    times, attributed, total = attribute(events, "cuda" if cuda else "cpu")
    per = 1e-3 / rounds                          # µs over all rounds -> ms per frame
    profiled = sum(e.cpu_time_total for e in events if e.name == FRAME_RANGE) * per
    names = [s for s in stage_order if any((s, p) in times for p in PASSES)]
    names += sorted({s for s, _ in times} - set(names) - {OTHER}) + [OTHER]
    stages = {s: {f"{p}_ms": times.get((s, p), 0.0) * per for p in PASSES} for s in names}
    busy = total * per
    return {"mode": "each stage compiled on its own" if compile_stages else "eager",
            "device_time": "CUDA kernel time" if cuda else "CPU time of the operators",
            "staged_frame_ms": samples["staged"].median * 1e3, "profiled_frame_ms": profiled,
            "busy_ms": busy, "unattributed_ms": (total - attributed) * per, "idle_ms": profiled - busy,
            "rounds": rounds, "stages": stages}


def stage_rows(breakdowns: dict[str, dict], frame_ms: dict[str, float | None]) -> list[dict]:
    """One Markdown row per stage and per total, one column pair (forward / backward ms) per
    variant: ``breakdowns`` by variant name, ``frame_ms`` the variants' timed (whole) frames."""
    variants = list(breakdowns)
    names = list(dict.fromkeys(s for b in breakdowns.values() for s in b["stages"]))

    def cell(x):
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"

    rows = []
    for s in names:
        row = {"stage": s}
        for v in variants:
            st = breakdowns[v]["stages"].get(s)
            row[f"{v} fwd"] = cell(st and st["forward_ms"])
            row[f"{v} bwd"] = cell(st and st["backward_ms"])
        rows.append(row)
    for label, field in (("unattributed kernels", "unattributed_ms"), ("device busy (sum of the above)", "busy_ms"),
                         ("idle (profiled frame − busy)", "idle_ms"), ("profiled frame", "profiled_frame_ms"),
                         ("staged frame, no profiler", "staged_frame_ms")):
        row = {"stage": label}
        for v in variants:
            row[f"{v} fwd"] = cell(breakdowns[v][field])
            row[f"{v} bwd"] = ""
        rows.append(row)
    row = {"stage": "frame as timed"}
    for v in variants:
        row[f"{v} fwd"] = cell(frame_ms.get(v))
        row[f"{v} bwd"] = ""
    rows.append(row)
    return rows
