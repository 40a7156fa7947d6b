"""Neighbour lists of the potential, computed outside autograd and outside exported graphs.

The list comes from vesin (preferred) or ASE's ``neighbor_list``; both handle
periodic cells of any shape, cells smaller than the cutoff (several images of
one atom) and open boundaries.  What the model reads is six tensors, the
arguments of ``SO2Potential.forward`` and of a frozen program:

| name | shape | meaning |
|---|---|---|
| ``positions`` | ``(N, 3)`` | Cartesian positions, Å |
| ``cell`` | ``(3, 3)`` | lattice vectors as rows, Å (zeros for an open system) |
| ``numbers`` | ``(N,)`` int64 | atomic numbers |
| ``edge_index`` | ``(2, E)`` int64 | row 0 the neighbour ``j`` (message source), row 1 the centre ``i`` |
| ``shifts`` | ``(E, 3)`` float | integer cell shifts ``S``: ``r_ij = x_j - x_i + S @ cell`` |
| ``slots`` | ``(N, K)`` int64 | the edges of each centre, padded with ``E`` |

Edges are sorted by centre, then neighbour, then shift, so the list (and every
sum over it) does not depend on the library's internal order.  ``slots``
lets the model sum each atom's messages as a dense ``(N, K)`` gather followed
by a sum over ``K``: a fixed reduction order on every device, unlike
``index_add`` (atomics on a GPU).  The graph depends on positions only through
which pairs are within the cutoff; forces and stress differentiate the edge
vectors, which the model rebuilds from ``positions``, ``cell`` and ``shifts``.

An edge shorter than ``MIN_EDGE_LENGTH`` (two atoms on one spot, or an atom on one of its own
periodic images) has no direction: the model's edge frame, radial basis and forces would be
NaN.  ``neighbor_arrays`` refuses such a structure with an error that names the pair.
``verlet.VerletList`` keeps a list with a skin for molecular dynamics.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

MAX_Z = 118          # the elements H (1) .. Og (118): the atomic numbers a model takes
# Shorter edges are zero-length for a float32 model: positions of ~100 Å resolve ~1e-5 Å.
MIN_EDGE_LENGTH = 1e-4


class ZeroLengthEdgeError(ValueError):
    """Two atoms (or an atom and one of its periodic images) closer than ``MIN_EDGE_LENGTH``."""


def check_edge_lengths(lengths, i, j, shifts) -> None:
    """Raise ``ZeroLengthEdgeError`` naming the first pair shorter than ``MIN_EDGE_LENGTH`` (numpy
    arrays: lengths in Å, centre ``i``, neighbour ``j``, integer cell shifts)."""
    bad = np.flatnonzero(np.asarray(lengths) < MIN_EDGE_LENGTH)
    if bad.size:
        k = int(bad[0])
        where = "" if not np.any(shifts[k]) else f" (periodic image shifted by {tuple(int(v) for v in shifts[k])})"
        raise ZeroLengthEdgeError(
            f"atoms {int(i[k])} and {int(j[k])}{where} are {float(lengths[k]):.3g} Å apart, under "
            f"{MIN_EDGE_LENGTH} Å: a zero-length edge (coincident atoms, or an atom on its own periodic "
            f"image) has no direction; {bad.size} such pair(s) in all")

_PIP_FIX = '`pip install -e ".[potential]"` from a clone of mixstack'


class SystemInputs(NamedTuple):
    """The tensors a potential reads for one structure (see the module docstring)."""

    positions: torch.Tensor
    cell: torch.Tensor
    numbers: torch.Tensor
    edge_index: torch.Tensor
    shifts: torch.Tensor
    slots: torch.Tensor


def _pairs(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float):
    """``(i, j, S)`` for every ordered pair within ``cutoff`` (both directions)."""
    try:
        import vesin
    except ImportError:
        vesin = None
    if vesin is not None:
        nl = vesin.NeighborList(cutoff=float(cutoff), full_list=True)
        periodic = bool(pbc[0]) if bool(pbc.all() or not pbc.any()) else [bool(p) for p in pbc]
        i, j, S = nl.compute(points=positions, box=cell, periodic=periodic, quantities="ijS")
        return i.astype(np.int64), j.astype(np.int64), S.astype(np.int64)
    try:
        from ase.neighborlist import primitive_neighbor_list
    except ImportError as exc:
        raise ImportError(f"a neighbour list needs vesin or ase; install them with {_PIP_FIX}") from exc
    i, j, S = primitive_neighbor_list("ijS", pbc, cell, positions, float(cutoff), self_interaction=False)
    return i.astype(np.int64), j.astype(np.int64), S.astype(np.int64)


def neighbor_arrays(positions, cell, pbc, cutoff: float):
    """The sorted ``(edge_index (2, E), shifts (E, 3), slots (N, K))`` as numpy int64 arrays."""
    positions = np.ascontiguousarray(np.asarray(positions, dtype=np.float64))
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {positions.shape}")
    cell = np.ascontiguousarray(np.asarray(cell, dtype=np.float64).reshape(3, 3))
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    if cutoff <= 0:
        raise ValueError(f"cutoff must be > 0, got {cutoff}")
    n = positions.shape[0]
    i, j, S = _pairs(positions, cell, pbc, cutoff)
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))     # centre, then neighbour, then shift
    i, j, S = i[order], j[order], S[order]
    check_edge_lengths(np.linalg.norm(positions[j] - positions[i] + S @ cell, axis=1), i, j, S)
    return np.stack((j, i)), S, centre_slots(torch.from_numpy(i), n).numpy()


def centre_slots(centres: torch.Tensor, n: int, *, multiple: int = 1, at_least: int = 1,
                 headroom: int = 0) -> torch.Tensor:
    """``slots (n, K)`` of edges sorted by centre: row ``i`` lists the edges whose centre is
    ``i``, in order, padded with ``E = len(centres)``; ``K`` is the largest count plus
    ``headroom``, rounded up to a multiple of ``multiple``, and at least ``at_least``.  On the
    centres' device (the LAMMPS path builds them on the GPU)."""
    counts = torch.bincount(centres, minlength=n)
    k = max(int(counts.max()) if n else 0, 1) + headroom
    k = max(-(-k // multiple) * multiple, at_least)
    start = torch.cumsum(counts, 0) - counts
    lane = torch.arange(k, device=centres.device)
    return torch.where(lane[None, :] < counts[:, None], start[:, None] + lane[None, :], centres.numel())


def host_arrays(positions, cell, numbers):
    """``(positions (N, 3), cell (3, 3))`` float64 and ``numbers (N,)`` int64 as numpy arrays, with
    the atomic numbers and the atom count checked (numpy or torch inputs)."""
    pos = np.asarray(positions.detach().cpu() if torch.is_tensor(positions) else positions, dtype=np.float64)
    cel = np.asarray(cell.detach().cpu() if torch.is_tensor(cell) else cell, dtype=np.float64).reshape(3, 3)
    num = np.asarray(numbers.cpu() if torch.is_tensor(numbers) else numbers, dtype=np.int64)
    if num.shape != (pos.shape[0],):
        raise ValueError(f"numbers must have shape ({pos.shape[0]},), got {num.shape}")
    if pos.shape[0] == 0:
        raise ValueError("the structure has no atoms; a potential needs at least one")
    bad = sorted(set(num[(num < 1) | (num > MAX_Z)].tolist()))
    if bad:
        raise ValueError(f"atomic numbers must be in 1..{MAX_Z} (H..Og), got {', '.join(map(str, bad))}")
    return pos, cel, num


def system_inputs(positions, cell, pbc, numbers, cutoff: float, *, device=None,
                  dtype=torch.float32) -> SystemInputs:
    """The model's input tensors for one structure (numpy or torch inputs)."""
    pos, cel, num = host_arrays(positions, cell, numbers)
    edge_index, shifts, slots = neighbor_arrays(pos, cel, pbc, cutoff)
    fl = dict(device=device, dtype=dtype)
    return SystemInputs(torch.as_tensor(pos, **fl), torch.as_tensor(cel, **fl),
                        torch.as_tensor(num, device=device), torch.as_tensor(edge_index, device=device),
                        torch.as_tensor(shifts, **fl), torch.as_tensor(slots, device=device))


def atoms_inputs(atoms, cutoff: float, *, device=None, dtype=torch.float32) -> SystemInputs:
    """``system_inputs`` of an ``ase.Atoms``."""
    return system_inputs(atoms.get_positions(), atoms.get_cell().array, atoms.get_pbc(),
                         atoms.get_atomic_numbers(), cutoff, device=device, dtype=dtype)
