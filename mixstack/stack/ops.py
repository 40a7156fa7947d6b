"""The ``torch.library`` operators of the stack and their autograd.

``mixstack::stack_forward`` returns ``(result, z, y)``; ``mixstack::stack_backward`` returns
``(grad_u0, grad_alpha, grad_w0, grad_w1, grad_gw, chain)`` (what was not asked for is
empty); ``mixstack::stack_double_backward`` returns the derivative of the backward
(docs/contract.md §1, "Double backward").  All are ``triton_op``s: ``torch.compile`` and
``torch.export`` trace into their bodies and see the Triton kernels.  A body runs the kernels
where they can run (CUDA, or any device under ``TRITON_INTERPRET=1``) and the reference
formulas elsewhere, so the operators trace and run on CPU too.

At level >= 2 the bodies take launch configs from the tuning tables (``stack_fwd``,
``stack_bwd_relay``, ``stack_wgrad``) and run the fused backward where the ``stack_bwd_fused``
entry names a config and the guards of docs/contract.md §4 hold; at level 3 they run the
compensated GEMMs where a validated ``stack_compensated`` entry exists for the key, and the
compensated weight reductions where a ``stack_wgrad_compensated`` entry does (else level 2);
each body records the path it ran in ``dispatch_log``.

Autograd (docs/contract.md §4, "Training"):

- the forward saves its inputs (``u0`` only where weight gradients can be asked for, or with
  ``keep_input``), ``z`` and ``y`` (the unscaled result the alpha gradient reads; empty
  without alpha).  ``z`` and ``y`` are differentiable outputs: the double backward hands back
  cotangents of them, which the forward's backward adds where they enter the chain;
- the forward's backward runs ``stack_backward``: the relay or fused kernels for ``u0`` and
  ``alpha`` alone; the relay with the weight reductions (``wgrad:*``) when a weight gradient
  is wanted, which it learns from the autograd engine (a force pass,
  ``autograd.grad(energy, positions)``, never computes them); when a graph is being built
  (``create_graph``) it keeps the relay's chain for the double backward;
- ``stack_backward``'s own autograd runs ``stack_double_backward`` (``bwd2:*``);
- the guards that run the reference formulas instead, differentiable by autograd
  (``bwd:reference``): a weight gradient asked for while a graph is being built, and any
  derivative of third order.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.library import triton_op

from .. import tuning
from ..core.layout import StackLayout
from ..dispatch.guards import kernels_can_run, unsupported_reason
from ..dispatch.log import record
from ..tuning import configs
from . import gemm, launchers, level3, reference, training


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
def stack_backward(grad_out: Optional[Tensor], y: Tensor, z: Tensor, alpha: Tensor, w0: Tensor, w1: Tensor,
                   gw: Tensor, lmax: int, focus_dim: int, apply_alpha: bool, level: int,
                   u0: Optional[Tensor] = None, grad_z: Optional[Tensor] = None,
                   grad_y: Optional[Tensor] = None, weights: bool = False,
                   keep_chain: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients from the saved state: ``(grad_u0 (F, E, ROW), grad_alpha, grad_w0, grad_w1, grad_gw,
    chain)``.  ``grad_alpha`` is empty without alpha; the weight gradients are empty unless
    ``weights`` (which needs ``u0``); ``chain`` ``(n_gated, F, E, ROW)``, the cotangent of each gated
    layer's output, is empty unless ``keep_chain``.  ``grad_z`` and ``grad_y``: cotangents of the
    saved ``z`` and ``y`` themselves (from the double backward), added into the chain.
    ``grad_out=None``: the result has no cotangent (only ``grad_z`` / ``grad_y`` arrived)."""
    layout = StackLayout(lmax, focus_dim)
    sources = grad_z is not None or grad_y is not None
    if weights and u0 is None:
        raise ValueError("stack_backward: weights=True needs u0 (the layer inputs are rebuilt from it)")
    if grad_out is None and not (sources and not keep_chain):
        raise ValueError("stack_backward: grad_out=None is for a backward of the double backward's "
                         "cotangents of z and y alone")
    if _kernels_for(z, layout):
        n_focus = z.shape[1]
        comp_cfg = _tuned("stack_compensated", z, n_focus, layout, apply_alpha, level, log=False)
        if not (weights or sources or keep_chain):
            if comp_cfg is not None:
                record("bwd:compensated")
                g, ga = launchers.stack_backward(grad_out, y, z, alpha, w0, w1, gw, layout, apply_alpha,
                                                 comp_cfg, compensated=True)
                return g, ga, *_empties(z, 4)
            gemm_cfg = _tuned("stack_bwd_relay", z, n_focus, layout, apply_alpha, level)
            fused_cfg = None
            if configs.fused_supported(layout):
                fused_cfg = _tuned("stack_bwd_fused", z, n_focus, layout, apply_alpha, level, log=False)
            record("bwd:relay" if fused_cfg is None else "bwd:fused")
            g, ga = launchers.stack_backward(grad_out, y, z, alpha, w0, w1, gw, layout, apply_alpha,
                                             gemm_cfg, fused_cfg)
            return g, ga, *_empties(z, 4)
        compensated = comp_cfg is not None
        gemm_cfg = comp_cfg if compensated else _tuned("stack_bwd_relay", z, n_focus, layout,
                                                       apply_alpha, level)
        record("bwd:compensated" if compensated else "bwd:relay")
        if keep_chain:
            if weights or sources:
                raise ValueError("stack_backward: keep_chain is for a backward without weight gradients "
                                 "or cotangents of z and y")
            g, ga, chain = training.backward_chain(grad_out, y, z, alpha, w0, w1, gw, layout, apply_alpha,
                                                   gemm_cfg, compensated)
            return g, ga, *_empties(z, 3), chain
        plan = _wgrad_plan(z, n_focus, layout, apply_alpha, level) if weights else None
        g, ga, dw0, dw1, dgw = training.backward_with_weights(
            grad_out, y, z, u0, alpha, w0, w1, gw, layout, apply_alpha, gemm_cfg, plan, compensated,
            grad_z=grad_z, grad_y=grad_y)
        return g, ga, dw0, dw1, dgw, _empties(z, 1)[0]
    record("bwd:reference")
    if grad_out is None:
        grad_out = z.new_zeros((z.shape[2], z.shape[1], z.shape[3]))
    g, ga, dw0, dw1, dgw, chain = reference.backward_state(
        grad_out, y, z, u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha,
        weights=weights, grad_z=grad_z, grad_y=grad_y)
    outs = (g, ga if apply_alpha else None, *((dw0, dw1, dgw) if weights else (None,) * 3),
            chain if keep_chain else None)
    return tuple(z.new_empty((0,)) if t is None else t.contiguous() for t in outs)


@triton_op("mixstack::stack_double_backward", mutates_args=())
def stack_double_backward(v: Optional[Tensor], w: Optional[Tensor], grad_out: Tensor, y: Tensor, z: Tensor,
                          chain: Tensor, alpha: Tensor, w0: Tensor, w1: Tensor, gw: Tensor, lmax: int,
                          focus_dim: int, apply_alpha: bool, level: int, weights: bool,
                          need_grad_out: bool = True,
                          need_alpha: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The derivative of ``stack_backward``: the gradients of ``<grad_u0, v> + <grad_alpha, w>`` with
    respect to ``grad_out``, ``y``, ``z``, ``alpha`` and (with ``weights``) the weights,
    ``(d_grad_out, d_y, d_z, d_alpha, d_w0, d_w1, d_gw)``; what does not exist is empty
    (``d_y`` without alpha or ``w``, ``d_alpha`` without alpha or ``need_alpha``, ``d_grad_out``
    without ``need_grad_out``, the weights' without ``weights``).  ``chain``: ``stack_backward``'s
    (empty: recomputed)."""
    layout = StackLayout(lmax, focus_dim)
    if _kernels_for(grad_out, layout):
        n_focus = grad_out.shape[1]
        comp_cfg = _tuned("stack_compensated", grad_out, n_focus, layout, apply_alpha, level, log=False)
        compensated = comp_cfg is not None
        gemm_cfg = comp_cfg if compensated else _tuned("stack_fwd", grad_out, n_focus, layout, apply_alpha, level)
        record("bwd2:compensated" if compensated else "bwd2:triton")
        plan = _wgrad_plan(grad_out, n_focus, layout, apply_alpha, level) if weights else None
        return training.double_backward(v, w, grad_out, y, z, chain, alpha, w0, w1, gw, layout, apply_alpha,
                                        gemm_cfg, plan, compensated, need_grad_out=need_grad_out,
                                        need_alpha=need_alpha)
    record("bwd:reference")
    outs = list(reference.double_backward(v, w, grad_out, y, z, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                                          apply_alpha=apply_alpha, chain=chain if chain.numel() else None,
                                          weights=weights))
    outs[0] = outs[0] if need_grad_out else None
    outs[3] = outs[3] if need_alpha else None
    return tuple(grad_out.new_empty((0,)) if t is None else t.contiguous() for t in outs)


def _empties(t: Tensor, n: int) -> tuple[Tensor, ...]:
    """``n`` distinct empty tensors: the outputs a call was not asked for (an operator's
    outputs may not alias each other)."""
    return tuple(t.new_empty((0,)) for _ in range(n))


def _wgrad_plan(t: Tensor, n_focus: int, layout: StackLayout, apply_alpha: bool, level: int):
    """How this call's weight reductions run (``training.WgradPlan``), recorded: compensated at
    level 3 where a validated ``stack_wgrad_compensated`` entry exists, else exact with the
    ``stack_wgrad`` config (level >= 2) or the level-1 config."""
    cfg = _tuned("stack_wgrad_compensated", t, n_focus, layout, apply_alpha, level, log=False)
    if cfg is not None:
        record("wgrad:compensated")
        return training.WgradPlan(cfg, compensated=True)
    record("wgrad:triton")
    return training.WgradPlan(_tuned("stack_wgrad", t, n_focus, layout, apply_alpha, level))


def _tuned(family: str, t: Tensor, n_focus: int, layout: StackLayout, apply_alpha: bool, level: int,
           log: bool = True) -> dict | None:
    """The tuned launch config of ``family`` for this call, or ``None``: the level-1
    config (for the fused family the relay, for the compensated families the exact
    fp32 kernels).  Level >= 2 reads the tables; the compensated families need
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
    the level-3 policy at first use, ``mixstack.stack.level3``), or ``None``: level 2 runs, and the
    log says ``level3:level2`` (an entry of ``None``, a failed validation, or no entry where
    the policy was not sure).  ``level3:policy``: the config came from the policy;
    ``level3:tma``: a ``stack_compensated_tma`` entry runs the TMA-fed GEMMs with its config."""
    key = tuning.shape_key(focus_dim=layout.focus_dim, lmax=layout.lmax, n_focus=int(n_focus),
                           apply_alpha=apply_alpha)
    plan = level3.resolve(key, tuning.device_name(t.device))
    if plan.config is None:
        record("level3:level2")
        return None
    if plan.source == "policy":
        record("level3:policy")
    if plan.tma is not None:                                   # measured faster: the TMA-fed kernel
        record("level3:tma")
        return dict(plan.tma, **{gemm.TMA_FIELD: True})
    return plan.config


def _setup_context(ctx, inputs, output):
    """Save what the backward reads.  ``u0`` is read only for weight gradients; with
    ``keep_input=False`` and no weight requiring grad it is not saved, so an inference
    frame does not hold every stack's input (an ``(F, E, ROW)`` surface each) from the
    forward until its backward."""
    u0, alpha, w0, w1, gw, lmax, focus_dim, apply_alpha, level, keep_input = inputs
    _, z, y = output
    if not (keep_input or any(w.requires_grad for w in (w0, w1, gw))):
        u0 = None
    ctx.save_for_backward(u0, alpha, w0, w1, gw, y, z)
    ctx.params = dict(lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha)
    ctx.shape = (inputs[0].shape[1], inputs[0].shape[0], inputs[0].shape[2])
    ctx.level = level
    if not apply_alpha:                  # y is an empty placeholder without alpha
        ctx.mark_non_differentiable(y)
    ctx.set_materialize_grads(False)


def _weights_wanted(ctx, weights) -> bool:
    """Whether this backward must compute a weight gradient: a weight requires grad *and* the
    autograd engine will use its gradient in this pass.  ``autograd.grad(energy, positions)``
    (forces) needs none, though the weights require grad; asking the engine keeps such a
    pass on the force path (and, with ``create_graph``, differentiable by the double
    backward).  Where the engine cannot answer (outside a backward pass, a compiler
    tracing), every weight that requires grad is wanted."""
    needed = ctx.needs_input_grad[2:5]
    if not any(needed):
        return False
    will_run = getattr(torch._C, "_will_engine_execute_node", None)
    if will_run is None or torch.compiler.is_compiling():
        return True
    for w, need in zip(weights, needed):
        if not need:
            continue
        try:
            if will_run(torch.autograd.graph.get_gradient_edge(w).node):
                return True
        except (RuntimeError, AttributeError):
            return True
    return False


def _backward(ctx, grad_out, grad_z, grad_y):
    none = (None,) * 10
    if grad_out is None and grad_z is None and grad_y is None:
        return none
    u0, alpha, w0, w1, gw, y, z = ctx.saved_tensors
    p = ctx.params
    if grad_y is not None and not p["apply_alpha"]:
        grad_y = None
    if grad_out is not None and grad_out.stride(-1) != 1:    # a broadcast over F (stride 0) is read in place
        grad_out = grad_out.contiguous()
    weights = _weights_wanted(ctx, (w0, w1, gw))
    sources = grad_z is not None or grad_y is not None
    if weights and u0 is None:           # not reachable: u0 is saved whenever a weight requires grad
        raise RuntimeError("mixing_stack: a weight gradient is wanted but the input u0 was not saved")
    if grad_out is None and not sources:
        return none
    if torch.is_grad_enabled() and (weights or sources):
        # Guards (docs/contract.md §4): a weight gradient while a graph is being built, or a third
        # derivative.  The reference formulas, on the saved z and y (outputs of this node, so
        # autograd's next derivative comes back here as their cotangents).
        record("bwd:reference")
        if grad_out is None:
            grad_out = z.new_zeros(ctx.shape)
        g, ga, dw0, dw1, dgw = reference.backward(grad_out, y, z, u0, alpha, w0, w1, gw, weights=weights,
                                                  grad_z=grad_z, grad_y=grad_y, **p)
    else:
        g, ga, dw0, dw1, dgw, _ = torch.ops.mixstack.stack_backward(
            grad_out, y, z, alpha, w0, w1, gw, p["lmax"], p["focus_dim"], p["apply_alpha"], ctx.level,
            u0 if weights else None, grad_z, grad_y, weights, torch.is_grad_enabled())
    grads = [g, ga if p["apply_alpha"] else None]
    grads += [d if weights and need else None for d, need in zip((dw0, dw1, dgw), ctx.needs_input_grad[2:5])]
    return tuple(grads) + none[5:]


stack_forward.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output):
    """Save what the double backward reads: the backward's inputs and its chain."""
    grad_out, y, z, alpha, w0, w1, gw, lmax, focus_dim, apply_alpha, level = inputs[:11]
    u0, grad_z, grad_y, weights, keep_chain = (list(inputs[11:]) + [None, None, None, False, False])[:5]
    ctx.save_for_backward(grad_out, y, z, alpha, w0, w1, gw, output[5])
    ctx.params = dict(lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha)
    ctx.level = level
    ctx.first_order_only = bool(weights) or grad_z is not None or grad_y is not None
    ctx.mark_non_differentiable(*output[2:])
    ctx.set_materialize_grads(False)


def _double_backward(ctx, v, w, *_):
    none = (None,) * 16
    if v is None and w is None:
        return none
    if ctx.first_order_only:
        raise RuntimeError("mixstack: stack_backward with weight gradients or cotangents of z and y is "
                           "not differentiable; mixing_stack's autograd never differentiates it (its "
                           "guards run the reference formulas instead)")
    grad_out, y, z, alpha, w0, w1, gw, chain = ctx.saved_tensors
    p = ctx.params
    w = w if p["apply_alpha"] else None
    weights = any(ctx.needs_input_grad[4:7])
    if torch.is_grad_enabled():
        # A third derivative: the reference formulas of the double backward, made of ordinary
        # ops that autograd differentiates again (the chain recomputed, differentiably).
        record("bwd:reference")
        outs = reference.double_backward(v, w, grad_out, y, z, alpha, w0, w1, gw, weights=weights, **p)
    else:
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        outs = torch.ops.mixstack.stack_double_backward(
            v, w, grad_out, y, z, chain, alpha, w0, w1, gw, p["lmax"], p["focus_dim"], p["apply_alpha"],
            ctx.level, weights, ctx.needs_input_grad[0], ctx.needs_input_grad[3])
        outs = tuple(None if t.numel() == 0 and t.dim() == 1 and t.shape[0] == 0 else t for t in outs)
    d_grad_out, d_y, d_z, d_alpha, dw0, dw1, dgw = outs
    grads = (d_grad_out, d_y, d_z, d_alpha if p["apply_alpha"] else None)
    grads += tuple(d if need else None for d, need in zip((dw0, dw1, dgw), ctx.needs_input_grad[4:7]))
    return grads + none[7:]


stack_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)
