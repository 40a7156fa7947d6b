"""``accelerate`` and ``restore``: route a built deepmd-kit model's SeZM convolutions through
mixstack, in place, and back.

Per SeZM ``SO2Convolution`` (in module order): ``options.unsupported_reason``; when ``None`` the
convolution's class becomes ``MixstackSO2Convolution`` (same parameters, buffers and state-dict
keys; only ``forward`` differs), else it stays on deepmd-kit's path and the report gives the
reason.  A SeZM descriptor none of whose convolutions reads deepmd-kit's ``(E, D, D)`` Wigner
blocks any more stops building them (deepmd-kit's own switch ``_need_full_wigner``, which its
all-Cartesian models use; its geometric initial embedding then takes its zonal coupling from the
edge quaternions, as there).

``accelerate`` marks a model with convolutions on mixstack so that deepmd-kit's compiled
inference traces mixstack's operators whole (``compiled``); ``restore`` unmarks it.  Both drop
deepmd-kit's compiled ``core_compute`` of the SeZM models they touch (its
``DP_COMPILE_INFER`` path, ``FrameRunner(compile=True)``): ``make_fx`` traced it with the
convolutions' classes, mixstack's level, the Wigner switch and the parameter tensors of its
time, and deepmd-kit would keep calling it; the next compiled frame traces the model anew.
"""

from __future__ import annotations

import logging
import sys

import torch

from ..core import config
from . import compiled
from .report import DEEPMD, MIXSTACK, AccelerationReport, ConvolutionReport

logger = logging.getLogger(__name__)

_SAVED_WIGNER = "_mixstack_need_full_wigner"
_SEZM_MODEL = "deepmd.pt.model.model.sezm_model"     # deepmd-kit's compiled-inference caches live there


def _check_level(level) -> int | None:
    if level is None:
        return None
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be None or an int in 0..3, got {type(level).__name__}")
    if level not in (0, 1, 2, 3):
        raise ValueError(f"level must be None or in 0..3, got {level}")
    return level


def _forget_compiled(model: torch.nn.Module) -> None:
    """Drop deepmd-kit's compiled graphs of every SeZM model in ``model``: its per-model caches
    (``compiled_core_compute_cache`` and the buffer orders that go with it, the embedding and
    ``dens`` graphs) and its process-wide ``_SEZM_COMPILE_CACHE`` entries for the model's
    structure key, where a model of the same modules would find the old graph again.  Where
    deepmd-kit's SeZM model module was never imported, nothing can have been compiled."""
    sezm_model = sys.modules.get(_SEZM_MODEL)
    if sezm_model is None:
        return
    shared = getattr(sezm_model, "_SEZM_COMPILE_CACHE", None)
    structure_key = getattr(sezm_model, "_sezm_structure_key", None)
    for module in model.modules():
        state = module.__dict__
        cache = state.get("compiled_core_compute_cache")
        if not isinstance(cache, dict):
            continue
        if isinstance(shared, dict) and structure_key is not None:
            prefix = structure_key(module)
            for key in [k for k in shared if k[:len(prefix)] == prefix]:
                del shared[key]
        cache.clear()
        if isinstance(state.get("_task_buf_order_cache"), dict):
            state["_task_buf_order_cache"].clear()
        for name in ("compiled_embedding", "_embedding_task_buf_order", "compiled_dens_compute"):
            if state.get(name) is not None:
                object.__setattr__(module, name, None)


def _needs_full_wigner(conv) -> bool:
    """Whether ``conv`` reads deepmd-kit's full Wigner blocks (its own path, not Cartesian)."""
    return not getattr(type(conv), "_mixstack", False) and not conv.edge_cartesian


def accelerate(model: torch.nn.Module, *, level: int | None = None,
               rest_products: str = "exact", lowering: str = "deepmd") -> AccelerationReport:
    """Run every SeZM (DPA4) SO(2) convolution of ``model`` that mixstack reproduces exactly on
    mixstack's operators, in place; return the report (per convolution: where it runs and, if on
    deepmd-kit, the one option mixstack does not reproduce).

    ``model`` is any ``torch.nn.Module`` holding deepmd-kit (>= 3.2) SeZM modules of its PyTorch
    backend (a model from ``deepmd.pt.model.model.get_model``, its descriptor, a wrapper) or of
    its PT-expt backend (``deepmd.pt_expt.model.get_model``, the DPA4 models ``dp --pt-expt``
    trains and freezes).
    ``level`` pins mixstack's level for these convolutions (``None``: the active level at each
    call, ``mixstack.set_level`` / ``use_level`` / ``MIXSTACK_LEVEL``).  ``rest_products``:
    ``"exact"`` leaves the rest of the model's products to deepmd-kit (fp32); ``"compensated"``
    makes deepmd-kit's compiled inference (``DP_COMPILE_INFER=1``, ``FrameRunner(compile=True)``)
    run its float32 products as compensated fp16 tensor-core products, level 3's split, in ATen
    operations; ``"kernel"`` the same by mixstack's kernel (``rest_products``; eager frames are
    unchanged).  ``lowering``: ``"deepmd"`` lowers deepmd-kit's compiled inference graph with
    deepmd-kit's Inductor options; ``"fused"`` without its caps on fusion size and persistent
    reductions (``compiled.LOWERINGS``).  Calling it again re-checks every convolution
    and sets the new level, products and lowering."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    level = _check_level(level)
    config.rest_products_setting(rest_products, "rest_products")
    compiled.lowering_setting(lowering, "lowering")
    from .backends import present
    from .options import unsupported_reason

    backends = present(model)
    convs = []
    for name, module in model.named_modules():
        backend = next((b for b in backends if isinstance(module, b.convolution)), None)
        if backend is None:
            continue
        if type(module) is backend.accelerated:
            module.__class__ = backend.convolution             # re-check from deepmd-kit's class
        name = name or type(module).__name__                  # the model itself: its class
        reason = unsupported_reason(module)
        if reason is None:
            module.__class__ = backend.accelerated
            module._mixstack_level = level
            convs.append(ConvolutionReport(name, MIXSTACK))
        else:
            convs.append(ConvolutionReport(name, DEEPMD, reason))

    skipped = []
    for name, module in model.named_modules():
        backend = next((b for b in backends if isinstance(module, b.descriptor)), None)
        if backend is None:
            continue
        saved = module.__dict__.setdefault(_SAVED_WIGNER, module._need_full_wigner)
        inner = [m for m in module.modules() if isinstance(m, backend.convolution)]
        module._need_full_wigner = saved and any(_needs_full_wigner(m) for m in inner)
        if saved and not module._need_full_wigner:
            skipped.append(name or type(module).__name__)

    compiled.mark(model, any(c.runs_on == MIXSTACK for c in convs), products=rest_products, lowering=lowering)
    _forget_compiled(model)
    report = AccelerationReport(level, tuple(convs), tuple(skipped))
    logger.debug("%s", report)
    return report


def restore(model: torch.nn.Module) -> int:
    """Undo ``accelerate``: every SeZM convolution of ``model`` back on deepmd-kit's path, every
    SeZM descriptor building its Wigner blocks as before.  Returns how many convolutions moved."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    from .backends import present

    accelerated = {b.accelerated: b.convolution for b in present(model)}
    moved = 0
    for module in model.modules():
        if type(module) in accelerated:
            module.__class__ = accelerated[type(module)]
            module.__dict__.pop("_mixstack_level", None)
            moved += 1
        if _SAVED_WIGNER in module.__dict__:
            module._need_full_wigner = module.__dict__.pop(_SAVED_WIGNER)
    compiled.mark(model, False)
    _forget_compiled(model)
    return moved
