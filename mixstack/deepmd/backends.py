"""The deepmd-kit backends whose SeZM (DPA4) models mixstack accelerates, and their classes:
PyTorch (``deepmd.pt``: ``dp --pt``) and PT-expt (``deepmd.pt_expt``: ``dp --pt-expt``).
A backend's classes are imported only when a model holds its modules."""

from __future__ import annotations

from typing import NamedTuple

import torch

EXPT_MODULES = "deepmd.pt_expt."


class Backend(NamedTuple):
    """One deepmd-kit backend's classes: its convolution, mixstack's subclass of it, its SeZM
    descriptor, its gate and identity modules (the structure checks' safety net)."""

    name: str
    convolution: type
    accelerated: type
    descriptor: type
    gated: tuple[type, ...]
    identity: tuple[type, ...]


def pt() -> Backend:
    """deepmd-kit's PyTorch backend."""
    from .compat import deepmd_pt

    deepmd_pt()
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM
    from deepmd.pt.model.descriptor.sezm_nn.activation import GatedActivation
    from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution

    from .convolution import MixstackSO2Convolution
    return Backend("pt", SO2Convolution, MixstackSO2Convolution, DescrptSeZM, (GatedActivation,),
                   (torch.nn.Identity,))


def expt() -> Backend:
    """deepmd-kit's PT-expt backend."""
    from . import expt as classes
    return Backend("pt_expt", classes.SO2Convolution, classes.MixstackDPA4Convolution, classes.DescrptDPA4,
                   (classes.GatedActivation,), (torch.nn.Identity, classes.Identity))


def present(model: torch.nn.Module) -> list[Backend]:
    """The backends whose modules ``model`` holds (PyTorch's always: it is the one a plain
    ``torch.nn.Module`` search needs no import for)."""
    found = [pt()]
    if any(type(m).__module__.startswith(EXPT_MODULES) for m in model.modules()):
        found.append(expt())
    return found


def of(conv) -> Backend | None:
    """The backend whose SeZM convolution ``conv`` is, or ``None``."""
    for backend in present(conv):
        if isinstance(conv, backend.convolution):
            return backend
    return None
