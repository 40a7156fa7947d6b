"""An SO(2)-equivariant interatomic potential whose convolutions run the mixing stack.

| module | what |
|---|---|
| ``wigner`` | edge frames and the real Wigner-D rows ``m in {0, ±1}`` (exact, differentiable) |
| ``radial`` | Bessel radial basis and the polynomial cutoff envelope |
| ``blocks`` | ``EquivariantMixingStack`` (``w1 = [[U, V], [-V, U]]``) and ``InteractionBlock`` |
| ``model`` | ``SO2Potential``: energy, forces, stress; ``PotentialConfig``, its hyperparameters |
| ``neighbors`` | neighbour lists (vesin or ASE) and the model's input tensors |

``mixstack.potential.calculator.MixstackCalculator`` runs it (or a frozen ``.pt2``) in ASE.
Importing this package needs torch and numpy only; the neighbour list imports
vesin or ASE when it is first built (the ``[potential]`` extra: ``pip install -e ".[potential]"``
from a clone of mixstack).
"""

from .blocks import EquivariantMixingStack, InteractionBlock
from .model import PotentialConfig, SO2Potential
from .neighbors import SystemInputs, atoms_inputs, neighbor_arrays, system_inputs

__all__ = ["EquivariantMixingStack", "InteractionBlock", "PotentialConfig", "SO2Potential", "SystemInputs", "atoms_inputs",
           "neighbor_arrays", "system_inputs"]
