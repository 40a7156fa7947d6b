"""``MixstackCalculator``: an ASE calculator for a mixstack potential, live or frozen.

Energies in eV, forces in eV/Å, stress in eV/Å^3 as a Voigt 6-vector
``(xx, yy, zz, yz, xz, xy)`` (ASE's order and sign: ``(1/V) dE/d(strain)``).
Stress is available for fully periodic cells only, like ASE's own
calculators.  The neighbour list is rebuilt on every call
(``mixstack.potential.neighbors``); the model or frozen program does the rest.

Needs ASE (and, preferably, vesin): ``pip install mixstack[potential]``.
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
                      "`pip install mixstack[potential]`") from exc

from .neighbors import atoms_inputs


class MixstackCalculator(Calculator):
    """ASE calculator for ``SO2Potential`` (or any module with its signature) or a ``.pt2``
    written by ``mixstack.freeze``.

    ``model_or_path``: an ``nn.Module`` with ``forward(positions, cell, numbers,
    edge_index, shifts, slots) -> (energy, forces, stress, energies)`` and a
    ``cutoff``; or the path of a frozen file.  ``device``: where a live module
    runs (default: where its parameters are); a frozen file runs on the device
    it was compiled for.  A live module is put in eval mode.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]

    def __init__(self, model_or_path, device=None, **kwargs):
        super().__init__(**kwargs)
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

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        periodic = bool(np.all(self.atoms.get_pbc()))
        if "stress" in properties and not periodic:
            raise PropertyNotImplementedError("stress needs a cell that is periodic in all three directions")
        inputs = atoms_inputs(self.atoms, self.cutoff, device=self.device, dtype=self.dtype)
        energy, forces, stress, energies = self.potential(*inputs)
        energy = float(energy.detach().double().cpu())
        self.results = {
            "energy": energy, "free_energy": energy,
            "energies": energies.detach().double().cpu().numpy(),
            "forces": forces.detach().double().cpu().numpy(),
        }
        if periodic:
            self.results["stress"] = full_3x3_to_voigt_6_stress(stress.detach().double().cpu().numpy())
