"""The ``torch.library`` operators of the stack and their autograd.

``mixstack::stack_forward`` returns ``(result, z, y)`` and
``mixstack::stack_backward`` returns ``(grad_u0, grad_alpha)``.  Both are ``triton_op``s: ``torch.compile``
and ``torch.export`` trace into their bodies and see the Triton kernels.  A
body runs the kernels where they can run (CUDA, or any device under
``TRITON_INTERPRET=1``) and the reference formulas elsewhere, so the operators
trace and run on CPU too.

At level >= 2 the bodies take launch configs from the tuning tables
(``stack_fwd``, ``stack_bwd_relay``) and run the fused backward where the
``stack_bwd_fused`` entry names a config and the shape is in its regime; at
level 3 they run the compensated GEMMs where a validated
``stack_compensated`` entry exists for the key (else level 2); each body
records the path it ran in ``dispatch_log``.

Autograd: the forward saves its inputs (``u0`` only where it can be needed:
weight gradients or a double backward; ``keep_input=False`` drops it for
inference), ``z`` and ``y`` (the unscaled result
the alpha gradient reads; empty without alpha).  Both are marked
non-differentiable and never materialised as zero gradients.  The backward
runs the kernel relay for the gradients of ``u0`` and ``alpha``.  When weight
gradients are requested, or a double backward is being built
(``create_graph=True``), it runs ``reference.backward`` instead: plain tensor
ops that autograd differentiates again, on a differentiable recompute of ``z``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import triton_op

from .. import reference, tuning
from ..dispatch.guards import kernels_can_run, unsupported_reason
from ..dispatch.log import record
from ..layout import StackLayout
from . import configs, launchers


def _kernels_for(t: Tensor, layout: StackLayout) -> bool:
    return kernels_can_run(t) and unsupported_reason(layout, t.dtype) is None


@triton_op("mixstack::stack_forward", mutates_args=())
def stack_forward(u0: Tensor, alpha: Tensor, w0: Tensor, w1: Tensor, gw: Tensor,
                  lmax: int, focus_dim: int, apply_alpha: bool,
                  level: int, keep_input: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """The stack forward: ``(result (E, F, ROW), z (n_layers - 1, F, E, ROW), y)``.

    ``y`` is the result before alpha, ``(E, F, ROW)`` with alpha and empty without.
    ``keep_input`` only tells autograd whether to save ``u0`` (see ``_setup_context``).
    """
    layout = StackLayout(lmax, focus_dim)
    if _kernels_for(u0, layout):
        n_focus = u0.shape[0]
        comp_cfg = _tuned("stack_compensated", u0, n_focus, layout, apply_alpha, level, log=False)
        if comp_cfg is not None:
            record("fwd:compensated")
            return launchers.stack_forward(u0, alpha, w0, w1, gw, layout, apply_alpha, comp_cfg,
                                        compensated=True)
        record("fwd:triton")
        gemm_cfg = _tuned("stack_fwd", u0, n_focus, layout, apply_alpha, level)
        return launchers.stack_forward(u0, alpha, w0, w1, gw, layout, apply_alpha, gemm_cfg)
    record("fwd:reference")
    out, z, y = reference.forward_state(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                                        apply_alpha=apply_alpha)
    y = y.contiguous() if apply_alpha else u0.new_empty((0,))
    return out.contiguous(), z.contiguous(), y


@triton_op("mixstack::stack_backward", mutates_args=())
def stack_backward(grad_out: Tensor, y: Tensor, z: Tensor, alpha: Tensor, w0: Tensor, w1: Tensor,
                   gw: Tensor, lmax: int, focus_dim: int, apply_alpha: bool,
                   level: int) -> tuple[Tensor, Tensor]:
    """Gradients of ``u0`` (focus-major) and ``alpha`` (empty without alpha) from the saved state."""
    layout = StackLayout(lmax, focus_dim)
    if _kernels_for(grad_out, layout):
        n_focus = grad_out.shape[1]
        comp_cfg = _tuned("stack_compensated", grad_out, n_focus, layout, apply_alpha, level, log=False)
        if comp_cfg is not None:
            record("bwd:compensated")
            return launchers.stack_backward(grad_out, y, z, alpha, w0, w1, gw, layout, apply_alpha,
                                         comp_cfg, compensated=True)
        gemm_cfg = _tuned("stack_bwd_relay", grad_out, n_focus, layout, apply_alpha, level)
        fused_cfg = None
        if configs.fused_supported(layout):
            fused_cfg = _tuned("stack_bwd_fused", grad_out, n_focus, layout, apply_alpha, level, log=False)
        record("bwd:relay" if fused_cfg is None else "bwd:fused")
        return launchers.stack_backward(grad_out, y, z, alpha, w0, w1, gw, layout, apply_alpha,
                                     gemm_cfg, fused_cfg)
    record("bwd:reference")
    g, ga, *_ = reference.backward(grad_out, y, z, None, alpha, w0, w1, gw, lmax=lmax,
                                   focus_dim=focus_dim, apply_alpha=apply_alpha)
    return g.contiguous(), ga.contiguous() if apply_alpha else grad_out.new_empty((0,))


def _tuned(family: str, t: Tensor, n_focus: int, layout: StackLayout, apply_alpha: bool, level: int,
           log: bool = True) -> dict | None:
    """The tuned launch config of ``family`` for this call, or ``None``: the level-1
    config (for the fused family the relay, for the compensated family the exact
    fp32 stack).  Level >= 2 reads the tables; the compensated family needs
    level 3 and a validated entry.  Read at trace time under a compiler, so the
    config becomes a constant of the graph."""
    if level < tuning.families.family(family).candidate_level:
        return None
    if family == "stack_compensated":
        return _compensated(t, n_focus, layout, apply_alpha)
    cfg = tuning.tuned_config(family, focus_dim=layout.focus_dim, lmax=layout.lmax, n_focus=int(n_focus),
                              apply_alpha=apply_alpha, device=t.device)
    if cfg is not None and log:
        record(f"cfg:{family}")
    return cfg


def _compensated(t: Tensor, n_focus: int, layout: StackLayout, apply_alpha: bool) -> dict | None:
    """Level 3's config for this call: the ``stack_compensated`` entry (swept, or recorded by
    the level-3 policy at first use, ``mixstack.level3``), or ``None``: level 2 runs, and the
    log says ``level3:level2`` (an entry of ``None``, a failed validation, or no entry where
    the policy was not sure).  ``level3:policy``: the config came from the policy."""
    key = tuning.shape_key(focus_dim=layout.focus_dim, lmax=layout.lmax, n_focus=int(n_focus),
                           apply_alpha=apply_alpha)
    hit = tuning.find("stack_compensated", key, device_name=tuning.device_name(t.device))
    cfg = None if hit is None else hit[1]["config"]
    if cfg is None:
        record("level3:level2")
        return None
    if hit[1].get("source") == "policy":
        record("level3:policy")
    return dict(cfg)


def _setup_context(ctx, inputs, output):
    """Save what the backward reads.  ``u0`` is read only for weight gradients and a
    double backward; with ``keep_input=False`` and no weight requiring grad it is
    not saved, so an inference frame does not hold every stack's input (an
    ``(F, E, ROW)`` surface each) from the forward until its backward."""
    u0, alpha, w0, w1, gw, lmax, focus_dim, apply_alpha, level, keep_input = inputs
    _, z, y = output
    if not (keep_input or any(w.requires_grad for w in (w0, w1, gw))):
        u0 = None
    ctx.save_for_backward(u0, alpha, w0, w1, gw, y, z)
    ctx.params = dict(lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha)
    ctx.level = level
    ctx.mark_non_differentiable(z, y)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, _grad_z, _grad_y):
    none = (None,) * 10
    if grad_out is None:
        return none
    u0, alpha, w0, w1, gw, y, z = ctx.saved_tensors
    p = ctx.params
    weights = any(ctx.needs_input_grad[2:5])
    if weights or torch.is_grad_enabled():
        if u0 is None:
            raise RuntimeError(
                "mixing_stack ran with keep_input=False (inference; a mixstack potential in eval mode), "
                "so its input u0 was not saved, and a double backward (create_graph=True) needs it: "
                "call mixing_stack with keep_input=True, or put the module in train mode")
        record("bwd:reference")
        if torch.is_grad_enabled():            # double backward: z and y must carry their graph
            _, z, y = reference.forward_state(u0, alpha, w0, w1, gw, **p)
        g, ga, dw0, dw1, dgw = reference.backward(grad_out, y, z, u0, alpha, w0, w1, gw,
                                                  weights=weights, **p)
        return (g, ga, dw0, dw1, dgw) + none[5:]
    if grad_out.stride(-1) != 1:       # a broadcast over F (stride 0) is read in place
        grad_out = grad_out.contiguous()
    g, ga = torch.ops.mixstack.stack_backward(grad_out, y, z, alpha, w0, w1, gw,
                                              p["lmax"], p["focus_dim"], p["apply_alpha"], ctx.level)
    return (g, ga if p["apply_alpha"] else None) + none[2:]


stack_forward.register_autograd(_backward, setup_context=_setup_context)
