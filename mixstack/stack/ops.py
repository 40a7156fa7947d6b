"""The ``torch.library`` operators of the stack and their autograd.

``mixstack::stack_forward`` returns ``(result, z, y)``; ``mixstack::stack_backward`` returns
``(grad_u0, grad_alpha, grad_w0, grad_w1, grad_gw, chain)`` (what was not asked for is
empty); ``mixstack::stack_double_backward`` returns the derivative of the backward
(docs/contract.md §1, "Double backward").  The two backward operators take the weights as one
list ``[w0, w1, gw]``, the stack's static description as ``spec = [lmax, focus_dim,
apply_alpha, level]`` (``StackSpec`` and the level on the Python side) and the optional
outputs wanted as ``needs``, a list of flags.  All are ``triton_op``s: ``torch.compile`` and
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
from ..tuning import configs, products
from . import gemm, launchers, level3, reference, training
from .launchers import LaunchPlan
from .values import Saved, StackSpec, Weights


def _kernels_for(t: Tensor, layout: StackLayout) -> bool:
    return kernels_can_run(t) and unsupported_reason(layout, t.dtype) is None


def _op_spec(stack: StackSpec, level: int) -> list[int]:
    """The operators' ``spec`` argument: ``[lmax, focus_dim, apply_alpha, level]``."""
    return [stack.layout.lmax, stack.layout.focus_dim, int(stack.apply_alpha), level]


def _unpack(spec: list[int]) -> tuple[StackSpec, int]:
    """``(StackSpec, level)`` of an operator's ``spec`` argument."""
    lmax, focus_dim, apply_alpha, level = spec
    return StackSpec.of(lmax, focus_dim, bool(apply_alpha)), level


@triton_op("mixstack::stack_forward", mutates_args=())
def stack_forward(u0: Tensor, alpha: Tensor, w0: Tensor, w1: Tensor, gw: Tensor,
                  lmax: int, focus_dim: int, apply_alpha: bool,
                  level: int, keep_input: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """The stack forward: ``(result (E, F, ROW), z (n_layers - 1, F, E, ROW), y)``.

    ``y`` is the result before alpha, ``(E, F, ROW)`` with alpha and empty without.
    ``keep_input`` only tells autograd whether to save ``u0`` (see ``_setup_context``).
    """
    stack = StackSpec.of(lmax, focus_dim, apply_alpha)
    if _kernels_for(u0, stack.layout):
        n_focus = u0.shape[0]
        weights = Weights(w0, w1, gw)
        comp_cfg = _tuned("stack_compensated", u0, n_focus, stack, level, log=False)
        if comp_cfg is not None:
            record("fwd:compensated")
            return launchers.stack_forward(u0, alpha, weights, stack, LaunchPlan(comp_cfg, compensated=True))
        record("fwd:triton")
        _record_products(stack, u0)
        gemm_cfg = _tuned("stack_fwd", u0, n_focus, stack, level)
        return launchers.stack_forward(u0, alpha, weights, stack, LaunchPlan(gemm_cfg))
    record("fwd:reference")
    out, z, y = reference.forward_state(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                                        apply_alpha=apply_alpha)
    y = y.contiguous() if apply_alpha else u0.new_empty((0,))
    return out.contiguous(), z.contiguous(), y


@triton_op("mixstack::stack_backward", mutates_args=())
def stack_backward(grad_out: Optional[Tensor], y: Tensor, z: Tensor, alpha: Tensor, weights: list[Tensor],
                   spec: list[int], needs: list[bool], u0: Optional[Tensor], grad_z: Optional[Tensor],
                   grad_y: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients from the saved state: ``(grad_u0 (F, E, ROW), grad_alpha, grad_w0, grad_w1, grad_gw,
    chain)``.

    ``weights`` is ``[w0, w1, gw]``; ``spec`` is ``[lmax, focus_dim, apply_alpha, level]``;
    ``needs`` is ``[weight gradients, chain]``, the optional outputs wanted: the weight
    gradients (which need ``u0``) and ``chain`` ``(n_gated, F, E, ROW)``, the cotangent of each
    gated layer's output; what is not wanted comes back empty, as ``grad_alpha`` does without
    alpha.  ``grad_z`` and ``grad_y``: cotangents of the saved ``z`` and ``y`` themselves (from
    the double backward), added into the chain.  ``grad_out=None``: the result has no cotangent
    (only ``grad_z`` / ``grad_y`` arrived)."""
    stack, level = _unpack(spec)
    want_weights, keep_chain = needs
    sources = grad_z is not None or grad_y is not None
    if want_weights and u0 is None:
        raise ValueError("stack_backward: weight gradients need u0 (the layer inputs are rebuilt from it)")
    if grad_out is None and not (sources and not keep_chain):
        raise ValueError("stack_backward: grad_out=None is for a backward of the double backward's "
                         "cotangents of z and y alone")
    if keep_chain and (want_weights or sources):
        raise ValueError("stack_backward: the chain is kept by a backward without weight gradients "
                         "or cotangents of z and y")
    saved, w = Saved(z, y, alpha, u0), Weights(*weights)
    if _kernels_for(z, stack.layout):
        return _backward_kernels(grad_out, saved, w, stack, level, needs, (grad_z, grad_y))
    record("bwd:reference")
    if grad_out is None:
        grad_out = z.new_zeros(saved.edge_major())
    g, ga, dw0, dw1, dgw, chain = reference.backward_state(grad_out, saved, w, stack, weight_grads=want_weights,
                                                           grad_z=grad_z, grad_y=grad_y)
    outs = (g, ga if stack.apply_alpha else None, *((dw0, dw1, dgw) if want_weights else (None,) * 3),
            chain if keep_chain else None)
    return tuple(z.new_empty((0,)) if t is None else t.contiguous() for t in outs)


def _backward_kernels(grad_out, saved: Saved, weights: Weights, stack: StackSpec, level: int, needs, sources):
    """``stack_backward`` on the kernels: the force path (``_force_plan``) where nothing but
    ``grad_u0`` and ``grad_alpha`` is asked for, else the relay of ``training`` that keeps its
    chain, or computes the weight gradients and adds the cotangents ``sources = (grad_z,
    grad_y)``."""
    want_weights, keep_chain = needs
    grad_z, grad_y = sources
    z = saved.z
    comp_cfg = _tuned("stack_compensated", z, saved.n_focus, stack, level, log=False)
    if not (want_weights or keep_chain or grad_z is not None or grad_y is not None):
        g, ga = launchers.stack_backward(grad_out, saved, weights, stack, _force_plan(z, stack, level, comp_cfg))
        return g, ga, *_empties(z, 4)
    plan = _relay_plan(z, stack, level, comp_cfg)
    if keep_chain:
        g, ga, chain = training.backward_chain(grad_out, saved, weights, stack, plan)
        return g, ga, *_empties(z, 3), chain
    wgrad = _wgrad_plan(z, saved.n_focus, stack, level) if want_weights else None
    grads = training.backward_with_weights(grad_out, saved, weights, stack, plan, wgrad, grad_z=grad_z, grad_y=grad_y)
    return *grads, _empties(z, 1)[0]


def _force_plan(z: Tensor, stack: StackSpec, level: int, comp_cfg: dict | None) -> LaunchPlan:
    """How the force path's backward runs, recorded: the compensated relay where level 3 has a
    config, else the relay with its tuned config, or the fused backward where its family names
    a config (docs/contract.md §4)."""
    if comp_cfg is not None:
        record("bwd:compensated")
        return LaunchPlan(comp_cfg, compensated=True)
    n_focus = z.shape[1]
    gemm_cfg = _tuned("stack_bwd_relay", z, n_focus, stack, level)
    blas = _record_products(stack, z)
    fused_cfg = None
    if configs.fused_supported(stack.layout) and not blas:                  # the fused kernel's products are Triton's
        fused_cfg = _tuned("stack_bwd_fused", z, n_focus, stack, level, log=False)
    record("bwd:relay" if fused_cfg is None else "bwd:fused")
    return LaunchPlan(gemm_cfg, fused_cfg)


def _relay_plan(z: Tensor, stack: StackSpec, level: int, comp_cfg: dict | None) -> LaunchPlan:
    """How a training backward's relay runs, recorded: compensated where level 3 has a config,
    else with the relay's tuned config."""
    compensated = comp_cfg is not None
    gemm_cfg = comp_cfg if compensated else _tuned("stack_bwd_relay", z, z.shape[1], stack, level)
    record("bwd:compensated" if compensated else "bwd:relay")
    if not compensated:
        _record_products(stack, z)
    return LaunchPlan(gemm_cfg, compensated=compensated)


def _record_products(stack: StackSpec, t: Tensor) -> bool:
    """Whether an exact call's products run on the BLAS (``tuning.products``), recorded
    (``products:blas``) where they do."""
    blas = products.on_blas(stack.layout, t)
    if blas:
        record("products:blas")
    return blas


@triton_op("mixstack::stack_double_backward", mutates_args=())
def stack_double_backward(v: Optional[Tensor], w: Optional[Tensor], grad_out: Tensor, y: Tensor, z: Tensor,
                          chain: Tensor, alpha: Tensor, weights: list[Tensor], spec: list[int],
                          needs: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The derivative of ``stack_backward``: the gradients of ``<grad_u0, v> + <grad_alpha, w>`` with
    respect to ``grad_out``, ``y``, ``z``, ``alpha`` and the weights,
    ``(d_grad_out, d_y, d_z, d_alpha, d_w0, d_w1, d_gw)``.

    ``weights`` and ``spec`` as ``stack_backward``'s; ``needs`` is ``[d_grad_out, d_alpha, weight
    terms]``, the outputs wanted; what does not exist is empty (``d_y`` without alpha or ``w``,
    ``d_alpha`` without alpha, and what ``needs`` does not ask for).  ``chain``:
    ``stack_backward``'s (empty: recomputed)."""
    stack, level = _unpack(spec)
    need_grad_out, need_alpha, want_weights = needs
    saved, wts = Saved(z, y, alpha), Weights(*weights)
    if _kernels_for(grad_out, stack.layout):
        n_focus = grad_out.shape[1]
        comp_cfg = _tuned("stack_compensated", grad_out, n_focus, stack, level, log=False)
        compensated = comp_cfg is not None
        gemm_cfg = comp_cfg if compensated else _tuned("stack_fwd", grad_out, n_focus, stack, level)
        record("bwd2:compensated" if compensated else "bwd2:triton")
        if not compensated:
            _record_products(stack, grad_out)
        wgrad = _wgrad_plan(grad_out, n_focus, stack, level) if want_weights else None
        return training.double_backward(v, w, grad_out, saved, chain, wts, stack,
                                        LaunchPlan(gemm_cfg, compensated=compensated), wgrad,
                                        need_grad_out=need_grad_out, need_alpha=need_alpha)
    record("bwd:reference")
    outs = list(reference.double_backward_from(v, w, grad_out, saved, wts, stack,
                                               chain=chain if chain.numel() else None, weight_grads=want_weights))
    outs[0] = outs[0] if need_grad_out else None
    outs[3] = outs[3] if need_alpha else None
    return tuple(grad_out.new_empty((0,)) if t is None else t.contiguous() for t in outs)


def _empties(t: Tensor, n: int) -> tuple[Tensor, ...]:
    """``n`` distinct empty tensors: the outputs a call was not asked for (an operator's
    outputs may not alias each other)."""
    return tuple(t.new_empty((0,)) for _ in range(n))


def _wgrad_plan(t: Tensor, n_focus: int, stack: StackSpec, level: int):
    """How this call's weight reductions run (``training.WgradPlan``), recorded: compensated at
    level 3 where a validated ``stack_wgrad_compensated`` entry exists, else exact with the
    ``stack_wgrad`` config (level >= 2) or the level-1 config."""
    cfg = _tuned("stack_wgrad_compensated", t, n_focus, stack, level, log=False)
    if cfg is not None:
        record("wgrad:compensated")
        return training.WgradPlan(cfg, compensated=True)
    record("wgrad:triton")
    return training.WgradPlan(_tuned("stack_wgrad", t, n_focus, stack, level))


def _tuned(family: str, t: Tensor, n_focus: int, stack: StackSpec, level: int, log: bool = True) -> dict | None:
    """The tuned launch config of ``family`` for this call, or ``None``: the level-1
    config (for the fused family the relay, for the compensated families the exact
    fp32 kernels).  Level >= 2 reads the tables; the compensated families need
    level 3 and a validated entry.  Read at trace time under a compiler, so the
    config becomes a constant of the graph."""
    if level < tuning.families.family(family).candidate_level:
        return None
    layout = stack.layout
    if family == "stack_compensated":
        return _compensated(t, n_focus, layout, stack.apply_alpha)
    cfg = tuning.tuned_config(family, focus_dim=layout.focus_dim, lmax=layout.lmax, n_focus=int(n_focus),
                              apply_alpha=stack.apply_alpha, device=t.device)
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
    ctx.stack = StackSpec.of(lmax, focus_dim, apply_alpha)
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
    stack, weights = ctx.stack, Weights(w0, w1, gw)
    if grad_y is not None and not stack.apply_alpha:
        grad_y = None
    if grad_out is not None and grad_out.stride(-1) != 1:    # a broadcast over F (stride 0) is read in place
        grad_out = grad_out.contiguous()
    want_weights = _weights_wanted(ctx, weights.as_list())
    sources = grad_z is not None or grad_y is not None
    if want_weights and u0 is None:      # not reachable: u0 is saved whenever a weight requires grad
        raise RuntimeError("mixing_stack: a weight gradient is wanted but the input u0 was not saved")
    if grad_out is None and not sources:
        return none
    if torch.is_grad_enabled() and (want_weights or sources):
        # Guards (docs/contract.md §4): a weight gradient while a graph is being built, or a third
        # derivative.  The reference formulas, on the saved z and y (outputs of this node, so
        # autograd's next derivative comes back here as their cotangents).
        record("bwd:reference")
        saved = Saved(z, y, alpha, u0)
        if grad_out is None:
            grad_out = z.new_zeros(saved.edge_major())
        g, ga, dw0, dw1, dgw, _ = reference.backward_state(grad_out, saved, weights, stack,
                                                           weight_grads=want_weights, grad_z=grad_z, grad_y=grad_y)
    else:
        g, ga, dw0, dw1, dgw, _ = torch.ops.mixstack.stack_backward(
            grad_out, y, z, alpha, weights.as_list(), _op_spec(stack, ctx.level),
            [want_weights, torch.is_grad_enabled()], u0 if want_weights else None, grad_z, grad_y)
    grads = [g, ga if stack.apply_alpha else None]
    grads += [d if want_weights and need else None for d, need in zip((dw0, dw1, dgw), ctx.needs_input_grad[2:5])]
    return tuple(grads) + none[5:]


stack_forward.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output):
    """Save what the double backward reads: the backward's inputs and its chain."""
    grad_out, y, z, alpha, weights, spec, needs, u0, grad_z, grad_y = inputs
    ctx.save_for_backward(grad_out, y, z, alpha, *weights, output[5])
    ctx.stack, ctx.level = _unpack(spec)
    ctx.first_order_only = bool(needs[0]) or grad_z is not None or grad_y is not None
    ctx.mark_non_differentiable(*output[2:])
    ctx.set_materialize_grads(False)


def _no_grads_of_backward(d_grad_out=None, d_y=None, d_z=None, d_alpha=None, d_weights=(None,) * 3):
    """What ``stack_backward``'s autograd returns, one entry per input: the gradients of
    ``grad_out``, ``y``, ``z``, ``alpha``, the list ``[w0, w1, gw]`` (a list, as the input is), and
    none of the rest."""
    return (d_grad_out, d_y, d_z, d_alpha, list(d_weights)) + (None,) * 5


def _double_backward(ctx, v, w, *_):
    if v is None and w is None:
        return _no_grads_of_backward()
    if ctx.first_order_only:
        raise RuntimeError("mixstack: stack_backward with weight gradients or cotangents of z and y is "
                           "not differentiable; mixing_stack's autograd never differentiates it (its "
                           "guards run the reference formulas instead)")
    grad_out, y, z, alpha, w0, w1, gw, chain = ctx.saved_tensors
    stack, weights, saved = ctx.stack, Weights(w0, w1, gw), Saved(z, y, alpha)
    w = w if stack.apply_alpha else None
    need = ctx.needs_input_grad
    want_weights = any(need[4])
    if torch.is_grad_enabled():
        # A third derivative: the reference formulas of the double backward, made of ordinary
        # ops that autograd differentiates again (the chain recomputed, differentiably).
        record("bwd:reference")
        outs = reference.double_backward_from(v, w, grad_out, saved, weights, stack, weight_grads=want_weights)
    else:
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        outs = torch.ops.mixstack.stack_double_backward(
            v, w, grad_out, y, z, chain, alpha, weights.as_list(), _op_spec(stack, ctx.level),
            [need[0], need[3], want_weights])
        outs = tuple(None if t.numel() == 0 and t.dim() == 1 and t.shape[0] == 0 else t for t in outs)
    d_grad_out, d_y, d_z, d_alpha, dw0, dw1, dgw = outs
    return _no_grads_of_backward(d_grad_out, d_y, d_z, d_alpha if stack.apply_alpha else None,
                                 [d if n else None for d, n in zip((dw0, dw1, dgw), need[4])])


stack_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)
