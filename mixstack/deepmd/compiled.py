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


def marked(model: torch.nn.Module) -> bool:
    """Whether ``model``'s compiled inference traces mixstack's operators whole."""
    return bool(model.__dict__.get(_MARK, False))


def rest_products(model: torch.nn.Module) -> str:
    """How a marked model's compiled inference runs the rest of the model's float32 products:
    ``"exact"`` (fp32, deepmd-kit's own), ``"compensated"`` or ``"kernel"`` (``rest_products``)."""
    return model.__dict__.get(_PRODUCTS, "exact")


def mark(model: torch.nn.Module, on: bool, *, products: str = "exact") -> None:
    """Mark (``on``) or unmark every deepmd-kit SeZM model in ``model`` (the modules with
    ``forward_common_lower``); their classes' ``forward_common_lower`` wrapped (``install``).
    ``products``: how the marked models' compiled inference runs the rest of their float32
    products (``config.REST_PRODUCTS``)."""
    config.rest_products_setting(products, "products")
    for module in model.modules():
        if not callable(getattr(type(module), "forward_common_lower", None)) or \
                not callable(getattr(type(module), "trace_and_compile", None)):
            continue
        if on:
            install(type(module))
            module.__dict__[_MARK] = True
            module.__dict__[_PRODUCTS] = products
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
