"""Atomic systems for the tests and the benchmark: liquid-like water, a rock-salt crystal, and
small clusters; as deepmd-kit's model inputs ``(coord (1, N, 3), atype (1, N), box (1, 9) or
None)``.  Geometry only matters through the neighbour lists (the models are untrained)."""

from __future__ import annotations

import math

import torch

WATER_VOLUME = 29.9          # Å^3 per molecule at 1 g/cm^3
ROCKSALT_A = 4.17            # Å, the NiO lattice constant


def _frame(pos, types, box_side, dtype):
    coord = torch.as_tensor(pos, dtype=dtype).reshape(1, -1, 3)
    atype = torch.as_tensor(types, dtype=torch.long).reshape(1, -1)
    box = None if box_side is None else (torch.eye(3, dtype=dtype) * box_side).reshape(1, 9)
    return coord, atype, box


def water(n_atoms: int, *, seed: int = 0, periodic: bool = True, dtype=torch.float64):
    """About ``n_atoms`` atoms of water (``3 * round(n_atoms / 3)``; O type 0, H type 1),
    molecules on a jittered cubic grid at 1 g/cm^3 with random orientations; periodic in a cube,
    or the same molecules as a cluster without a box."""
    n_mol = max(1, round(n_atoms / 3))
    side = math.ceil(n_mol ** (1 / 3) - 1e-9)
    spacing = WATER_VOLUME ** (1 / 3)
    gen = torch.Generator().manual_seed(seed)
    pos, types = [], []
    for index in range(n_mol):
        i, j, k = index // (side * side), (index // side) % side, index % side
        o = torch.tensor([i, j, k], dtype=torch.float64) * spacing + 0.15 * torch.randn(3, generator=gen,
                                                                                       dtype=torch.float64)
        axis = torch.randn(3, generator=gen, dtype=torch.float64)
        axis = axis / axis.norm()
        other = torch.linalg.cross(axis, torch.randn(3, generator=gen, dtype=torch.float64))
        other = other / other.norm()
        half = math.radians(104.5) / 2
        pos += [o] + [o + 0.9572 * (math.cos(half) * axis + sign * math.sin(half) * other) for sign in (1, -1)]
        types += [0, 1, 1]
    return _frame(torch.stack(pos), types, side * spacing if periodic else None, dtype)


def rocksalt(n_atoms: int, *, seed: int = 0, jitter: float = 0.1, dtype=torch.float64):
    """A periodic rock-salt crystal (type 0 on one sublattice, type 1 on the other) of
    ``8 * k^3`` atoms, the cube nearest ``n_atoms``, each atom displaced by ``jitter`` Å
    (Gaussian)."""
    k = max(1, round((n_atoms / 8) ** (1 / 3)))
    half = ROCKSALT_A / 2
    gen = torch.Generator().manual_seed(seed)
    pos, types = [], []
    for i in range(2 * k):
        for j in range(2 * k):
            for m in range(2 * k):
                pos.append(torch.tensor([i, j, m], dtype=torch.float64) * half)
                types.append((i + j + m) % 2)
    pos = torch.stack(pos) + jitter * torch.randn(len(pos), 3, generator=gen, dtype=torch.float64)
    return _frame(pos, types, k * ROCKSALT_A, dtype)


def with_isolated_atom(frame, *, distance: float = 50.0, atom_type: int = 0):
    """``frame`` (non-periodic) with one more atom ``distance`` Å from the others: no edges."""
    coord, atype, box = frame
    if box is not None:
        raise ValueError("with_isolated_atom needs a non-periodic frame (box None)")
    far = coord[0].max(0).values + distance
    coord = torch.cat((coord, far.view(1, 1, 3)), 1)
    atype = torch.cat((atype, torch.full((1, 1), atom_type, dtype=atype.dtype)), 1)
    return coord, atype, None
