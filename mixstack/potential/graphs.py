"""``GraphedFrames``: a potential's frame (energy, forces, ...) replayed from CUDA graphs.

Why: an eager frame launches a few hundred kernels from Python, forward and backward, and at
the bench model's sizes the GPU waits on the host between many of them (BENCHMARKS.md, "The glue
on kernels"; "CUDA graphs and rotate-in's launch").  A CUDA graph records the frame's kernels
once and replays them with one launch.

``GraphedFrames(fn)`` wraps ``fn(*tensors) -> tuple of tensors`` (``SO2Potential.forward``, or
the bench's energy + forces frame).  A call with CUDA tensors looks up the graph of its
signature (every input's shape, dtype and device, and the dispatch level): on first sight it
runs ``fn`` ``warmup`` times eagerly on a side stream (so that Triton compiles, tuning-table
lookups and level 3's first-use validation happen outside the capture), then captures one call;
later calls copy the inputs into the graph's static tensors, replay, and return clones of its
outputs.  A graph keeps the memory of one frame (its own pool).  At most ``max_graphs`` graphs
are kept (default one): a new signature releases the least recently used graph *before* it is
captured, so a molecular-dynamics run whose edge capacity grows holds one frame's memory, not
one per capacity it went through.  (Graphs of different sizes gain nothing from sharing a
pool: the larger frame's tensors do not fit in the smaller one's freed blocks, so a shared pool
grows by a frame at every growth of the capacity.)  A released pool is returned to the device
by the caching allocator when it needs the memory.

What ``fn`` must satisfy (the potential's frame does: the neighbour list is an input): no host
synchronisation and no host-to-device copy inside the frame, and results that depend on the
inputs' values only through tensor operations.  A molecular-dynamics run keeps the signature
fixed between neighbour-list rebuilds only if the edge count is: ``verlet.VerletList`` pads the
kept edges to a multiple of ``edge_quantum`` with pairs beyond the cutoff, which the envelope
zeroes exactly.

A graph reads the module's parameters and buffers where they were at the capture: updates in
place (``load_state_dict``, an optimizer step) are seen by the next replay; a module moved to
another device or dtype, or rebuilt, needs a new ``GraphedFrames``.

CPU inputs run ``fn`` eagerly.  A capture that fails (an op that cannot be captured) warns once
and runs ``fn`` eagerly from then on; ``fallback_reason`` says why.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import Callable, NamedTuple

import torch

from ..dispatch.levels import get_level

log = logging.getLogger(__name__)


class _Graph(NamedTuple):
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]


class GraphedFrames:
    """``GraphedFrames(fn)(*inputs)``: ``fn(*inputs)`` replayed from a CUDA graph (module doc).

    ``captures`` counts the graphs captured, ``replays`` the calls served by a graph."""

    def __init__(self, fn: Callable, *, warmup: int = 2, max_graphs: int = 1):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (the capture must not compile kernels), got {warmup}")
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.fn, self.warmup, self.max_graphs = fn, int(warmup), int(max_graphs)
        self.fallback_reason: str | None = None
        self.captures = self.replays = 0
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()

    def __call__(self, *inputs: torch.Tensor):
        if self.fallback_reason is not None or not _all_cuda(inputs):
            return self.fn(*inputs)
        key = (get_level(),) + tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        entry = self._graphs.get(key)
        if entry is None:
            while len(self._graphs) >= self.max_graphs:     # release before the new capture allocates
                self._graphs.popitem(last=False)
            try:
                entry = self._capture(inputs)
            except Exception as exc:                # an op that cannot be captured: run eagerly
                self.fallback_reason = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"mixstack: the frame could not be captured as a CUDA graph and runs "
                              f"eagerly ({self.fallback_reason})", RuntimeWarning, stacklevel=2)
                self._graphs.clear()
                return self.fn(*inputs)
            self._graphs[key] = entry
        else:
            self._graphs.move_to_end(key)
        for static, value in zip(entry.inputs, inputs):
            static.copy_(value)
        entry.graph.replay()
        self.replays += 1
        return tuple(t.clone() for t in entry.outputs)

    def _capture(self, inputs) -> _Graph:
        device = inputs[0].device
        static = tuple(t.detach().clone() for t in inputs)
        for _ in range(self.warmup):
            run_on_capture_stream(self.fn, *static)
        graph = torch.cuda.CUDAGraph()
        # captured on the warm-up's stream: each stream that runs a cuBLAS product gets its own
        # workspace (tens of MiB), and one stream of our own is enough
        with torch.cuda.graph(graph, stream=capture_stream(device)):
            outputs = self.fn(*static)
        outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
        if not all(torch.is_tensor(t) for t in outputs):
            raise TypeError("the frame must return tensors to be replayed from a graph")
        self.captures += 1
        log.info("captured a frame graph for %s", [tuple(t.shape) for t in inputs])
        return _Graph(graph, static, tuple(t.detach() for t in outputs))


_streams: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per device that every ``GraphedFrames`` warms up and captures on:
    cuBLAS keeps a workspace per stream it runs on (tens of MiB), so a new stream per capture
    would keep one more workspace at every recapture."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(index)
    return _streams[index]


def presized_pool(device: torch.device, nbytes: int):
    """``(pool, seed)``: a CUDA graph memory pool that already holds one free block of ``nbytes``
    on the capture stream, for ``torch.cuda.graph(..., pool=pool)``.  A capture into it splits
    its tensors from that block, whose freed pieces merge again, where a capture into a fresh pool
    adds one segment for every request no free block fits (segments never merge).  ``seed`` is
    the empty graph that allocated the block: keep it until the capture that uses the pool ends."""
    pool = torch.cuda.graph_pool_handle()
    seed = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # "the CUDA Graph is empty": it only allocates
        with torch.cuda.graph(seed, pool=pool, stream=capture_stream(device)):
            block = torch.empty(int(nbytes), dtype=torch.uint8, device=device)
            del block
    return pool, seed


def run_on_capture_stream(fn: Callable, *inputs: torch.Tensor, device: torch.device | None = None):
    """``fn(*inputs)`` eagerly on the capture stream of the inputs' device (or ``device``),
    ordered after the current stream's work and before its next: a capture's warm-up, or a
    caller's first call made where the capture will run (so that the stream's one-time state,
    e.g. its cuBLAS workspace, exists before)."""
    device = inputs[0].device if device is None else device
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        out = fn(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    return out


def graph_replay(fn: Callable[[], object], device, warmup: int = 2) -> Callable[[], None]:
    """``fn`` captured into a CUDA graph on ``device`` after ``warmup`` runs, both on the capture
    stream: the graph's replay, to time the device's work without the host's launches (a replayed
    frame's terms).  ``fn``'s outputs live in the graph's pool and are overwritten by each replay."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"graph_replay needs a CUDA device, got {device}")
    for _ in range(warmup):
        run_on_capture_stream(fn, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream(device)):
        fn()
    return graph.replay


def _all_cuda(inputs) -> bool:
    return bool(inputs) and all(torch.is_tensor(t) and t.is_cuda for t in inputs)
