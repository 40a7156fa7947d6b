"""The ``torch.library`` operators of the convolution around the stack, and their autograd.

``mixstack::rotate_in`` -> ``u (F, E, ROW)`` and ``mixstack::rotate_in_backward`` -> the
gradients of ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix kernel)``;
``mixstack::rotate_out_sum`` -> ``(out (N, S, C or F*C), ys)`` and
``mixstack::rotate_out_sum_backward`` -> the gradients of ``(ys (E, ROW) or y (E, F, ROW),
wigner, edge_weight)``.  Each backward operator takes ``needs``, one flag per gradient in the
order of its outputs, saying which are asked for.  All are ``triton_op``s, so ``torch.compile``, ``torch.export`` and
``make_fx`` trace into their bodies; a body runs the kernels where they can run (CUDA, or any
device under ``TRITON_INTERPRET=1``, float32) and the tensor-op formulas of ``conv_reference``
elsewhere, and records which in ``dispatch_log`` (``conv_in:triton`` / ``conv_in:reference``,
``conv_in_bwd:*``, ``conv_out:*``, ``conv_out_bwd:*``).  The kernels' launch configs are fixed
per layout at every level (``configs.conv_config``), so levels 1-3 give the same bits.  The
later arguments (``streams``, the degree mix, ``blocks``, the destination order,
``degree_scale``) have defaults that keep the first calls' meaning.  The signatures are flat
(``rotate_in_backward``: every input, the flags, the level and the mix) because a
``torch.library`` schema takes tensors and scalars, not structures; the public functions
(``conv.functional``) group them.

Autograd: rotate-in keeps its inputs (no new surface: they exist anyway).  Rotate-out keeps
the stack's result ``y`` where a double backward may need it (``keep_input``) or where the
streams are kept apart, else only the focus sum ``ys (E, ROW)`` its forward kernel wrote on the
way (half a result surface at two focus streams).  A backward that builds a graph
(``create_graph``), or one that wants the degree mix's basis, runs the tensor-op formulas of
``conv_reference`` instead (spelled out, or autograd through the forward formulas:
``reference_grads``), which autograd differentiates again.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op

from ..core import config
from ..core.layout import StackLayout
from ..core.tracing import shapes_only
from ..dispatch.guards import conv_unsupported_reason, kernels_can_run
from ..dispatch.log import record
from . import launchers as cl
from . import reference as conv_reference
from .layout import DegreeMix, LinearRadial


def _kernels_for(t: Tensor, channels: int, level: int) -> bool:
    # a trace's fake pass under the interpreter takes the reference formulas for its shapes:
    # torch wraps only compiled Triton kernels (wrap_triton), and the interpreter's would run on fake tensors
    if config.triton_interpret() and is_fake(t):
        return False
    return level > 0 and kernels_can_run(t) and conv_unsupported_reason(channels, t.dtype) is None


def _layout_of_x(x: Tensor, streams: int = 0) -> StackLayout:
    return StackLayout(math.isqrt(x.shape[1]) - 1, x.shape[2] // max(streams, 1))


def _layout_of_y(y: Tensor, wigner: Tensor) -> StackLayout:
    lmax = math.isqrt(wigner.shape[2]) - 1
    return StackLayout(lmax, y.shape[2] // (3 * lmax + 1))


def _unit_channel_stride(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` as it is where its channels are contiguous (read through its strides), else a copy."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _scalar_pair(edge_scalar, scalar_weight):
    if edge_scalar is None:
        return None, None
    return edge_scalar.contiguous(), _unit_channel_stride(scalar_weight)


def _mix(mix_kernel, mix_basis):
    """``(kernel, basis)`` contiguous for the launchers, or ``None``."""
    return None if mix_kernel is None else (mix_kernel.contiguous(), _contiguous(mix_basis))


def _streams_of(grad_u: Tensor, x: Tensor) -> int:
    """``streams`` of a rotate-in call from its ``u``'s gradient ``(F, E, ROW)`` and ``x (N, S,
    CW)``: ``F`` where ``x``'s channels are the streams' blocks (``CW = F*C``), else 0."""
    lmax = math.isqrt(x.shape[1]) - 1
    c = grad_u.shape[2] // (3 * lmax + 1)
    return grad_u.shape[0] if x.shape[2] != c else 0


def _extended(x: Tensor, radial: Optional[Tensor], streams: int, mix_kernel: Optional[Tensor]) -> bool:
    """Whether a rotate-in call uses what ``conv_reference.rotate_in_backward`` does not spell out
    (streams, per-degree or no radial weights, a degree mix)."""
    lmax = math.isqrt(x.shape[1]) - 1
    return streams > 1 or radial is None or radial.shape[2] == lmax + 1 or mix_kernel is not None


def _reference_rotate_in(src, streams: int):
    """``conv_reference.rotate_in`` as a function of its float inputs ``(x, wigner, radial,
    edge_scalar, scalar_weight, edge_weight, mix_kernel, mix_basis)``."""
    def forward(x, wigner, radial, h, sw, ew, mix_kernel, mix_basis):
        mix = None if mix_kernel is None else DegreeMix(mix_kernel, mix_basis)
        return conv_reference.rotate_in(x, wigner, radial, src, edge_scalar=h, scalar_weight=sw, edge_weight=ew,
                                        streams=streams or None, degree_mix=mix)
    return forward


@triton_op("mixstack::rotate_in", mutates_args=())
def rotate_in(x: Tensor, wigner: Tensor, radial: Optional[Tensor], src: Tensor, edge_scalar: Optional[Tensor],
              scalar_weight: Optional[Tensor], edge_weight: Optional[Tensor], level: int, streams: int = 0,
              mix_kernel: Optional[Tensor] = None, mix_basis: Optional[Tensor] = None) -> Tensor:
    """``u (F, E, ROW)`` of ``conv_reference.rotate_in`` (``streams`` 0: every stream reads all of
    ``x``; ``F``: a channel block each; the degree mix's kernel and basis)."""
    if _kernels_for(x, x.shape[2], level):
        record("conv_in:triton")
        n_focus = radial.shape[1] if radial is not None else max(streams, 1)
        return cl.rotate_in_forward(x.contiguous(), wigner.contiguous(), _unit_channel_stride(radial),
                                    src.contiguous(), *_scalar_pair(edge_scalar, scalar_weight),
                                    _contiguous(edge_weight), _layout_of_x(x, streams), n_focus,
                                    mix=_mix(mix_kernel, mix_basis))
    record("conv_in:reference")
    return _reference_rotate_in(src, streams)(x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix_kernel,
                                              mix_basis)


@triton_op("mixstack::rotate_in_backward", mutates_args=())
def rotate_in_backward(grad_u: Tensor, x: Tensor, wigner: Tensor, radial: Optional[Tensor], src: Tensor,
                       edge_scalar: Optional[Tensor], scalar_weight: Optional[Tensor],
                       edge_weight: Optional[Tensor], needs: list[bool], level: int,
                       mix_kernel: Optional[Tensor] = None,
                       mix_basis: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix_kernel)``;
    ``needs``: six or seven flags in that order (the seventh, the mix kernel's, False where left
    out), which are asked for; those not come back empty (the mix's basis: ``reference_grads``).
    Whether ``x`` holds a channel block per stream is read off the shapes (``_streams_of``)."""
    needs = (tuple(needs) + (False,))[:7]
    streams = _streams_of(grad_u, x)
    if _kernels_for(grad_u, x.shape[2], level):
        record("conv_in_bwd:triton")
        return cl.rotate_in_backward(grad_u.contiguous(), x.contiguous(), wigner.contiguous(),
                                     _unit_channel_stride(radial), src.contiguous(),
                                     *_scalar_pair(edge_scalar, scalar_weight), _contiguous(edge_weight),
                                     _layout_of_x(x, streams), needs, mix=_mix(mix_kernel, mix_basis))
    record("conv_in_bwd:reference")
    if _extended(x, radial, streams, mix_kernel):
        inputs = (x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix_kernel, mix_basis)
        grads = reference_grads(_reference_rotate_in(src, streams), inputs, needs + (False,), grad_u,
                                create_graph=False)[:7]
    else:
        grads = conv_reference.rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight,
                                                  edge_weight) + (None,)
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
    those not asked for come back empty."""
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


def reference_grads(forward, inputs, needs, cotangent, create_graph: bool, in_autograd: bool = False):
    """The gradients of ``forward(*inputs)`` against ``cotangent`` for the inputs ``needs`` asks for
    (``None`` where not needed or absent), through the reference formulas.  With ``create_graph``
    (an autograd backward that builds a graph) by autograd through the inputs themselves, so the
    gradients are differentiable again; in an autograd backward that builds none
    (``in_autograd``), by autograd through detached copies; else by ``torch.func.vjp``, which also
    works in an operator's body, below autograd, where ``requires_grad`` builds no graph (as
    ``conv.wigner_ops.reference_grad``)."""
    wanted = [i for i, (t, need) in enumerate(zip(inputs, needs)) if need and t is not None]

    def chosen_forward(*chosen):
        args = list(inputs)
        for i, t in zip(wanted, chosen):
            args[i] = t
        return forward(*args)

    chosen = [inputs[i] for i in wanted]
    if in_autograd and not create_graph:
        chosen = [t.detach().requires_grad_() for t in chosen]
    elif create_graph:
        # a view of each input, a node of its own: the gradient is the partial derivative through
        # this use of the input alone, where the input itself could also reach another input
        # (y computed from the Wigner rows), and it stays differentiable in the input
        chosen = [t.view_as(t) for t in chosen]
    if create_graph or in_autograd:
        with torch.enable_grad():
            got = torch.autograd.grad(chosen_forward(*chosen), chosen, cotangent, create_graph=create_graph,
                                      allow_unused=True)
        got = [torch.zeros_like(t) if g is None else g for t, g in zip(chosen, got)]
    elif shapes_only(cotangent):      # functorch's vjp fails on symbolic fake tensors
        got = [torch.empty_like(t) for t in chosen]
    else:
        _, vjp = torch.func.vjp(chosen_forward, *chosen)
        got = vjp(cotangent)
    grads = [None] * len(inputs)
    for i, g in zip(wanted, got):
        grads[i] = g
    return grads


def _rotate_in_linear_reference_grads(grad_u, inputs, src, needs, create_graph: bool, in_autograd: bool = False):
    """``reference_grads`` of ``rotate_in`` with a ``LinearRadial``, over ``(x, wigner, hidden,
    weight, bias, edge_scalar, edge_weight)``."""
    def forward(x, wigner, hidden, weight, bias, edge_scalar, edge_weight):
        return conv_reference.rotate_in(x, wigner, LinearRadial(hidden, weight, bias), src,
                                        edge_scalar=edge_scalar, edge_weight=edge_weight)
    return reference_grads(forward, inputs, needs, grad_u, create_graph, in_autograd)


def _order(perm, offsets):
    return None if perm is None else (perm.contiguous(), offsets.contiguous())


@triton_op("mixstack::rotate_out_sum", mutates_args=())
def rotate_out_sum(y: Tensor, wigner: Tensor, dst: Tensor, edge_weight: Optional[Tensor], n_atoms: int,
                   save_sum: bool, level: int, blocks: bool = False, perm: Optional[Tensor] = None,
                   offsets: Optional[Tensor] = None, degree_scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(out, ys)`` of ``conv_reference.rotate_out_sum``: ``out (n_atoms, S, C)``, or ``(n_atoms,
    S, F*C)`` with ``blocks``; ``ys`` the focus sum ``(E, ROW)`` with ``save_sum`` (not with
    ``blocks``), else empty.  ``perm`` and ``offsets``: an ``EdgeOrder`` (``dst`` in any order),
    or ``None`` (``dst`` non-decreasing)."""
    layout = _layout_of_y(y, wigner)
    wide = layout.focus_dim * (y.shape[1] if blocks else 1)
    if _kernels_for(y, wide, level):
        record("conv_out:triton")
        return cl.rotate_out_forward(_unit_channel_stride(y), wigner.contiguous(), dst.contiguous(),
                                     _contiguous(edge_weight), n_atoms, layout, save_sum, blocks=blocks,
                                     order=_order(perm, offsets), degree_scale=_contiguous(degree_scale))
    record("conv_out:reference")
    out = conv_reference.rotate_out_formula(y, wigner, dst, n_atoms, layout.lmax, edge_weight, blocks, degree_scale)
    return out, (y.sum(1).contiguous() if save_sum and not blocks else y.new_empty((0,)))


def _reference_rotate_out(dst, n_atoms: int, lmax: int, blocks: bool, degree_scale):
    def forward(y, wigner, edge_weight):
        return conv_reference.rotate_out_formula(y, wigner, dst, n_atoms, lmax, edge_weight, blocks, degree_scale)
    return forward


@triton_op("mixstack::rotate_out_sum_backward", mutates_args=())
def rotate_out_sum_backward(grad_out: Tensor, ys: Tensor, wigner: Tensor, dst: Tensor,
                            edge_weight: Optional[Tensor], needs: list[bool], level: int, blocks: bool = False,
                            degree_scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``(ys (E, ROW), wigner, edge_weight)``; ``ys (E, Fs, ROW)`` is the saved focus
    sum (``Fs = 1``) or the stack's result, summed here; with ``blocks`` the gradient of the
    stack's result ``(E, F, ROW)`` itself."""
    layout = _layout_of_y(ys, wigner)
    needs = tuple(needs)
    if _kernels_for(grad_out, grad_out.shape[2], level):
        record("conv_out_bwd:triton")
        return cl.rotate_out_backward(grad_out.contiguous(), _unit_channel_stride(ys), wigner.contiguous(),
                                      dst.contiguous(), _contiguous(edge_weight), layout, needs, blocks=blocks,
                                      degree_scale=_contiguous(degree_scale))
    record("conv_out_bwd:reference")
    if blocks:
        forward = _reference_rotate_out(dst, grad_out.shape[0], layout.lmax, True, degree_scale)
        grads = reference_grads(forward, (ys, wigner, edge_weight), needs, grad_out, create_graph=False)
    else:
        scaled = grad_out if degree_scale is None else grad_out * degree_scale[:, None]
        grads = conv_reference.rotate_out_backward(scaled, ys.sum(1), wigner, dst, edge_weight)
    return tuple(g.contiguous() if need and g is not None else grad_out.new_empty((0,))
                 for g, need in zip(grads, needs))


# ------------------------------------------------------------------ autograd

def _padded(values, n: int, fill) -> tuple:
    """An operator's inputs (or their ``needs_input_grad``) as called, padded with the defaults'
    ``fill`` to all ``n`` of them: a call may leave the later arguments out."""
    return tuple(values) + (fill,) * (n - len(values))


_ROTATE_IN_DEFAULTS = (0, None, None)            # streams, mix_kernel, mix_basis
_ROTATE_OUT_DEFAULTS = (False, None, None, None)  # blocks, perm, offsets, degree_scale


def _rotate_in_setup(ctx, inputs, output):
    inputs = tuple(inputs) + _ROTATE_IN_DEFAULTS[len(inputs) - 8:]
    x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, level, streams, mix_kernel, mix_basis = inputs
    ctx.save_for_backward(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, mix_kernel, mix_basis)
    ctx.level, ctx.streams = level, streams


def _rotate_in_backward(ctx, grad_u):
    x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, mix_kernel, mix_basis = ctx.saved_tensors
    n = _padded(ctx.needs_input_grad, 11, False)
    needs = (n[0], n[1], n[2], n[4], n[5], n[6], n[9], n[10])
    if torch.is_grad_enabled() or n[10]:
        # a double backward, or the mix's basis wanted (training): the reference formulas
        record("conv_in_bwd:reference")
        if _extended(x, radial, ctx.streams, mix_kernel):
            inputs = (x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix_kernel, mix_basis)
            grads = reference_grads(_reference_rotate_in(src, ctx.streams), inputs, needs, grad_u,
                                    create_graph=torch.is_grad_enabled(), in_autograd=True)
        else:
            grads = conv_reference.rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight,
                                                      edge_weight) + (None, None)
    else:
        has_scalar = edge_scalar is not None
        grads = torch.ops.mixstack.rotate_in_backward(
            grad_u, x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight,
            [n[0], n[1], n[2] and radial is not None, n[4] and has_scalar, n[5] and has_scalar,
             n[6] and edge_weight is not None, n[9] and mix_kernel is not None],
            ctx.level, mix_kernel, mix_basis) + (None,)
    gx, gw, grad, gh, gsw, gew, gk, gb = (g if need else None for g, need in zip(grads, needs))
    return (gx, gw, grad, None, gh, gsw, gew, None, None, gk, gb)[:len(ctx.needs_input_grad)]


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
                                              src, needs, create_graph=torch.is_grad_enabled(), in_autograd=True)
    else:
        gx, gw, gh, gs, gew = torch.ops.mixstack.rotate_in_linear_backward(
            grad_u, x, wigner, hidden, weight, bias, src, edge_scalar, edge_weight,
            [n[0], n[1], n[2], n[6] and edge_scalar is not None, n[7] and edge_weight is not None], ctx.level)
        g = [gx, gw, gh, None, None, gs, gew]
    out = [gr if need else None for gr, need in zip(g, needs)]
    return out[0], out[1], out[2], out[3], out[4], None, out[5], out[6], None


def _rotate_out_setup(ctx, inputs, output):
    inputs = tuple(inputs) + _ROTATE_OUT_DEFAULTS[len(inputs) - 7:]
    y, wigner, dst, edge_weight, n_atoms, save_sum, level, blocks, _perm, _offsets, degree_scale = inputs
    _, ys = output
    saved_sum = save_sum and not blocks
    ctx.save_for_backward(ys if saved_sum else y, wigner, dst, edge_weight, degree_scale)
    ctx.saved_sum, ctx.level, ctx.n_focus, ctx.blocks = saved_sum, level, y.shape[1], blocks
    ctx.mark_non_differentiable(ys)
    ctx.set_materialize_grads(False)


def _rotate_out_backward(ctx, grad_out, _grad_ys):
    n_inputs = len(ctx.needs_input_grad)
    if grad_out is None:
        return (None,) * n_inputs
    kept, wigner, dst, edge_weight, degree_scale = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():                 # a double backward: tensor ops autograd can follow
        if ctx.saved_sum:
            raise RuntimeError(
                "rotate_out_sum ran with keep_input=False (inference; a mixstack potential in eval mode), "
                "so its input y was not kept, and a double backward (create_graph=True) needs it: call "
                "rotate_out_sum with keep_input=True, or put the module in train mode")
        record("conv_out_bwd:reference")
        lmax = math.isqrt(wigner.shape[2]) - 1
        if ctx.blocks:
            forward = _reference_rotate_out(dst, grad_out.shape[0], lmax, True, degree_scale)
            gy, gw, gew = reference_grads(forward, (kept, wigner, edge_weight), (need[0], need[1], need[3]),
                                          grad_out, create_graph=True)
        else:
            scaled = grad_out if degree_scale is None else grad_out * degree_scale[:, None]
            gy, gw, gew = conv_reference.rotate_out_backward(scaled, kept.sum(1), wigner, dst, edge_weight)
    else:
        ys = kept[:, None] if ctx.saved_sum else kept
        gy, gw, gew = torch.ops.mixstack.rotate_out_sum_backward(
            grad_out, ys, wigner, dst, edge_weight, [need[0], need[1], need[3] and edge_weight is not None],
            ctx.level, ctx.blocks, degree_scale)
    if need[0] and not ctx.blocks:
        gy = gy[:, None].expand(gy.shape[0], ctx.n_focus, gy.shape[1])
    return (gy if need[0] else None, gw if need[1] else None, None, gew if need[3] else None) + (None,) * (n_inputs - 4)


rotate_in.register_autograd(_rotate_in_backward, setup_context=_rotate_in_setup)
rotate_in_linear.register_autograd(_rotate_in_linear_backward, setup_context=_rotate_in_linear_setup)
rotate_out_sum.register_autograd(_rotate_out_backward, setup_context=_rotate_out_setup)
