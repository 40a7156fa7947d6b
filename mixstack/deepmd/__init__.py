"""mixstack inside deepmd-kit: SeZM (DPA4) models run their SO(2) value path on mixstack.

``accelerate(model, level=None) -> AccelerationReport`` routes every SeZM SO(2) convolution of
a built deepmd-kit (>= 3.2, PyTorch backend) model that mixstack reproduces exactly through
mixstack's operators, in place; ``restore(model)`` undoes it.  deepmd-kit's own commands reach
it through the ``deepmd.pt`` entry point (``mixstack.deepmd.plugin``) with
``MIXSTACK_DEEPMD=1``.  docs/deepmd.md says what runs where.  The extra is ``[deepmd]``;
deepmd-kit is imported only when these are called.

``FrameRunner(model)`` runs a SeZM model's frame (energy, forces, virial) from a kept neighbour
list in fixed buffers, replayed from a CUDA graph on a GPU; ``DeepmdCalculator`` is the ASE
calculator on it (``mixstack.deepmd.calculator``, which needs ASE).
"""

from __future__ import annotations

from .accelerate import accelerate, restore
from .frame import FrameRunner
from .report import AccelerationReport, ConvolutionReport

__all__ = ["AccelerationReport", "ConvolutionReport", "DeepmdCalculator", "FrameRunner", "accelerate", "restore"]


def __getattr__(name):
    if name == "DeepmdCalculator":          # ASE is imported only when the calculator is asked for
        from .calculator import DeepmdCalculator
        return DeepmdCalculator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
