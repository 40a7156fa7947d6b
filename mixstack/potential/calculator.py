"""``MixstackCalculator``: an ASE calculator for a mixstack potential, live or frozen.

Energies in eV, forces in eV/Å, stress in eV/Å^3 as a Voigt 6-vector
``(xx, yy, zz, yz, xz, xy)`` (ASE's order and sign: ``(1/V) dE/d(strain)``).
Stress is available for fully periodic cells only, like ASE's own
calculators.  The neighbour list is a Verlet list with a skin (``verlet.VerletList``):
rebuilt only when an atom has moved more than half the skin since it was built or the cell,
periodic directions or atoms changed, and cut to the cutoff on every call, so results are
those of a fresh list.  The model or frozen program does the rest.

Needs ASE (and, preferably, vesin): the ``[potential]`` extra, ``pip install -e ".[potential]"``
from a clone of mixstack.
"""

from __future__ import annotations

import os

import torch

try:
    import numpy as np
    from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
    from ase.stress import full_3x3_to_voigt_6_stress
except ImportError as exc:                      # pragma: no cover - exercised without ase only
    raise ImportError("mixstack.potential.calculator needs ASE and NumPy; install them with "
                      '`pip install -e ".[potential]"` from a clone of mixstack') from exc

from .graphs import GraphedFrames
from .verlet import VerletList


def exact_changes(old, new, ignored=frozenset()) -> list[str]:
    """The names of ``all_changes`` (but ``ignored``) in which atoms ``new`` differ from ``old``, each
    array, the cell and the periodicity compared exactly (an array held by one of them only counts
    as changed, as in ASE's ``compare_atoms``)."""
    changes = [name for name in ("cell", "pbc") if name not in ignored
               and not np.array_equal(np.asarray(getattr(old, name)), np.asarray(getattr(new, name)))]
    for name in all_changes:
        if name in ("cell", "pbc") or name in ignored:
            continue
        a, b = old.arrays.get(name), new.arrays.get(name)
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            changes.append(name)
    return changes


class ExactStateCheck:
    """An ASE calculator's ``check_state`` with ``exact_changes`` in place of ASE's ``allclose`` over
    every array, most of an MD step's upkeep beside the frame (BENCHMARKS.md, "The calculator's
    upkeep of an MD step"); a change below ASE's ``tol`` is computed again, never served stale.
    Put it before ``Calculator`` among the bases."""

    def check_state(self, atoms, tol=1e-15):
        if self.atoms is None:
            return super().check_state(atoms, tol)
        return exact_changes(self.atoms, atoms, set(self.ignored_changes))


class MixstackCalculator(ExactStateCheck, Calculator):
    """ASE calculator for ``SO2Potential`` (or any module with its signature) or a ``.pt2``
    written by ``mixstack.freeze``.

    ``model_or_path``: an ``nn.Module`` with ``forward(positions, cell, numbers,
    edge_index, shifts, slots) -> (energy, forces, stress, energies)`` and a
    ``cutoff``; or the path of a frozen file.  ``device``: where a live module
    runs (default: where its parameters are); a frozen file runs on the device
    it was compiled for.  A live module is put in eval mode.  ``skin`` (Å): the
    neighbour list's skin (0: a new list every call).  ``compile=True`` (a live
    ``SO2Potential``): the energy runs under ``torch.compile`` with dynamic shapes
    (the edge count changes from step to step), forces and stress by autograd
    through it, as ``mixstack bench model`` times compiled frames.  ``cuda_graphs`` (a live
    module on a CUDA device; default: on there, unless ``compile``): frames are replayed from
    CUDA graphs (``graphs.GraphedFrames``) and the neighbour list pads the edges so that the
    shapes stay put between rebuilds (``VerletList(pad=True)``); a frame that cannot be
    captured runs eagerly with a warning.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]

    def __init__(self, model_or_path, device=None, *, skin: float = 1.0, compile: bool = False,
                 cuda_graphs: bool | None = None, **kwargs):
        super().__init__(**kwargs)
        self._frame = None
        if isinstance(model_or_path, (str, os.PathLike)):
            from ..export import load
            self.potential = load(model_or_path)
            if device is not None and torch.device(device).type != self.potential.device.type:
                raise ValueError(f"{model_or_path} was compiled for {self.potential.device}, "
                                 f"not {device}")
            self.device, self.dtype = self.potential.device, self.potential.dtype
        elif isinstance(model_or_path, torch.nn.Module):
            p = next(model_or_path.parameters())
            self.device = torch.device(device) if device is not None else p.device
            self.potential = model_or_path.to(self.device).eval()
            self.dtype = p.dtype
        else:
            raise TypeError(f"model_or_path must be an nn.Module or the path of a .pt2 file, "
                            f"got {type(model_or_path).__name__}")
        self.cutoff = float(self.potential.cutoff)
        if compile:
            if not hasattr(self.potential, "derivatives"):
                raise TypeError("compile=True needs a live SO2Potential (a module with energy() and "
                                "derivatives()); a frozen program is compiled already")
            energy = torch.compile(self.potential.energy, dynamic=True)
            self._frame = lambda *inputs: self.potential.derivatives(energy, *inputs)
        live_cuda = isinstance(model_or_path, torch.nn.Module) and self.device.type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = live_cuda and not compile
        elif cuda_graphs and not live_cuda:
            what = f"a module on {self.device}" if isinstance(model_or_path, torch.nn.Module) else "a frozen program"
            raise ValueError(f"cuda_graphs=True needs a live module on a CUDA device, not {what}")
        elif cuda_graphs and compile:
            raise ValueError("cuda_graphs=True and compile=True do not combine; pick one")
        self.graphs = GraphedFrames(self.potential) if cuda_graphs else None
        if self.graphs is not None:
            self._frame = self.graphs
        self.neighbors = VerletList(self.cutoff, skin, device=self.device, dtype=self.dtype,
                                    pad=self.graphs is not None)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        periodic = bool(np.all(self.atoms.get_pbc()))
        if "stress" in properties and not periodic:
            raise PropertyNotImplementedError("stress needs a cell that is periodic in all three directions")
        inputs = self.neighbors(self.atoms.get_positions(), self.atoms.get_cell().array, self.atoms.get_pbc(),
                                self.atoms.get_atomic_numbers())
        energy, forces, stress, energies = (self._frame or self.potential)(*inputs)
        energy = float(energy.detach().double().cpu())
        self.results = {
            "energy": energy, "free_energy": energy,
            "energies": energies.detach().double().cpu().numpy(),
            "forces": forces.detach().double().cpu().numpy(),
        }
        if periodic:
            self.results["stress"] = full_3x3_to_voigt_6_stress(stress.detach().double().cpu().numpy())
