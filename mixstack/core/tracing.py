"""Whether a call is being traced by a compiler or an exporter, asked of torch alone."""

from __future__ import annotations

import torch


def tracing(t: torch.Tensor) -> bool:
    """Whether a call on ``t`` is being traced: a compiler (``torch.compiler.is_compiling``), or
    ``make_fx`` and ``torch.export``, which that does not report: a fake ``t``, or a fake or
    proxy dispatch mode active (work run there would be traced, or run on fake tensors)."""
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import is_fake
    if is_fake(t):
        return True
    modes = torch._C._TorchDispatchModeKey
    return any(torch._C._get_dispatch_mode(m) is not None for m in (modes.FAKE, modes.PROXY))


def shapes_only(t: torch.Tensor) -> bool:
    """Whether an operator's body is being called for shapes alone: on fake tensors with no trace
    recording the body (the operator's fake implementation, while a trace records the operator
    itself).  A trace that records the body (a decomposition) needs its formulas."""
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t) and torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is None
