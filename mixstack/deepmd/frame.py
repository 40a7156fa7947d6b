"""``FrameRunner``: a deepmd-kit SeZM model's frame (energy, forces, virial) at the GPU's pace.

deepmd-kit's own frame, ``model(coord, atype, box)``, builds a compact edge list every call with
host synchronisations and data-dependent shapes, then launches the model op by op from Python;
on a GPU the device waits for the host through much of it.  ``FrameRunner(model)`` runs the same
model from ``forward_common_lower`` on edges it keeps in fixed buffers, and replays everything
after the neighbour search from one CUDA graph:

* **Neighbour list with a skin.**  A candidate list of every pair within ``rcut + skin`` (vesin's
  cell list, sorted by centre, neighbour and image so that it does not depend on the library's
  order), kept while no atom has moved more than ``skin / 2`` and the box is unchanged; then no
  pair can have come from beyond ``rcut + skin`` to within ``rcut``.
* **Static capacity.**  Every frame, on the device, the candidates within ``rcut`` (deepmd-kit's
  own test: ``1e-10 < r^2 <= rcut^2``, both atoms real) are packed in list order into the first
  slots of an edge buffer of fixed capacity; the slots after them are padding edges, masked, that
  contribute exact zeros (deepmd-kit replaces a masked edge's vector by the unit ``z`` vector and
  multiplies its envelope, radial basis and type features by the mask).  No host
  synchronisation, no data-dependent shape.
* **Overflow on the device.**  The frame also computes one flag: more edges within ``rcut``
  than the capacity holds, an atom moved more than half the skin, or the box changed.  The
  runner reads it with the results (the one synchronisation a caller pays anyway to read
  forces); when it is set, the frame's results are discarded, the list is rebuilt and the
  capacity grown where needed, and the frame runs again: edges are never dropped.  Positions
  handed over on the host (an MD code's) are checked there first, against the host copy of the
  list's positions and box: a list gone stale by moves or a new box is rebuilt before the frame
  runs, not after a frame thrown away.
* **Capacity buckets.**  The edge capacity is the count at a rebuild plus 0.5%, rounded up to a
  step of 1/256-1/512 of it (``potential.verlet.edge_capacity``), and shrinks only two steps
  below, so a molecular-dynamics run recaptures only when its edge count really moves; the
  padding is small because every edge-sized tensor of the frame carries it.  Each time a capacity
  must grow (edges, or candidates within ``rcut + skin``) the margin doubles, up to 8x (4%), and a
  capacity is kept until its count falls a whole margin below it (``next_capacity``): a run whose
  counts keep climbing (a system heating up) recaptures a few times, not at every other rebuild.
* **One CUDA graph.**  From the positions to energy, forces and virial: the edge packing,
  ``forward_common_lower`` (deepmd-kit's eager model or its compiled ``core_compute``, with or
  without mixstack's operators) and the force backward.  The graph is captured after two
  eager warm-up frames (Triton compiles, deepmd-kit's autotuning and level 3's first-use checks
  happen there) and recaptured when the atom count or a capacity changes; one graph is kept.
  A recapture for new capacities at the same atoms runs no eager frame (what runs once per shape
  ran at the first capture), and goes into the first capture's pool where the grown capacities'
  peak fits it (the pool holds the measured peak plus 3%): releasing a pool and mapping a new
  block was most of a recapture's host time for a large frame.

Limits: one frame per call (``nf = 1``); no ``fparam`` / ``aparam`` / spin inputs; a model in
evaluation mode; a box is periodic in all three directions (deepmd-kit's convention), no box is
an open system.  On a CPU (or with ``graph=False``) the same frame runs eagerly.
"""

from __future__ import annotations

import collections
import logging
import time
import warnings
from typing import NamedTuple

import torch

from ..potential.graphs import capture_stream, presized_pool, run_on_capture_stream
from ..potential.verlet import edge_capacity

log = logging.getLogger(__name__)

OUTPUTS = ("energy", "force", "virial", "atom_energy")
REDUCED = ("energy", "virial")       # kept in deepmd-kit's energy precision, as its own forward does
MIN_LENGTH2 = 1e-10                  # deepmd-kit's own floor: shorter pairs are no edges
CAPACITY_HEADROOM = 1.005            # the edge capacity asked for, over the count at a rebuild
MAX_GROWTHS = 3                      # a capacity that must grow doubles the headroom, up to 2^3 x:
                                     # a climbing count (a heating MD run) stops recapturing within a few
EVENTS_KEPT = 256                    # rebuilds and captures FrameRunner.events keeps (the latest)
CAPACITY_STEPS = 256                 # capacities round up to 1/256-1/512 of the count: every edge-sized
                                     # tensor of the frame is padded by this much
PEAK_SLACK = 1.02                    # a recapture's pool: the measured peak scaled to the new capacities, plus this
POOL_ROOM = 1.03                     # a measured capture's pool: its peak plus this, so that the capacities' first
                                     # growths are captured into the same pool (no release, no new block)
# the frame's flag: why its results cannot stand (bits), and what a rebuild says of each
OVERFLOW, MOVED, BOX = 1, 2, 4
WHY = {OVERFLOW: "more edges within the cutoff than the capacity", MOVED: "an atom moved more than half the skin",
       BOX: "the box changed"}


def _growth(measured_at: tuple, capacities: tuple) -> float:
    """The largest growth of a capacity since ``measured_at`` (1 where none grew)."""
    return max([new / old for new, old in zip(capacities, measured_at) if old > 0] + [1.0])


def scaled_peak(peak: int, measured_at: tuple, capacities: tuple) -> int:
    """The pool a recapture asks for without running a frame to measure it: ``peak`` (bytes,
    measured at the capacities ``measured_at``) times the largest growth of a capacity, with
    ``PEAK_SLACK``.  A frame's buffers grow with its edge and candidate counts; a pool that turns
    out short only adds a segment (the plain pool's behaviour), so the estimate costs no result."""
    return int(peak * _growth(measured_at, capacities) * PEAK_SLACK)


def keeps_pool(pool_bytes: int, peak: int, measured_at: tuple, capacities: tuple) -> bool:
    """Whether a recapture at ``capacities`` goes into the kept pool of ``pool_bytes``: the peak
    measured at ``measured_at``, scaled to them, fits it (without ``PEAK_SLACK``: a kept pool that
    turns out short adds a segment, as any pool does).  Releasing a pool and taking a new block
    from the device is most of a recapture's host time for a large frame (a synchronisation, the
    old block freed, the new one mapped)."""
    return pool_bytes > 0 and peak * _growth(measured_at, capacities) <= pool_bytes


def next_capacity(count: int, previous: int, room: float, *, steps: int = 32) -> int | None:
    """The capacity for ``count`` after ``previous`` (0: none yet) with the margin ``room``:
    ``previous`` while ``count`` fits it with ``CAPACITY_HEADROOM`` and, with the margin, is not a
    whole margin and two steps below it (a count that wanders does not change the shapes), a
    smaller one below that; ``None`` where it must grow (the caller widens the margin first)."""
    if previous and count * CAPACITY_HEADROOM > previous:
        return None
    asked = max(int(count * room), 1)
    if previous and asked > previous * (2 - room):   # fits, within a margin of it: kept
        return previous
    return edge_capacity(asked, previous or None, steps=steps)    # kept within two steps, else shrunk


class Candidates(NamedTuple):
    """The kept neighbour list, padded to its capacity: ``src``/``dst`` the neighbour ``j`` and the
    centre ``i``, ``shifts`` the integer image shifts (``r_ij = x_j - x_i + S @ cell``), ``valid``
    the real entries, ``pos0``/``box0`` the positions and box it was built at."""

    src: torch.Tensor
    dst: torch.Tensor
    shifts: torch.Tensor
    valid: torch.Tensor
    pos0: torch.Tensor
    box0: torch.Tensor


def _check_model(model) -> None:
    if type(model).__module__.startswith("deepmd.pt_expt."):
        raise TypeError(f"model is a deepmd-kit PT-expt model ({type(model).__name__}); FrameRunner runs the "
                        "PyTorch backend's SeZM models (deepmd.pt.model.model.get_model): accelerate a PT-expt "
                        "model with mixstack.deepmd.accelerate, or freeze it with dp --pt-expt freeze")
    for name in ("forward_common_lower", "get_rcut"):
        if not callable(getattr(model, name, None)):
            raise TypeError(f"model must be a deepmd-kit model with {name}() (a SeZM / DPA4 energy model), "
                            f"got {type(model).__name__}")
    if model.training:
        raise ValueError("model is in training mode; FrameRunner runs a model in evaluation (call model.eval())")
    for getter, what in (("get_dim_fparam", "frame parameters (fparam)"), ("get_dim_aparam", "atomic parameters")):
        fn = getattr(model, getter, None)
        if callable(fn) and fn() > 0:
            raise ValueError(f"model takes {what}, which FrameRunner does not pass")


def search(pos: torch.Tensor, box: torch.Tensor | None, cutoff: float):
    """Every ordered pair within ``cutoff``: ``(i, j, S)`` int64 on ``pos``'s device, sorted by
    centre ``i``, then neighbour ``j``, then image ``S`` (vesin's cell list; a host search by
    ``mixstack.potential.neighbors`` where ``vesin.torch`` is missing)."""
    device = pos.device
    try:
        import vesin.torch as vesin_torch
    except ImportError:
        vesin_torch = None
    if vesin_torch is not None:
        cell = box.view(3, 3) if box is not None else torch.zeros(3, 3, dtype=pos.dtype, device=device)
        with torch.device(device):
            i, j, s = vesin_torch.NeighborList(cutoff=float(cutoff), full_list=True).compute(
                points=pos.detach(), box=cell.detach(), periodic=box is not None, quantities="ijS")
        i, j, s = i.to(torch.int64), j.to(torch.int64), s.to(torch.int64).reshape(-1, 3)
    else:
        from ..potential.neighbors import _pairs
        cell = (box.view(3, 3) if box is not None else torch.zeros(3, 3)).detach().double().cpu().numpy()
        i, j, s = (torch.as_tensor(a, device=device) for a in
                   _pairs(pos.detach().double().cpu().numpy(), cell, [box is not None] * 3, cutoff))
    if i.numel() == 0:
        return i, j, s.reshape(0, 3)
    span = 2 * int(s.abs().max()) + 1
    key = i * pos.shape[0] + j
    for axis in range(3):
        key = key * span + (s[:, axis] + span // 2)
    order = torch.sort(key, stable=True).indices
    return i[order], j[order], s[order]


def edge_inputs(model, coord, atype, box=None) -> tuple:
    """``forward_common_lower``'s edge-level inputs from deepmd-kit's own edge list:
    ``(coord, atype, edge_index, edge_vec, edge_scatter_index, edge_mask)``."""
    nf = atype.shape[0] if atype.dim() > 1 else 1
    s = model.build_neighbor_list(coord.reshape(nf, -1, 3), atype.reshape(nf, -1), box)
    return s.coord, s.atype, s.edge_index, s.edge_vec, s.edge_scatter_index, s.edge_mask


def warm_eager(model, coord, atype, box=None) -> None:
    """One eager frame of ``model`` from deepmd-kit's own edge list (``forward_common_lower`` with
    its compiled path off): what runs before a compiled model is traced, so that first-use work
    that cannot run on a trace's fake tensors (mixstack level 3's float64 check) happens here."""
    with torch.enable_grad():
        model.forward_common_lower(*edge_inputs(model, coord, atype, box), use_compile=False)


class FrameRunner:
    """``FrameRunner(model)(coord, atype, box=None) -> {"energy", "force", "virial", "atom_energy"}``:
    ``model(coord, atype, box)``'s outputs for one frame, computed from a kept neighbour list
    with a skin and, on a GPU, replayed from a CUDA graph (the module docstring).

    ``skin`` (Å, default 1): the candidate list's margin; ``0`` searches every call.  ``graph``:
    replay from a CUDA graph (default: on CUDA).  ``compile``: run deepmd-kit's compiled
    ``core_compute`` (its ``DP_COMPILE_INFER`` path; default: what the model was built with).
    ``presize``: capture into a pool that holds the frame's peak in one block first
    (``potential.graphs.presized_pool``; one more warm-up frame measures the peak and resets the
    device's peak-memory statistics); on by default: the plain pool adds a segment for each
    request no free block fits and took 0.91x the device memory on an H100 (BENCHMARKS.md).
    The block holds the peak with ``POOL_ROOM``, and a recapture for capacities that grew by
    less goes into the same pool (``keeps_pool``).
    Counters: ``calls``, ``rebuilds``, ``captures``, ``replays``, ``growths`` (times a capacity had
    to grow: the headroom doubles each time, up to ``MAX_GROWTHS``); ``seconds``: host wall time
    spent in ``"rebuild"`` (searches, with their read-back of the count) and ``"capture"`` (the
    warm-up frames and the capture); ``events``: the last ``EVENTS_KEPT`` rebuilds and captures,
    each a dict (``call``, ``what``, its ``seconds``; a rebuild's ``reason``, counts and
    capacities); ``last_reason`` why the last
    rebuild happened; ``edge_capacity`` and ``candidate_capacity`` the buffers' sizes;
    ``fallback_reason`` why frames run eagerly although a graph was asked for (a capture that
    failed: the runner warns once and goes on eagerly), else ``None``.  Inputs may live anywhere:
    they go to the model's device (``device``), and the outputs live there."""

    def __init__(self, model, *, skin: float = 1.0, graph: bool | None = None, compile: bool | None = None,
                 presize: bool = True):
        _check_model(model)
        if not skin >= 0:
            raise ValueError(f"skin must be >= 0 Å, got {skin}")
        if graph and not torch.cuda.is_available():
            raise ValueError("graph=True needs CUDA (CUDA graphs); use graph=None or False on a CPU")
        self.model, self.skin, self.graph, self.compile = model, float(skin), graph, compile
        self.presize = bool(presize)
        self.rcut = float(model.get_rcut())
        self.dtype = model.global_pt_float_precision
        self.device = next(model.parameters()).device
        self.calls = self.rebuilds = self.captures = self.replays = 0
        self.seconds = {"rebuild": 0.0, "capture": 0.0}
        self.events: collections.deque = collections.deque(maxlen=EVENTS_KEPT)
        self.last_reason: str | None = None
        self.edge_capacity = self.candidate_capacity = 0
        self.growths = 0            # times a capacity had to grow (MAX_GROWTHS at most): the headroom's doublings
        self._cand: Candidates | None = None
        self._buffers = 0                            # new buffers so far: a graph reads one set of them
        self._periodic: bool | None = None
        self._pad: torch.Tensor | None = None
        self._static = None         # (pos, box, atype) the graph reads, and its outputs
        self._graph = None
        self._graph_key = None
        self._peak = None           # (bytes, capacities) of the last measured frame peak, for the same atoms
        self._pool = None           # (pool, the empty graph that keeps it, its bytes): the presized pool, kept
        self._warmed = False
        self.fallback_reason: str | None = None      # why frames run eagerly where a graph was asked for
        self._host0 = None          # (positions, box) the list was built at, on the host, where inputs come from there
        self._host0_rebuilds = 0    # the rebuild count _host0 belongs to

    # -- the frame itself: tensors in, tensors out, no host synchronisation -----------------------

    def _pairs(self, pos, box, atype, cand: Candidates):
        """Every candidate's vector and whether it is an edge now (deepmd-kit's own test)."""
        vec = pos.index_select(0, cand.src) - pos.index_select(0, cand.dst)
        if box is not None:
            vec = vec + (cand.shifts[:, :, None] * box.view(3, 3)).sum(1)
        r2 = (vec * vec).sum(-1)
        keep = cand.valid & (r2 > MIN_LENGTH2) & (r2 <= self.rcut * self.rcut)
        keep = keep & (atype.index_select(0, cand.src) >= 0) & (atype.index_select(0, cand.dst) >= 0)
        return vec, keep

    def _pack(self, vec, keep, cand: Candidates):
        """The edges within the cutoff in the first slots of a ``edge_capacity`` buffer, in list
        order; padding after them; and whether they overflowed it."""
        cap = self.edge_capacity
        slot = torch.cumsum(keep, 0) - 1
        overflow = slot[-1] >= cap
        target = torch.where(keep & (slot < cap), slot, cap)
        pick = torch.full((cap + 1,), -1, dtype=torch.long, device=vec.device)
        pick.scatter_(0, target, torch.arange(keep.numel(), device=vec.device))
        pick = pick[:cap]
        used = pick >= 0
        safe = pick.clamp(min=0)
        src = torch.where(used, cand.src.index_select(0, safe), self._pad)
        dst = torch.where(used, cand.dst.index_select(0, safe), self._pad)
        edge_vec = torch.where(used.unsqueeze(1), vec.index_select(0, safe), vec.new_zeros(()))
        return torch.stack((src, dst)), edge_vec, used, overflow

    def frame(self, pos, box, atype, use_compile: bool | None = None):
        """One frame on the kept list: ``(energy (1, 1), force (1, N, 3), virial (1, 9), atom_energy
        (1, N, 1), flag ())``, ``flag`` non-zero where the results cannot stand: ``OVERFLOW``, ``MOVED``,
        ``BOX`` bits (module docstring)."""
        cand = self._cand
        with torch.profiler.record_function("stage::edges"):
            vec, keep = self._pairs(pos, box, atype, cand)
            edge_index, edge_vec, mask, overflow = self._pack(vec, keep, cand)
            moved = ((pos - cand.pos0) ** 2).sum(-1).amax() > (0.5 * self.skin) ** 2
            flag = overflow.int() * OVERFLOW + moved.int() * MOVED
            if box is not None:
                flag = flag + (box != cand.box0).any().int() * BOX
        n = pos.shape[0]
        ret = self.model.forward_common_lower(pos.unsqueeze(0), atype.unsqueeze(0), edge_index, edge_vec,
                                              edge_index, mask,
                                              use_compile=self.compile if use_compile is None else use_compile)
        return (ret["energy_redu"].view(1, 1), ret["energy_derv_r"].view(1, n, 3),
                ret["energy_derv_c_redu"].view(1, 9), ret["energy"].view(1, n, 1), flag)

    # -- the host side: inputs, rebuilds, the graph ------------------------------------------------

    def _inputs(self, coord, atype, box):
        one_frame = (coord.dim() == 3 and coord.shape[0] == 1 and coord.shape[2] == 3) or \
            (coord.dim() == 2 and (coord.shape[1] == 3 or coord.shape[0] == 1 and coord.shape[1] % 3 == 0))
        if not one_frame:
            raise ValueError(f"FrameRunner runs one frame a call: coord must be (1, N, 3), (N, 3) or (1, 3N), "
                             f"got {tuple(coord.shape)}")
        pos = coord.reshape(-1, 3).to(device=self.device, dtype=self.dtype)       # where the model is
        n = pos.shape[0]
        atype = atype.reshape(-1).to(device=pos.device, dtype=torch.long)
        if atype.numel() != n:
            raise ValueError(f"atype must hold one type per atom ({n}), got shape {tuple(atype.shape)}")
        if box is not None:
            if box.numel() != 9:
                raise ValueError(f"box must hold the 3 x 3 cell of one frame, got shape {tuple(box.shape)}")
            box = box.reshape(9).to(device=pos.device, dtype=self.dtype)
        return pos, box, atype

    def _rebuild(self, pos, box, atype, reason: str) -> None:
        """A new candidate list at ``pos``, its capacity and the edge capacity for its count now."""
        start = time.perf_counter()
        i, j, s = search(pos, box, self.rcut + self.skin)
        same = self._cand is not None and self._cand.pos0.shape == pos.shape and self._periodic == (box is not None)
        if not same:
            self.growths = 0
        grew = False

        def capacity(count, previous, **steps):     # where one must grow, the margin doubles (once a rebuild)
            nonlocal grew
            kept = next_capacity(count, previous if same else 0, self._room(), **steps)
            if kept is None:
                if not grew:
                    grew, self.growths = True, min(self.growths + 1, MAX_GROWTHS)
                kept = edge_capacity(max(int(count * self._room()), 1), **steps)
            return kept

        cap = capacity(i.numel(), self.candidate_capacity)
        dev, n = pos.device, pos.shape[0]
        src = torch.zeros(cap, dtype=torch.long, device=dev)
        dst = torch.zeros(cap, dtype=torch.long, device=dev)
        shifts = torch.zeros(cap, 3, dtype=self.dtype, device=dev)
        valid = torch.zeros(cap, dtype=torch.bool, device=dev)
        m = i.numel()
        src[:m], dst[:m], shifts[:m], valid[:m] = j, i, s.to(self.dtype), True
        box0 = box.clone() if box is not None else torch.zeros(9, dtype=self.dtype, device=dev)
        fresh = Candidates(src, dst, shifts, valid, pos.clone(), box0)
        inside = int(self._pairs(pos, box, atype, fresh)[1].sum())
        edges = capacity(inside, self.edge_capacity, steps=CAPACITY_STEPS)
        in_place = same and cap == self.candidate_capacity and edges == self.edge_capacity
        if in_place:
            for old, new in zip(self._cand, fresh):          # in place: a captured graph reads these
                old.copy_(new)
        else:
            self._cand, self.candidate_capacity, self.edge_capacity = fresh, cap, edges
            self._buffers += 1
            self._pad = torch.arange(edges, device=dev) % n
            self._periodic = box is not None
        self.rebuilds += 1
        self.last_reason = reason
        spent = time.perf_counter() - start
        self.seconds["rebuild"] += spent
        self.events.append({"call": self.calls, "what": "rebuild", "reason": reason, "seconds": round(spent, 5),
                            "candidates": m, "edges": inside, "candidate_capacity": self.candidate_capacity,
                            "edge_capacity": self.edge_capacity, "new_buffers": not in_place})
        log.debug("neighbour list rebuilt (%s): %d candidates, %d edges, capacities %d / %d",
                  reason, m, inside, cap, edges)

    def _room(self) -> float:
        """The capacities asked for over the counts: ``CAPACITY_HEADROOM``'s margin, doubled for
        each time a capacity had to grow since the atoms or periodicity last changed."""
        return 1 + (CAPACITY_HEADROOM - 1) * 2 ** self.growths

    def _host_inputs(self, coord, box):
        """``(positions (N, 3), box (9,) or None)`` in the model's precision on the host, where the
        caller handed them over there (else ``None``): what ``_stale_on_host`` compares."""
        if coord.device.type != "cpu" or (box is not None and box.device.type != "cpu"):
            return None
        return (coord.reshape(-1, 3).to(self.dtype, copy=True),          # copies: the caller may reuse its tensors
                None if box is None else box.reshape(9).to(self.dtype, copy=True))

    def _stale_on_host(self, host) -> str | None:
        """Why the kept list cannot serve positions ``host`` (``_host_inputs``), judged on the host
        as the frame's flag judges it on the device: an atom moved more than half the skin, or the
        box changed; ``None`` where it can (or where the list has no host copy)."""
        if host is None or self._host0 is None or host[0].shape != self._host0[0].shape:
            return None
        (pos, box), (pos0, box0) = host, self._host0
        if ((pos - pos0) ** 2).sum(-1).amax() > (0.5 * self.skin) ** 2:
            return WHY[MOVED]
        if box is not None and box0 is not None and bool((box != box0).any()):
            return WHY[BOX]
        return None

    def _use_graph(self, pos) -> bool:
        return self.fallback_reason is None and (pos.is_cuda if self.graph is None else bool(self.graph))

    def _capacities(self) -> tuple:
        return (self.edge_capacity, self.candidate_capacity)

    def _capture(self, pos, box, atype, warmups: int = 2, measure: bool = True):
        """Capture the frame at these inputs: ``warmups`` eager frames first; with ``presize``, a
        pool of the frame's peak, measured by one more eager frame, or where ``measure`` is false
        and a peak was measured before at other capacities, that peak scaled to these
        (``scaled_peak``: a recapture for grown capacities then runs no eager frame at all)."""
        start = time.perf_counter()
        self._graph = self._static = None                   # the old graph's tensors go back to its pool
        scaled = self.presize and not measure and self._peak is not None
        kept = scaled and self._pool is not None and keeps_pool(self._pool[2], *self._peak, self._capacities())
        if not kept:
            self._pool = None                               # released before a new one is taken
        static = (pos.clone(), None if box is None else box.clone(), atype.clone())
        for _ in range(warmups):                            # compiles, autotuning, first-use checks
            run_on_capture_stream(self.frame, *static)
        pool = None
        if kept:
            pool, how = self._pool[0], "kept"
        elif self.presize:                                  # the frame's peak, in one block
            if scaled:
                nbytes, how = scaled_peak(*self._peak, self._capacities()), "scaled"
            else:
                resident = torch.cuda.memory_allocated(pos.device)
                torch.cuda.reset_peak_memory_stats(pos.device)
                run_on_capture_stream(self.frame, *static)
                peak = torch.cuda.max_memory_allocated(pos.device) - resident
                self._peak = (peak, self._capacities())
                nbytes, how = int(peak * POOL_ROOM), "measured"
            pool, seed = presized_pool(pos.device, nbytes)
            self._pool = (pool, seed, nbytes)              # the seed graph keeps the pool across recaptures
        graph = torch.cuda.CUDAGraph()
        entered = time.perf_counter()
        with torch.cuda.graph(graph, pool=pool, stream=capture_stream(pos.device)):
            recording = time.perf_counter()
            outputs = self.frame(*static)
            recorded = time.perf_counter()
        done = time.perf_counter()
        self._graph, self._static = graph, (static, outputs)
        self.captures += 1
        spent = done - start
        self.seconds["capture"] += spent
        # where a capture's host time goes: warm-ups and the pool, torch's entry (a synchronisation and
        # its caches emptied), recording the launches, ending the capture (the graph instantiated)
        event = {"call": self.calls, "what": "capture", "warmups": warmups, "seconds": round(spent, 5),
                 "before_s": round(entered - start, 5), "enter_s": round(recording - entered, 5),
                 "record_s": round(recorded - recording, 5), "instantiate_s": round(done - recorded, 5)}
        if self.presize:
            event["pool"] = how
        self.events.append(event)

    def _run(self, pos, box, atype):
        if not self._use_graph(pos):
            return self.frame(pos, box, atype)
        key = (pos.shape[0], box is None, self._buffers)
        if self._graph is None or key != self._graph_key:
            # new buffers for the same atoms: compiled and checked already, so no eager frame where a
            # measured peak sizes the pool (one, the presize frame, where none was measured; one
            # warm-up without presize); should that capture fail, once more the first capture's way
            again = self._graph_key is not None and self._graph_key[:2] == key[:2]
            if not again:
                self._peak = None
            tries = [dict(warmups=0 if self.presize else 1, measure=False)] if again else []
            tries.append(dict(warmups=2, measure=True))
            for n, how in enumerate(tries, 1):
                try:
                    self._capture(pos, box, atype, **how)
                    break
                except Exception as exc:                   # an op that cannot be captured: the next try, else eager
                    torch.cuda.synchronize(pos.device)
                    self._graph = self._static = None
                    if n < len(tries):
                        log.debug("recapture without a warm-up failed (%s); warming up first", exc)
                        continue
                    self._pool = None
                    self.fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    warnings.warn(f"mixstack: FrameRunner could not capture the frame as a CUDA graph and runs it "
                                  f"eagerly ({self.fallback_reason})", RuntimeWarning, stacklevel=3)
                    return self.frame(pos, box, atype)
            self._graph_key = key
        (s_pos, s_box, s_atype), outputs = self._static
        s_pos.copy_(pos)
        s_atype.copy_(atype)
        if box is not None:
            s_box.copy_(box)
        self._graph.replay()
        self.replays += 1
        return outputs

    def __call__(self, coord: torch.Tensor, atype: torch.Tensor, box: torch.Tensor | None = None) -> dict:
        """``model(coord, atype, box)``'s energy, forces, virial and atomic energies for one frame."""
        in_dtype = coord.dtype
        host_box = box
        pos, box, atype = self._inputs(coord, atype, box)               # checked: then the host copies
        host = self._host_inputs(coord, host_box)
        self.calls += 1
        with torch.no_grad():
            if self._cand is None or self._cand.pos0.shape[0] != pos.shape[0] or self._periodic != (box is not None):
                self._rebuild(pos, box, atype, "no list yet" if self._cand is None else "the atoms changed")
            elif self.skin == 0:
                self._rebuild(pos, box, atype, "skin 0: a search every frame")
            elif (why := self._stale_on_host(host)) is not None:
                self._rebuild(pos, box, atype, why)
        if not self._warmed and (self.compile or self.compile is None and self.model.should_use_compile()):
            with torch.enable_grad():                      # level 3's first-use checks before the trace
                self.frame(pos, box, atype, use_compile=False)
        self._warmed = True
        for _ in range(3):
            with torch.enable_grad():                      # the forces are a backward inside the frame
                *outputs, flag = self._run(pos, box, atype)
            if self._host0_rebuilds != self.rebuilds:      # a list built at these positions
                self._host0, self._host0_rebuilds = host, self.rebuilds
            bits = int(flag)
            if not bits:
                return {name: t.detach().clone() if name in REDUCED else t.detach().to(in_dtype, copy=True)
                        for name, t in zip(OUTPUTS, outputs)}
            with torch.no_grad():
                self._rebuild(pos, box, atype, "; ".join(why for bit, why in WHY.items() if bits & bit))
        raise RuntimeError("FrameRunner: the neighbour list went stale three times in one frame")
