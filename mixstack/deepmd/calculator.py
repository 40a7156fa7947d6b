"""``DeepmdCalculator``: an ASE calculator for deepmd-kit SeZM models on ``FrameRunner``.

deepmd-kit's own calculator (``deepmd.calculator.DP``) runs the model's whole forward every step,
its neighbour search included.  This one runs the frame through ``FrameRunner``: a kept neighbour
list with a skin and, on a GPU, the frame replayed from a CUDA graph; optionally with the model's
SO(2) convolutions on mixstack (``level``) and deepmd-kit's compiled inference (``compile``).
Results follow ``DP``'s conventions: energy and free energy in eV, forces in eV/Å, the virial
``(3, 3)``, and for a periodic system the stress ``-(v + v^T) / (2 V)`` in Voigt order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..potential.calculator import ExactStateCheck
from .compat import INSTALL_HINT

try:
    from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
    from ase.data import atomic_numbers, chemical_symbols
except ImportError as exc:                      # pragma: no cover - exercised without ase only
    raise ImportError(f"mixstack.deepmd.calculator needs ASE ({INSTALL_HINT})") from exc


def load_model(path, device=None):
    """The SeZM model in deepmd-kit checkpoint or frozen file ``path``, loaded by deepmd-kit's
    ``DeepPot`` as its calculator loads it, on ``device`` in evaluation."""
    from .compat import deepmd_pt

    deepmd_pt()
    from deepmd.infer import DeepPot

    if not Path(path).exists():
        raise FileNotFoundError(f"model: no file {path}")
    wrapper = DeepPot(str(Path(path).resolve())).deep_eval.dp
    model = wrapper.model["Default"]
    return model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()


class DeepmdCalculator(ExactStateCheck, Calculator):
    """``DeepmdCalculator(model, *, level=None, skin=1.0, graph=None, compile=None, device=None)``.

    ``model``: a deepmd-kit checkpoint or frozen model path (loaded by ``DeepPot``), a built
    deepmd-kit SeZM model, or a ``FrameRunner``.  ``level``: accelerate the model's SO(2)
    convolutions on mixstack at that level (``mixstack.deepmd.accelerate``; ``None``: leave the
    model as it is).  ``skin``, ``graph``, ``compile``: ``FrameRunner``'s.  ``type_map``: the
    element of each type index (default: the model's).  ``report`` is ``accelerate``'s report
    (``None`` without ``level``)."""

    implemented_properties = ["energy", "free_energy", "forces", "virial", "stress"]

    def __init__(self, model, *, level: int | None = None, skin: float = 1.0, graph: bool | None = None,
                 compile: bool | None = None, device=None, type_map=None, **kwargs):
        from .frame import FrameRunner

        Calculator.__init__(self, **kwargs)
        self.report = None
        if isinstance(model, FrameRunner):
            if level is not None:
                raise ValueError("level applies to a model; accelerate it before building its FrameRunner")
            runner = model
        else:
            if isinstance(model, (str, Path)):
                model = load_model(model, device)
            elif not isinstance(model, torch.nn.Module):
                raise TypeError(f"model must be a path, a deepmd-kit model or a FrameRunner, got {type(model).__name__}")
            if level is not None:
                from .accelerate import accelerate
                self.report = accelerate(model, level=level)
            runner = FrameRunner(model, skin=skin, graph=graph, compile=compile)
        self.runner = runner
        names = list(type_map) if type_map is not None else list(runner.model.get_type_map())
        self.type_dict = {name: i for i, name in enumerate(names)}
        # atomic number -> type index (-1: not in the type map), and the last frame's types on the
        # model's device: an MD step maps no symbols and copies no types
        self._type_of_number = np.full(len(chemical_symbols), -1, dtype=np.int64)
        for name, index in self.type_dict.items():
            if name in atomic_numbers:
                self._type_of_number[atomic_numbers[name]] = index
        self._numbers = self._atype = None

    def _types(self, numbers: np.ndarray) -> torch.Tensor:
        """The type index of each atom (``numbers``: atomic numbers), kept while they do not change."""
        if self._numbers is not None and np.array_equal(numbers, self._numbers):
            return self._atype
        types = self._type_of_number[numbers]
        if (types < 0).any():
            unknown = sorted({chemical_symbols[z] for z in numbers[types < 0]})
            raise ValueError(f"atoms: elements {', '.join(unknown)} are not in the model's type map "
                             f"({', '.join(self.type_dict)})")
        self._atype = torch.as_tensor(types, device=self.runner.device)
        self._numbers = numbers.copy()
        return self._atype

    def calculate(self, atoms=None, properties=("energy", "forces"), system_changes=all_changes):
        Calculator.calculate(self, atoms, properties, system_changes)
        atoms = self.atoms
        atype = self._types(atoms.numbers)
        dtype = self.runner.dtype                    # the runner moves the inputs to the model's device
        coord = torch.as_tensor(atoms.get_positions(), dtype=dtype)
        periodic = bool(atoms.get_pbc().any())
        box = torch.as_tensor(atoms.get_cell().array, dtype=dtype) if periodic else None
        out = self.runner(coord, atype, box)
        energy = float(out["energy"].reshape(()))
        virial = out["virial"].reshape(3, 3).double().cpu().numpy()
        self.results["energy"] = self.results["free_energy"] = energy
        self.results["forces"] = out["force"].reshape(-1, 3).double().cpu().numpy()
        self.results["virial"] = virial
        if periodic:
            stress = -0.5 * (virial + virial.T) / atoms.get_volume()
            self.results["stress"] = stress.flat[[0, 4, 8, 5, 2, 1]]
        elif "stress" in properties:
            raise PropertyNotImplementedError("stress needs a periodic system")
