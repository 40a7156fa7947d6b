"""The ``torch.library`` operators of the convolution around the stack, and their autograd.

``mixstack::rotate_in`` -> ``u (F, E, ROW)`` and ``mixstack::rotate_in_backward`` -> the
gradients of ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight)``; ``mixstack::rotate_out_sum`` ->
``(out (N, S, C), ys)`` and ``mixstack::rotate_out_sum_backward`` -> the gradients of
``(ys (E, ROW), wigner, edge_weight)``.  Each backward operator takes ``needs``, one flag per
gradient in the order of its outputs, saying which are asked for.  All four are ``triton_op``s, so ``torch.compile``,
``torch.export`` and ``make_fx`` trace into their bodies; a body runs the kernels where they
can run (CUDA, or any device under ``TRITON_INTERPRET=1``, float32) and the tensor-op formulas
of ``conv_reference`` elsewhere, and records which in ``dispatch_log`` (``conv_in:triton`` /
``conv_in:reference``, ``conv_in_bwd:*``, ``conv_out:*``, ``conv_out_bwd:*``).  The kernels'
launch configs are fixed per layout at every level (``configs.conv_config``), so levels 1-3
give the same bits.

Autograd: rotate-in keeps its inputs (no new surface: they exist anyway).  Rotate-out keeps
the stack's result ``y`` where a double backward may need it (``keep_input``), else only the
focus sum ``ys (E, ROW)`` its forward kernel wrote on the way (half a result surface at two
focus streams).  A backward that builds a graph (``create_graph``) runs the tensor-op
backward of ``conv_reference`` instead, which autograd differentiates again.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch.library import triton_op

from ..core.layout import StackLayout
from ..dispatch.guards import conv_unsupported_reason, kernels_can_run
from ..dispatch.log import record
from . import launchers as cl
from . import reference as conv_reference
from .layout import LinearRadial


def _kernels_for(t: Tensor, channels: int, level: int) -> bool:
    return level > 0 and kernels_can_run(t) and conv_unsupported_reason(channels, t.dtype) is None


def _layout_of_x(x: Tensor) -> StackLayout:
    return StackLayout(math.isqrt(x.shape[1]) - 1, x.shape[2])


def _layout_of_y(y: Tensor, wigner: Tensor) -> StackLayout:
    lmax = math.isqrt(wigner.shape[2]) - 1
    return StackLayout(lmax, y.shape[2] // (3 * lmax + 1))


def _unit_channel_stride(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` as it is where its channels are contiguous (read through its strides), else a copy."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _scalar_pair(edge_scalar, scalar_weight):
    if edge_scalar is None:
        return None, None
    return edge_scalar.contiguous(), _unit_channel_stride(scalar_weight)


@triton_op("mixstack::rotate_in", mutates_args=())
def rotate_in(x: Tensor, wigner: Tensor, radial: Tensor, src: Tensor, edge_scalar: Optional[Tensor],
              scalar_weight: Optional[Tensor], edge_weight: Optional[Tensor], level: int) -> Tensor:
    """``u (F, E, ROW)`` of ``conv_reference.rotate_in``."""
    if _kernels_for(x, x.shape[2], level):
        record("conv_in:triton")
        return cl.rotate_in_forward(x.contiguous(), wigner.contiguous(), _unit_channel_stride(radial),
                                    src.contiguous(), *_scalar_pair(edge_scalar, scalar_weight),
                                    None if edge_weight is None else edge_weight.contiguous(), _layout_of_x(x),
                                    radial.shape[1])
    record("conv_in:reference")
    return conv_reference.rotate_in(x, wigner, radial, src, edge_scalar=edge_scalar, scalar_weight=scalar_weight,
                                    edge_weight=edge_weight)


@triton_op("mixstack::rotate_in_backward", mutates_args=())
def rotate_in_backward(grad_u: Tensor, x: Tensor, wigner: Tensor, radial: Tensor, src: Tensor,
                       edge_scalar: Optional[Tensor], scalar_weight: Optional[Tensor],
                       edge_weight: Optional[Tensor], needs: list[bool],
                       level: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight)``; ``needs``: six
    flags in that order, which are asked for (those not come back empty)."""
    if _kernels_for(grad_u, x.shape[2], level):
        record("conv_in_bwd:triton")
        return cl.rotate_in_backward(grad_u.contiguous(), x.contiguous(), wigner.contiguous(),
                                     _unit_channel_stride(radial), src.contiguous(),
                                     *_scalar_pair(edge_scalar, scalar_weight),
                                     None if edge_weight is None else edge_weight.contiguous(),
                                     _layout_of_x(x), needs)
    record("conv_in_bwd:reference")
    grads = conv_reference.rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight,
                                              edge_weight)
    return tuple(g.contiguous() if need and g is not None else x.new_empty((0,)) for g, need in zip(grads, needs))


def _linear_factors(hidden, weight, bias):
    return hidden.contiguous(), weight.contiguous(), bias.contiguous()


@triton_op("mixstack::rotate_in_linear", mutates_args=())
def rotate_in_linear(x: Tensor, wigner: Tensor, hidden: Tensor, weight: Tensor, bias: Tensor, src: Tensor,
                     edge_scalar: Optional[Tensor], edge_weight: Optional[Tensor], level: int) -> Tensor:
    """``rotate_in`` with the radial weights given as a linear layer (``LinearRadial``):
    the kernels make them per tile; the reference formulas make them whole first."""
    if _kernels_for(x, x.shape[2], level):
        record("conv_in:triton")
        return cl.rotate_in_forward(x.contiguous(), wigner.contiguous(), None, src.contiguous(),
                                    None if edge_scalar is None else edge_scalar.contiguous(), None,
                                    None if edge_weight is None else edge_weight.contiguous(), _layout_of_x(x),
                                    weight.shape[0], linear=_linear_factors(hidden, weight, bias))
    record("conv_in:reference")
    return conv_reference.rotate_in(x, wigner, LinearRadial(hidden, weight, bias), src, edge_scalar=edge_scalar,
                                    edge_weight=edge_weight)


@triton_op("mixstack::rotate_in_linear_backward", mutates_args=())
def rotate_in_linear_backward(grad_u: Tensor, x: Tensor, wigner: Tensor, hidden: Tensor, weight: Tensor,
                              bias: Tensor, src: Tensor, edge_scalar: Optional[Tensor],
                              edge_weight: Optional[Tensor], needs: list[bool],
                              level: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``(x, wigner, hidden, edge_scalar, edge_weight)`` of ``rotate_in_linear`` (not
    of the layer's weight and bias: a backward that wants those runs the reference formulas);
    ``needs``: five flags in that order, which are asked for (those not come back empty)."""
    need_x, need_wigner, need_hidden, need_edge_scalar, need_edge_weight = needs
    if _kernels_for(grad_u, x.shape[2], level):
        record("conv_in_bwd:triton")
        g = cl.rotate_in_backward(grad_u.contiguous(), x.contiguous(), wigner.contiguous(), None, src.contiguous(),
                                  None if edge_scalar is None else edge_scalar.contiguous(), None,
                                  None if edge_weight is None else edge_weight.contiguous(), _layout_of_x(x),
                                  (need_x, need_wigner, need_hidden, need_edge_scalar, False, need_edge_weight),
                                  linear=_linear_factors(hidden, weight, bias))
        return g[0], g[1], g[2], g[3], g[5]
    record("conv_in_bwd:reference")
    grads = _rotate_in_linear_reference_grads(grad_u, (x, wigner, hidden, weight, bias, edge_scalar, edge_weight),
                                              src, (need_x, need_wigner, need_hidden, False, False,
                                                    need_edge_scalar, need_edge_weight), create_graph=False)
    picked = (grads[0], grads[1], grads[2], grads[5], grads[6])
    return tuple(g.contiguous() if need and g is not None else x.new_empty((0,)) for g, need in zip(picked, needs))


def _rotate_in_linear_reference_grads(grad_u, inputs, src, needs, create_graph: bool):
    """The gradients of ``(x, wigner, hidden, weight, bias, edge_scalar, edge_weight)`` (``None``
    where not needed or absent) through the reference formulas.  With ``create_graph`` (an
    autograd backward that builds a graph) by autograd through the inputs themselves, so the
    gradients are differentiable again; else by ``torch.func.vjp``, which also works in an
    operator's body, below autograd, where ``requires_grad`` builds no graph (as
    ``conv.wigner_ops.reference_grad``)."""
    wanted = [i for i, (t, need) in enumerate(zip(inputs, needs)) if need and t is not None]

    def forward(*chosen):
        args = list(inputs)
        for i, t in zip(wanted, chosen):
            args[i] = t
        x, wigner, hidden, weight, bias, edge_scalar, edge_weight = args
        return conv_reference.rotate_in(x, wigner, LinearRadial(hidden, weight, bias), src,
                                        edge_scalar=edge_scalar, edge_weight=edge_weight)

    chosen = [inputs[i] for i in wanted]
    if create_graph:
        with torch.enable_grad():
            got = torch.autograd.grad(forward(*chosen), chosen, grad_u, create_graph=True, allow_unused=True)
        got = [torch.zeros_like(t) if g is None else g for t, g in zip(chosen, got)]
    else:
        _, vjp = torch.func.vjp(forward, *chosen)
        got = vjp(grad_u)
    grads = [None] * len(inputs)
    for i, g in zip(wanted, got):
        grads[i] = g
    return grads


@triton_op("mixstack::rotate_out_sum", mutates_args=())
def rotate_out_sum(y: Tensor, wigner: Tensor, dst: Tensor, edge_weight: Optional[Tensor], n_atoms: int,
                   save_sum: bool, level: int) -> tuple[Tensor, Tensor]:
    """``(out (n_atoms, S, C), ys)`` of ``conv_reference.rotate_out_sum``: ``ys`` the focus sum
    ``(E, ROW)`` with ``save_sum``, else empty."""
    layout = _layout_of_y(y, wigner)
    if _kernels_for(y, layout.focus_dim, level):
        record("conv_out:triton")
        return cl.rotate_out_forward(_unit_channel_stride(y), wigner.contiguous(), dst.contiguous(),
                                     None if edge_weight is None else edge_weight.contiguous(), n_atoms,
                                     layout, save_sum)
    record("conv_out:reference")
    ys = y.sum(1)
    out = conv_reference.rotate_out_from_sum(ys, wigner, dst, n_atoms, lmax=layout.lmax, edge_weight=edge_weight)
    return out, (ys.contiguous() if save_sum else y.new_empty((0,)))


@triton_op("mixstack::rotate_out_sum_backward", mutates_args=())
def rotate_out_sum_backward(grad_out: Tensor, ys: Tensor, wigner: Tensor, dst: Tensor,
                            edge_weight: Optional[Tensor], needs: list[bool],
                            level: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``(ys (E, ROW), wigner, edge_weight)``; ``needs``: three flags in that order,
    which are asked for (those not come back empty).  ``ys (E, Fs, ROW)`` is the saved focus sum
    (``Fs = 1``) or the stack's result, summed here."""
    layout = _layout_of_y(ys, wigner)
    if _kernels_for(grad_out, layout.focus_dim, level):
        record("conv_out_bwd:triton")
        return cl.rotate_out_backward(grad_out.contiguous(), _unit_channel_stride(ys), wigner.contiguous(),
                                      dst.contiguous(), None if edge_weight is None else edge_weight.contiguous(),
                                      layout, needs)
    record("conv_out_bwd:reference")
    grads = conv_reference.rotate_out_backward(grad_out, ys.sum(1), wigner, dst, edge_weight)
    return tuple(g.contiguous() if need and g is not None else grad_out.new_empty((0,))
                 for g, need in zip(grads, needs))


# ------------------------------------------------------------------ autograd

def _rotate_in_setup(ctx, inputs, output):
    x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, level = inputs
    ctx.save_for_backward(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight)
    ctx.level = level


def _rotate_in_backward(ctx, grad_u):
    x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():                 # a double backward: tensor ops autograd can follow
        record("conv_in_bwd:reference")
        grads = conv_reference.rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight,
                                                  edge_weight)
    else:
        has_scalar, has_ew = edge_scalar is not None, edge_weight is not None
        grads = torch.ops.mixstack.rotate_in_backward(
            grad_u, x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight,
            [need[0], need[1], need[2], need[4] and has_scalar, need[5] and has_scalar, need[6] and has_ew],
            ctx.level)
    gx, gw, grad, gh, gsw, gew = grads
    return (gx if need[0] else None, gw if need[1] else None, grad if need[2] else None, None,
            gh if need[4] else None, gsw if need[5] else None, gew if need[6] else None, None)


def _rotate_in_linear_setup(ctx, inputs, output):
    x, wigner, hidden, weight, bias, src, edge_scalar, edge_weight, level = inputs
    ctx.save_for_backward(x, wigner, hidden, weight, bias, src, edge_scalar, edge_weight)
    ctx.level = level


def _rotate_in_linear_backward(ctx, grad_u):
    x, wigner, hidden, weight, bias, src, edge_scalar, edge_weight = ctx.saved_tensors
    n = ctx.needs_input_grad
    needs = (n[0], n[1], n[2], n[3], n[4], n[6], n[7])
    if torch.is_grad_enabled() or n[3] or n[4]:
        # a double backward, or the layer's own weights wanted (training): the reference formulas
        record("conv_in_bwd:reference")
        g = _rotate_in_linear_reference_grads(grad_u, (x, wigner, hidden, weight, bias, edge_scalar, edge_weight),
                                              src, needs, create_graph=torch.is_grad_enabled())
    else:
        gx, gw, gh, gs, gew = torch.ops.mixstack.rotate_in_linear_backward(
            grad_u, x, wigner, hidden, weight, bias, src, edge_scalar, edge_weight,
            [n[0], n[1], n[2], n[6] and edge_scalar is not None, n[7] and edge_weight is not None], ctx.level)
        g = [gx, gw, gh, None, None, gs, gew]
    out = [gr if need else None for gr, need in zip(g, needs)]
    return out[0], out[1], out[2], out[3], out[4], None, out[5], out[6], None


def _rotate_out_setup(ctx, inputs, output):
    y, wigner, dst, edge_weight, n_atoms, save_sum, level = inputs
    _, ys = output
    ctx.save_for_backward(ys if save_sum else y, wigner, dst, edge_weight)
    ctx.saved_sum, ctx.level, ctx.n_focus = save_sum, level, y.shape[1]
    ctx.mark_non_differentiable(ys)
    ctx.set_materialize_grads(False)


def _rotate_out_backward(ctx, grad_out, _grad_ys):
    if grad_out is None:
        return (None,) * 7
    kept, wigner, dst, edge_weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():                 # a double backward: tensor ops autograd can follow
        if ctx.saved_sum:
            raise RuntimeError(
                "rotate_out_sum ran with keep_input=False (inference; a mixstack potential in eval mode), "
                "so its input y was not kept, and a double backward (create_graph=True) needs it: call "
                "rotate_out_sum with keep_input=True, or put the module in train mode")
        record("conv_out_bwd:reference")
        gy, gw, gew = conv_reference.rotate_out_backward(grad_out, kept.sum(1), wigner, dst, edge_weight)
    else:
        ys = kept[:, None] if ctx.saved_sum else kept
        gy, gw, gew = torch.ops.mixstack.rotate_out_sum_backward(
            grad_out, ys, wigner, dst, edge_weight, [need[0], need[1], need[3] and edge_weight is not None],
            ctx.level)
    gy = gy[:, None].expand(gy.shape[0], ctx.n_focus, gy.shape[1]) if need[0] else None
    return (gy, gw if need[1] else None, None, gew if need[3] else None, None, None, None)


rotate_in.register_autograd(_rotate_in_backward, setup_context=_rotate_in_setup)
rotate_in_linear.register_autograd(_rotate_in_linear_backward, setup_context=_rotate_in_linear_setup)
rotate_out_sum.register_autograd(_rotate_out_backward, setup_context=_rotate_out_setup)
