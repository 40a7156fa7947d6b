"""``mixstack.mixing_stack``: validate, pick the level's path, run it."""

from __future__ import annotations

import torch

from ..core.layout import validate_inputs
from ..dispatch.guards import forward_level, triton_installed
from ..dispatch.log import record
from . import level3, reference

if triton_installed():                 # Linux: the Triton levels; elsewhere level 0 runs alone
    from . import ops as stack  # noqa: F401  (registers the mixstack:: operators)


def mixing_stack(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True,
                 keep_input: bool = True):
    """The gated SO(2) mixing stack (docs/contract.md §1) at the active level.

    ``u0 (F, E, ROW)`` focus-major activations, ``alpha (E, F)`` per-edge focus
    weights, ``w0 (n_layers, F, m0, m0)``, ``w1 (n_layers, F, m1, m1)``,
    ``gw (n_layers - 1, F, focus_dim, lmax * focus_dim)``; returns the
    edge-major ``(E, F, ROW)`` result.  Differentiable in every input, to any
    order.  Level 0 (or a shape/dtype/device the kernels do not take) runs
    ``mixstack.stack.reference``; levels 1-3 run the Triton operator.

    ``keep_input=False`` (inference: energies and forces) lets levels 1-3 drop
    ``u0`` from what the backward keeps when no weight requires grad, which
    saves one ``(F, E, ROW)`` surface per call for the whole frame; first-order
    gradients are unchanged, a double backward then raises.
    """
    shape = validate_inputs(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim)
    level = forward_level(u0, shape.layout)
    if level == 0:
        record("fwd:reference")
        out = reference.forward(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                                apply_alpha=apply_alpha)[0]
        if out.requires_grad and not torch.compiler.is_compiling():
            out.register_hook(_record_reference_backward)
        return out
    if level == 3:
        level3.prepare(u0, focus_dim=focus_dim, lmax=lmax, apply_alpha=apply_alpha)
    out, _, _ = torch.ops.mixstack.stack_forward(
        u0.contiguous(), alpha.contiguous(), w0.contiguous(), w1.contiguous(), gw.contiguous(),
        lmax, focus_dim, apply_alpha, level, keep_input)
    return out


def _record_reference_backward(grad):
    record("bwd:reference")
    return grad
