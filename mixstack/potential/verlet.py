"""A Verlet neighbour list with a skin: rebuilt only when it may have gone stale, exact every call.

``VerletList(cutoff, skin)`` builds the list of ``neighbors.neighbor_arrays`` at
``cutoff + skin`` and keeps it while no atom has moved more than ``skin / 2`` since it was
built (then no pair can have come from beyond ``cutoff + skin`` to within ``cutoff``), the cell,
the periodic directions and the atomic numbers being unchanged; anything else rebuilds it.
Every call then keeps, on the model's device, the pairs of the kept list that are within
``cutoff`` now, in the list's order (centre, neighbour, shift), and builds ``slots`` for them: the
six tensors are those ``neighbors.system_inputs`` would build from scratch, so a model gives
the same results as with a fresh list, without the skin's extra pairs (at a 1 Å skin and a
5 Å cutoff, 73% more) costing it anything.  A pair closer than
``neighbors.MIN_EDGE_LENGTH`` raises ``ZeroLengthEdgeError`` on any call.

``pad=True`` keeps the input shapes still from step to step, for a frame replayed from a CUDA
graph (``graphs.GraphedFrames``): the kept edges are padded to ``edge_capacity`` edges with pairs
of the list that lie beyond the cutoff, in list order (so edges stay sorted by centre) and evenly
spaced over it (so every centre gets about ``pads / atoms`` of them: the widest centre, which
sets the width of ``slots``, is barely wider than without pads, whatever pairs a rebuild brings),
and ``slots`` to a multiple of ``SLOT_QUANTUM`` columns with ``SLOT_QUANTUM`` spare (a centre
gaining a few neighbours does not widen it).  The potential's envelope is
exactly zero beyond the cutoff, so those pairs change no energy, force or stress.  The capacity
grows when the edge count outgrows it and shrinks only when the count falls two steps (~3-6%)
below it, and ``slots`` only widens, so shapes hold through neighbour-list rebuilds too.  Where
the list has too few such pairs the edges are not padded.
"""

from __future__ import annotations

import numpy as np
import torch

from .neighbors import MIN_EDGE_LENGTH, SystemInputs, centre_slots, check_edge_lengths, host_arrays, neighbor_arrays

SLOT_QUANTUM = 8


def _capacity_step(n: int, steps: int = 32) -> int:
    return max(256, 1 << max(0, int(n).bit_length() - int(steps).bit_length()))


def edge_capacity(n: int, previous: int | None = None, *, steps: int = 32) -> int:
    """The padded edge count for ``n`` edges: ``n`` rounded up to a step of 1/steps-1/(2 steps)
    of it (``steps`` a power of two; the step at least 256), or ``previous`` while ``n`` fits it
    and is not two steps below it (so that a count wandering across a step does not change the
    shapes back and forth)."""
    if steps < 1 or steps & (steps - 1):
        raise ValueError(f"steps must be a power of two >= 1, got {steps}")
    step = _capacity_step(n, steps)
    if previous is not None and previous - 2 * step < n <= previous:
        return previous
    return -(-int(n) // step) * step


class VerletList:
    """``VerletList(cutoff, skin)(positions, cell, pbc, numbers) -> SystemInputs``.

    ``rebuilds`` counts the lists built, ``calls`` the calls; ``last_reason`` says why the last
    call rebuilt (``None`` where it kept the list).  ``skin = 0`` rebuilds on every call.
    """

    def __init__(self, cutoff: float, skin: float = 1.0, *, device=None, dtype=torch.float32, pad: bool = False):
        if cutoff <= 0:
            raise ValueError(f"cutoff must be > 0, got {cutoff}")
        if skin < 0:
            raise ValueError(f"skin must be >= 0, got {skin}")
        self.cutoff, self.skin, self.pad = float(cutoff), float(skin), bool(pad)
        self.device, self.dtype = torch.device(device or "cpu"), dtype
        self.rebuilds = self.calls = 0
        self.last_reason: str | None = None
        self._built = None          # (positions, cell, pbc, numbers) of the last build
        self._pairs = None          # (edge_index (2, E') int64, shifts (E', 3) float64) on the device
        self._padded = (None, 1)    # with pad: the last edge capacity and slots width

    def rebuild_reason(self, positions, cell, pbc, numbers) -> str | None:
        """Why the kept list cannot serve these inputs (numpy arrays), or ``None`` when it can."""
        if self._built is None:
            return "no list yet"
        pos0, cell0, pbc0, num0 = self._built
        if not np.array_equal(num0, numbers):
            return "the atoms changed"
        if not np.array_equal(pbc0, pbc):
            return "the periodic directions changed"
        if not np.array_equal(cell0, cell):
            return "the cell changed"
        moved = float(np.sqrt(((positions - pos0) ** 2).sum(1).max()))
        if self.skin == 0 or moved > 0.5 * self.skin:
            return f"an atom moved {moved:.3g} Å, more than half the skin ({0.5 * self.skin:g} Å)"
        return None

    def __call__(self, positions, cell, pbc, numbers) -> SystemInputs:
        pos, cel, num = host_arrays(positions, cell, numbers)
        pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)).copy()
        self.calls += 1
        self.last_reason = self.rebuild_reason(pos, cel, pbc, num)
        if self.last_reason is not None:
            edge_index, shifts, _ = neighbor_arrays(pos, cel, pbc, self.cutoff + self.skin)
            self._pairs = (torch.as_tensor(edge_index, device=self.device),
                           torch.as_tensor(shifts, dtype=torch.float64, device=self.device))
            self._built = (pos.copy(), cel.copy(), pbc, num.copy())
            self.rebuilds += 1
        return self._within_cutoff(pos, cel, num)

    def _within_cutoff(self, pos, cel, num) -> SystemInputs:
        """The kept pairs within the cutoff at ``pos``, and their slots, as ``system_inputs`` has them."""
        dev, n = self.device, pos.shape[0]
        pairs, shifts = self._pairs
        pos64 = torch.as_tensor(pos, device=dev)
        cell64 = torch.as_tensor(cel, device=dev)
        j, i = pairs[0], pairs[1]
        length = torch.linalg.vector_norm(pos64[j] - pos64[i] + shifts @ cell64, dim=-1)
        inside = kept = length < self.cutoff
        if bool((inside & (length < MIN_EDGE_LENGTH)).any()):
            keep = torch.nonzero(inside).squeeze(1)
            check_edge_lengths(length[keep].cpu().numpy(), pairs[1, keep].cpu().numpy(),
                               pairs[0, keep].cpu().numpy(), shifts[keep].cpu().numpy())
        if self.pad:
            # (capacity - inside) pairs beyond the cutoff join the kept ones, evenly spaced over
            # the list (sorted by centre), so each centre gets about as many pads as any other
            n_inside = int(inside.sum())
            need = edge_capacity(n_inside, self._padded[0]) - n_inside
            beyond = torch.nonzero(~inside).squeeze(1)
            if 0 < need <= beyond.numel():
                kept = inside.clone()
                kept[beyond[torch.arange(need, device=dev) * beyond.numel() // need]] = True
        keep = torch.nonzero(kept).squeeze(1)
        edge_index, shifts = pairs[:, keep], shifts[keep]
        slots = centre_slots(edge_index[1], n, multiple=SLOT_QUANTUM if self.pad else 1, at_least=self._padded[1],
                             headroom=SLOT_QUANTUM if self.pad else 0)
        if self.pad:
            self._padded = (keep.numel(), slots.shape[1])
        fl = dict(device=dev, dtype=self.dtype)
        return SystemInputs(torch.as_tensor(pos, **fl), torch.as_tensor(cel, **fl), torch.as_tensor(num, device=dev),
                            edge_index, shifts.to(self.dtype), slots)
