"""deepmd-kit's compiled inference (``DP_COMPILE_INFER=1``) with mixstack's operators kept whole.

deepmd-kit's SeZM model traces its ``core_compute`` with ``make_fx`` inside ``forward_common_lower``
and lowers it through AOTAutograd and Inductor.  A trace outside ``guards.opaque_operators`` records
the convolution's reference formulas (contract §7), whose per-edge einsums Inductor cannot make
fast (BENCHMARKS.md, "`FrameRunner` measured").
``install`` wraps the SeZM model class's ``forward_common_lower`` once, at runtime (deepmd-kit's
files are not edited): a model that ``mark`` marked (``accelerate`` does, for a model with
convolutions on mixstack) runs it inside ``opaque_operators`` in evaluation on a GPU.  In training
(its ``torch.compile`` path with a double backward, not measured with the operators whole), on a
CPU (where mixstack's convolution runs its reference formulas anyway, and the context would change
how deepmd-kit's own Triton operators compile) and for every other model deepmd-kit's own runs
unchanged.
A model marked with ``products="compensated"`` or ``"kernel"`` (``accelerate(..., rest_products=...)``)
compiles the rest of its float32 products as compensated fp16 ones (``rest_products``): the trace happens at
the first compiled frame, inside this wrapper.
A model marked with ``lowering="fused"`` lowers its inference graph with Inductor's own fusion size and
persistent reductions instead of deepmd-kit's caps on both (``LOWERINGS``).
"""

from __future__ import annotations

import functools

import torch

from ..core import config
from ..dispatch.guards import opaque_operators
from .rest_products import for_model

_MARK = "_mixstack_opaque_trace"
_PRODUCTS = "_mixstack_rest_products"
_WRAPPED = "_mixstack_opaque"
_OPTIONS = "_inductor_compile_options"            # deepmd-kit's hook for its graphs' Inductor options

# "deepmd": deepmd-kit's option set as it is; "fused": without its two caps below, which it sets for
# its dynamic training graph (a fused Triton reduction that failed to build), so that the inference
# graph's pointwise chains and small reductions fuse as Inductor would fuse them
LOWERINGS = ("deepmd", "fused")
_FUSION_CAPS = ("max_fusion_size", "triton.persistent_reductions")


def marked(model: torch.nn.Module) -> bool:
    """Whether ``model``'s compiled inference traces mixstack's operators whole."""
    return bool(model.__dict__.get(_MARK, False))


def rest_products(model: torch.nn.Module) -> str:
    """How a marked model's compiled inference runs the rest of the model's float32 products:
    ``"exact"`` (fp32, deepmd-kit's own), ``"compensated"`` or ``"kernel"`` (``rest_products``)."""
    return model.__dict__.get(_PRODUCTS, "exact")


def lowering_setting(value: str, name: str) -> str:
    """``value`` if it is one of ``LOWERINGS``; else a ``ValueError`` naming ``name``."""
    if value not in LOWERINGS:
        raise ValueError(f"{name} must be one of {', '.join(LOWERINGS)}, got {value!r}")
    return value


def lowering(model: torch.nn.Module) -> str:
    """How a marked model's compiled inference graph is lowered (``LOWERINGS``)."""
    return "fused" if _OPTIONS in model.__dict__ else "deepmd"


def _fused_options(model: torch.nn.Module, *, inference: bool = False) -> dict:
    """deepmd-kit's Inductor options for ``model``, its fusion caps dropped for an inference graph."""
    options = type(model)._inductor_compile_options(model, inference=inference)
    return {k: v for k, v in options.items() if k not in _FUSION_CAPS} if inference else options


def mark(model: torch.nn.Module, on: bool, *, products: str = "exact", lowering: str = "deepmd") -> None:
    """Mark (``on``) or unmark every deepmd-kit SeZM model in ``model`` (the modules with
    ``forward_common_lower``); their classes' ``forward_common_lower`` wrapped (``install``).
    ``products``: how the marked models' compiled inference runs the rest of their float32
    products (``config.REST_PRODUCTS``); ``lowering``: how Inductor lowers their inference graph
    (``LOWERINGS``)."""
    config.rest_products_setting(products, "products")
    lowering_setting(lowering, "lowering")
    for module in model.modules():
        if not callable(getattr(type(module), "forward_common_lower", None)) or \
                not callable(getattr(type(module), "trace_and_compile", None)):
            continue
        module.__dict__.pop(_OPTIONS, None)
        if on:
            install(type(module))
            module.__dict__[_MARK] = True
            module.__dict__[_PRODUCTS] = products
            if lowering == "fused" and callable(getattr(type(module), _OPTIONS, None)):
                module.__dict__[_OPTIONS] = functools.partial(_fused_options, module)
        else:
            module.__dict__.pop(_MARK, None)
            module.__dict__.pop(_PRODUCTS, None)


def _on_cuda(model: torch.nn.Module) -> bool:
    param = next(model.parameters(), None)
    return param is not None and param.is_cuda


def install(cls: type) -> None:
    """Wrap ``cls.forward_common_lower`` (once): a marked model in evaluation on a GPU runs it
    inside ``opaque_operators``."""
    original = cls.__dict__.get("forward_common_lower")
    if original is None:                    # inherited: wrap where it is defined
        owner = next(c for c in cls.__mro__ if "forward_common_lower" in c.__dict__)
        return install(owner)
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def forward_common_lower(self, *args, **kwargs):
        if self.training or not marked(self) or not _on_cuda(self):
            return original(self, *args, **kwargs)
        with opaque_operators(), for_model(rest_products(self)):
            return original(self, *args, **kwargs)

    setattr(forward_common_lower, _WRAPPED, True)
    cls.forward_common_lower = forward_common_lower
