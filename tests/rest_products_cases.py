"""The bar of ``mixstack.deepmd.rest_products``' compensated products against float64, shared by
the CPU tests (the ATen form, the decomposition) and the interpreter's (the kernel form)."""

from __future__ import annotations

import torch

BOUND = 2.0 ** -20          # of the sum of |a_ik b_kj|: a few 2^-22 terms and fp32 accumulation


def relative_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``|out - a @ b|`` (the product in float64) relative to ``|a| @ |b|``."""
    exact = a.double() @ b.double()
    return ((out.double() - exact).abs() / (a.double().abs() @ b.double().abs())).max().item()
