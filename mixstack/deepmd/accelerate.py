"""``accelerate`` and ``restore``: route a built deepmd-kit model's SeZM convolutions through
mixstack, in place, and back.

Per SeZM ``SO2Convolution`` (in module order): ``options.unsupported_reason``; when ``None`` the
convolution's class becomes ``MixstackSO2Convolution`` (same parameters, buffers and state-dict
keys; only ``forward`` differs), else it stays on deepmd-kit's path and the report gives the
reason.  A SeZM descriptor none of whose convolutions reads deepmd-kit's ``(E, D, D)`` Wigner
blocks any more stops building them (deepmd-kit's own switch ``_need_full_wigner``, which its
all-Cartesian models use; its geometric initial embedding then takes its zonal coupling from the
edge quaternions, as there).
"""

from __future__ import annotations

import logging

import torch

from .compat import deepmd_pt
from .report import DEEPMD, MIXSTACK, AccelerationReport, ConvolutionReport

logger = logging.getLogger(__name__)

_SAVED_WIGNER = "_mixstack_need_full_wigner"


def _check_level(level) -> int | None:
    if level is None:
        return None
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be None or an int in 0..3, got {type(level).__name__}")
    if level not in (0, 1, 2, 3):
        raise ValueError(f"level must be None or in 0..3, got {level}")
    return level


def _needs_full_wigner(conv) -> bool:
    """Whether ``conv`` reads deepmd-kit's full Wigner blocks (its own path, not Cartesian)."""
    return not getattr(type(conv), "_mixstack", False) and not conv.edge_cartesian


def accelerate(model: torch.nn.Module, *, level: int | None = None) -> AccelerationReport:
    """Run every SeZM (DPA4) SO(2) convolution of ``model`` that mixstack reproduces exactly on
    mixstack's operators, in place; return the report (per convolution: where it runs and, if on
    deepmd-kit, the one option mixstack does not reproduce).

    ``model`` is any ``torch.nn.Module`` holding deepmd-kit (>= 3.2, PyTorch backend) SeZM
    modules: a model from ``deepmd.pt.model.model.get_model``, its descriptor, a wrapper.
    ``level`` pins mixstack's level for these convolutions (``None``: the active level at each
    call, ``mixstack.set_level`` / ``use_level`` / ``MIXSTACK_LEVEL``).  Calling it again
    re-checks every convolution and sets the new level."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    level = _check_level(level)
    deepmd_pt()
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM
    from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution

    from .convolution import MixstackSO2Convolution
    from .options import unsupported_reason

    convs = []
    for name, module in model.named_modules():
        if not isinstance(module, SO2Convolution):
            continue
        if type(module) is MixstackSO2Convolution:
            module.__class__ = SO2Convolution                 # re-check from deepmd-kit's class
        name = name or type(module).__name__                  # the model itself: its class
        reason = unsupported_reason(module)
        if reason is None:
            module.__class__ = MixstackSO2Convolution
            module._mixstack_level = level
            convs.append(ConvolutionReport(name, MIXSTACK))
        else:
            convs.append(ConvolutionReport(name, DEEPMD, reason))

    skipped = []
    for name, module in model.named_modules():
        if not isinstance(module, DescrptSeZM):
            continue
        saved = module.__dict__.setdefault(_SAVED_WIGNER, module._need_full_wigner)
        inner = [m for m in module.modules() if isinstance(m, SO2Convolution)]
        module._need_full_wigner = saved and any(_needs_full_wigner(m) for m in inner)
        if saved and not module._need_full_wigner:
            skipped.append(name or type(module).__name__)

    report = AccelerationReport(level, tuple(convs), tuple(skipped))
    logger.debug("%s", report)
    return report


def restore(model: torch.nn.Module) -> int:
    """Undo ``accelerate``: every SeZM convolution of ``model`` back on deepmd-kit's path, every
    SeZM descriptor building its Wigner blocks as before.  Returns how many convolutions moved."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    deepmd_pt()
    from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution

    from .convolution import MixstackSO2Convolution

    moved = 0
    for module in model.modules():
        if type(module) is MixstackSO2Convolution:
            module.__class__ = SO2Convolution
            module.__dict__.pop("_mixstack_level", None)
            moved += 1
        if _SAVED_WIGNER in module.__dict__:
            module._need_full_wigner = module.__dict__.pop(_SAVED_WIGNER)
    return moved
