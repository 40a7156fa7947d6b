"""The structures and model sizes that the benches, freezing, LAMMPS runs and training share:
rattled periodic cells of a lattice at about a given atom count, and ``SO2Potential`` presets
by name."""

from __future__ import annotations

import itertools
import math

CELLS = ("diamond", "cu-bcc")
# The benches' model: the S1 stack (focus_dim 32, lmax 3, two focus streams, four layers).
DEFAULT_MODEL = dict(lmax=3, focus_dim=32, n_focus=2, n_layers=4, n_blocks=2, cutoff=5.0)
# A model small enough for the CPU and the Triton interpreter.
QUICK_CPU_MODEL = dict(lmax=2, focus_dim=16, n_focus=2, n_layers=3, n_blocks=2, cutoff=4.0)
# The smallest stack that level 3 speeds up (focus_dim 32, a row of 224 floats: the level-3
# policy's region, docs/contract.md §3), at 25 kB per edge (BENCHMARKS.md, "Memory per edge, and
# what fits one H200").
SCALING_MODEL = dict(lmax=2, focus_dim=32, n_focus=1, n_layers=2, n_blocks=2, cutoff=3.3, radial_hidden=16)
# lmax 1: 14 kB per edge, so that 500,000 bcc Cu atoms fit on one H200 (the same section); level
# 3 runs level 2 on its stack (a row of 128 floats).
SCALING_LITE_MODEL = dict(SCALING_MODEL, lmax=1)
MODELS = {"small": QUICK_CPU_MODEL, "bench": DEFAULT_MODEL, "scaling": SCALING_MODEL,
          "scaling-lite": SCALING_LITE_MODEL}
MODEL_NAMES = tuple(MODELS)


def model_size(name: str) -> dict:
    """The ``SO2Potential`` arguments of a named model (``MODEL_NAMES``), a fresh dict."""
    if name not in MODELS:
        raise ValueError(f"model: {name!r} is not one of {', '.join(MODEL_NAMES)}")
    return dict(MODELS[name])


def _repeats(unit: int, target: int) -> tuple[int, int, int]:
    """Near-cubic repeats whose atom count ``unit * a * b * c`` is closest to ``target``."""
    r = max(1, round((target / unit) ** (1 / 3)))
    options = [(a, b, c) for a, b, c in itertools.product(range(max(1, r - 1), r + 2), repeat=3)
               if a <= b <= c and c - a <= 1]
    return min(options, key=lambda abc: (abs(unit * math.prod(abc) - target), abc))


def build_cell(name: str, target_atoms: int, seed: int = 0):
    """A rattled periodic cell of lattice ``name`` with about ``target_atoms`` atoms."""
    try:
        from ase.build import bulk
    except ImportError as exc:
        raise ImportError('building a cell needs ASE; install it with `pip install -e ".[potential]"` from a clone '
                          'of mixstack') from exc
    if name == "diamond":
        unit = bulk("C", "diamond", cubic=True)
    elif name == "cu-bcc":
        unit = bulk("Cu", "bcc", a=2.87, cubic=True)
    else:
        raise ValueError(f"unknown cell {name!r}; use {', '.join(CELLS)}")
    atoms = unit.repeat(_repeats(len(unit), target_atoms))
    atoms.rattle(0.05, seed=seed)
    return atoms
