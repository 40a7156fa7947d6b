"""Launchers of training: weight gradients, and the double backward of force-loss training.

``backward_with_weights`` is the forward's backward when weight gradients are asked for, or
when the double backward handed back cotangents of the saved ``z`` and ``y``
(docs/contract.md §1): the relay of ``launchers.stack_backward`` (same kernels, so the same
``u0`` and ``alpha`` bits as the force path when there are no such cotangents), with the
reductions of ``kernels.wgrad`` reading each layer's ``gz`` and ``h`` as the relay forms them,
and the layer inputs rebuilt from ``u0`` and ``z`` first.

``double_backward`` differentiates the first-order backward (docs/contract.md §1, "Double
backward"): one forward-direction pass along the incoming cotangent ``v`` of ``grad_u0``.
Per gated layer, ``z_dot = u_dot @ W`` (the forward's GEMM kernel), the relay's pointwise kernel
for ``gz`` from the chain (the backward's ``h`` of each layer, kept by the first backward), the
weight reductions, and ``curvature.tangent_kernel`` (``u_dot`` in place and ``d_z``); then the
identity layer's ``y_dot`` with the alpha fold, ``d_alpha = sum(grad_out * y_dot)`` (the alpha
gradient kernel) and the incoming ``w``'s terms.  Surfaces: ``u_dot``, ``z_dot`` and ``gz``
(``(F, E, ROW)`` each), the partial sums of the reductions, and the outputs.

Reductions: ``WgradPlan`` says how (the launch config, exact or compensated); each runs two
launches (``kernels.wgrad``: per-chunk partial sums, then their sum in chunk order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from torch.library import wrap_triton

from ..core.layout import StackLayout
from ..kernels.curvature import tangent_kernel
from ..kernels.wgrad import chunk_sum_kernel, gate_wgrad_kernel, layer_input_kernel, wgrad_kernel
from ..tuning.configs import (
    GATE_WGRAD_CHUNK,
    LAYER_INPUT_CONFIG,
    WGRAD_BLOCK_K,
    WGRAD_CHUNK,
    chunk_sum_block,
    default_wgrad_config,
    gate_chunk,
    pointwise_recomputes_gate,
    training_pointwise_config,
)
from . import launchers
from .gemm import BlockWeights, Epilogue, Operand, block_gemm
from .launchers import LaunchPlan
from .values import Saved, StackSpec, Weights


@dataclass(frozen=True)
class WgradPlan:
    """How the weight reductions run: ``cfg`` a launch config (``None``: the level-1 config),
    ``compensated`` the level-3 split products for the block weights."""

    cfg: dict | None = None
    compensated: bool = False


def _is_empty(n) -> bool:
    return isinstance(n, int) and n == 0


class _Reductions:
    """The partial-sum buffers of one call's weight reductions, reused by every layer."""

    def __init__(self, like, n_edges, n_focus, layout: StackLayout, plan: WgradPlan):
        self.layout, self.plan, self.n_edges, self.n_focus = layout, plan, n_edges, n_focus
        self.cfg = plan.cfg or default_wgrad_config(layout)
        self.size = layout.m0 ** 2 + layout.m1 ** 2
        self.chunks = triton.cdiv(n_edges, WGRAD_CHUNK)
        self.gate_chunks = triton.cdiv(n_edges, GATE_WGRAD_CHUNK)
        self.gate_size = layout.focus_dim * layout.gate_width
        self.part = like.new_empty((self.chunks, n_focus, self.size))
        self.gate_part = like.new_empty((self.gate_chunks, n_focus, self.gate_size))

    def _sum(self, part, chunks, size, split, out0, out1, layer):
        block = chunk_sum_block()
        grid = (triton.cdiv(size, block), self.n_focus)
        wrap_triton(chunk_sum_kernel)[grid](part, out0, out1, chunks, layer, self.n_focus,
                                            SIZE=size, SPLIT=split, BLOCK=block)

    def blocks(self, a, a_layer, b, dw0, dw1, layer, *, b_edge_major=False):
        """``dw0[layer], dw1[layer] = A^T B`` over the edges, per block: ``A`` focus-major
        ``(n, F, E, ROW)`` read at ``a_layer``; ``B`` focus-major ``(F, E, ROW)`` or edge-major
        (unit column stride)."""
        lay, cfg = self.layout, self.cfg
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        tiles = (triton.cdiv(lay.m0, bm) * triton.cdiv(lay.m0, bn)
                 + triton.cdiv(lay.m1, bm) * triton.cdiv(lay.m1, bn))
        wrap_triton(wgrad_kernel)[(self.chunks * tiles, self.n_focus)](
            self.part, a, b, a_layer, self.n_edges, self.n_focus,
            b.stride(0) if b_edge_major else 0, b.stride(1) if b_edge_major else 0,
            LMAX=lay.lmax, CF=lay.focus_dim, CHUNK=WGRAD_CHUNK,
            B_EDGE_MAJOR=b_edge_major, COMPENSATED=self.plan.compensated,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=WGRAD_BLOCK_K,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        self._sum(self.part, self.chunks, self.size, lay.m0 ** 2, dw0, dw1, layer)

    def top(self, a, a_layer, grad_out, alpha, dw0, dw1, layer, scratch=None):
        """The identity layer's ``dw = A^T (grad_out * alpha)`` from the edge-major incoming
        gradient: read in place without alpha; with it, scaled straight into a focus-major
        ``(F, E, ROW)`` surface (scaling inside the reduction spilled, ``wgrad.wgrad_kernel``):
        ``scratch`` when the caller has a dead one of that shape, else a transient one."""
        if alpha is None:
            self.blocks(a, a_layer, grad_out, dw0, dw1, layer, b_edge_major=True)
        else:
            g = scratch if scratch is not None else grad_out.new_empty((self.n_focus, self.n_edges, grad_out.shape[2]))
            torch.mul(grad_out.transpose(0, 1), alpha.transpose(0, 1).unsqueeze(-1), out=g)
            self.blocks(a, a_layer, g, dw0, dw1, layer)

    def gate(self, h, h_layer, z, gw, dgw, layer, zd=None):
        """``dgw[layer] = s^T gl`` over the edges (``zd``: the double backward's ``z_dot``, adding
        ``s^T gl_curv + s_dot^T gl``); ``h`` ``(n, F, E, ROW)`` read at ``h_layer``."""
        lay = self.layout
        cfg = training_pointwise_config(lay)
        wrap_triton(gate_wgrad_kernel)[(self.gate_chunks, self.n_focus)](
            self.gate_part, h, z, z if zd is None else zd, gw, layer, h_layer, self.n_edges, self.n_focus,
            LMAX=lay.lmax, CF=lay.focus_dim, CP=triton.next_power_of_2(lay.focus_dim), GC=gate_chunk(lay),
            CHUNK=GATE_WGRAD_CHUNK, CURVATURE=zd is not None, BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
        self._sum(self.gate_part, self.gate_chunks, self.gate_size, self.gate_size, dgw, dgw, layer)


def layer_inputs(u0, z, gw, layout: StackLayout):
    """The inputs of the layers after the first, ``(n_gated, F, E, ROW)``: entry ``k`` is
    ``u_{k+1} = u_k + a(z_k)`` (``u_0 = u0``)."""
    n_gated, n_focus, n_edges, _ = z.shape
    out = z.new_empty(z.shape)
    if _is_empty(n_edges) or n_gated == 0:
        return out
    cfg = LAYER_INPUT_CONFIG
    grid = (triton.cdiv(n_edges, cfg["BLOCK_M"]), n_focus)
    for k in range(n_gated):
        src, src_layer = (u0, 0) if k == 0 else (out, k - 1)
        wrap_triton(layer_input_kernel)[grid](
            src, out, z, gw, k, src_layer, k, n_edges, n_focus,
            LMAX=layout.lmax, CF=layout.focus_dim, GC=gate_chunk(layout),
            BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    return out


def backward_with_weights(grad_out, saved: Saved, weights: Weights, spec: StackSpec,
                          plan: LaunchPlan = LaunchPlan(), wgrad: WgradPlan | None = None, *,
                          grad_z=None, grad_y=None):
    """``(grad_u0, grad_alpha, dw0, dw1, dgw)``: the relay backward, with the weight gradients
    where ``wgrad`` is given (``saved.u0`` then needed; else the last three are empty) and the
    double backward's cotangents ``grad_z`` ``(n_gated, F, E, ROW)`` and ``grad_y`` ``(E, F, ROW)``
    of the saved ``z`` and ``y`` added (``None``: zero).  ``grad_out`` edge-major with unit column
    stride, or ``None`` (the result has no cotangent: a loss of forces alone); ``plan`` the
    relay's GEMM config and, at level 3, its compensated GEMMs."""
    if wgrad is not None:
        dw = weights.zeros()
    else:
        dw = Weights(*(saved.z.new_empty((0,)) for _ in range(3)))
    if _is_empty(saved.n_edges):
        h, ga = launchers.stack_backward(grad_out, saved, weights, spec, plan)
        return h, ga, dw.w0, dw.w1, dw.gw
    g_top = None if grad_y is None else _top_cotangent(grad_out, grad_y, saved.alpha if spec.apply_alpha else None)
    on_gz = None
    if wgrad is not None:
        on_gz = _weight_reductions(grad_out, g_top, saved, weights, spec, wgrad, dw)
    h, ga = launchers.stack_backward(grad_out, saved, weights, spec, plan,
                                     launchers.Training(g_top=g_top, grad_z=grad_z, on_gz=on_gz))
    return h, ga, dw.w0, dw.w1, dw.gw


def _top_cotangent(grad_out, grad_y, alpha):
    """The cotangent of ``y`` focus-major ``(F, E, ROW)`` when the double backward handed back
    ``grad_y``: ``grad_out * alpha + grad_y`` (``grad_out`` ``None``: ``grad_y`` alone; ``alpha``
    ``None``: no scaling)."""
    if grad_out is None:
        return grad_y.transpose(0, 1).contiguous()
    g = grad_out * alpha.unsqueeze(-1) if alpha is not None else grad_out
    return (g + grad_y).transpose(0, 1).contiguous()


def _weight_reductions(grad_out, g_top, saved: Saved, weights: Weights, spec: StackSpec, wgrad: WgradPlan,
                       dw: Weights):
    """Start the weight gradients of one backward: rebuild the layer inputs from ``u0`` and ``z``,
    reduce the identity layer's now (its cotangent is ``g_top``, or ``grad_out`` with alpha,
    or zero), and return the relay's ``on_gz`` that reduces each gated layer's."""
    z, u0, n_gated = saved.z, saved.u0, weights.n_gated
    red = _Reductions(z, saved.n_edges, saved.n_focus, spec.layout, wgrad)
    inputs = layer_inputs(u0, z, weights.gw, spec.layout)

    def input_of(k):
        return (u0, 0) if k == 0 else (inputs, k - 1)

    if g_top is not None:
        red.blocks(*input_of(n_gated), g_top, dw.w0, dw.w1, n_gated)
    elif grad_out is not None:
        red.top(*input_of(n_gated), grad_out, saved.alpha if spec.apply_alpha else None, dw.w0, dw.w1, n_gated)
    # else: the identity layer's cotangent is zero, and so are its weight gradients

    def on_gz(k, h, gz):
        red.gate(h, 0, z, weights.gw, dw.gw, k)
        red.blocks(*input_of(k), gz, dw.w0, dw.w1, k)

    return on_gz


def backward_chain(grad_out, saved: Saved, weights: Weights, spec: StackSpec, plan: LaunchPlan = LaunchPlan()):
    """The relay backward that also keeps its chain: ``(grad_u0, grad_alpha, chain)``, with
    ``chain[k]`` the cotangent of gated layer ``k``'s output (what ``double_backward`` reads)."""
    n_edges, n_focus, row = grad_out.shape
    chain = grad_out.new_empty((weights.n_gated, n_focus, n_edges, row))
    h, ga = launchers.stack_backward(grad_out, saved, weights, spec, plan, launchers.Training(chain=chain))
    return h, ga, chain


def double_backward(v, w, grad_out, saved: Saved, chain, weights: Weights, spec: StackSpec,
                    plan: LaunchPlan = LaunchPlan(), wgrad: WgradPlan | None = None, *,
                    need_grad_out: bool = True, need_alpha: bool = True):
    """``(d_grad_out, d_y, d_z, d_alpha, dw0, dw1, dgw)``: the gradients of
    ``<grad_u0, v> + <grad_alpha, w>`` with respect to the first-order backward's inputs
    (``reference.double_backward`` is the same math in plain PyTorch).

    ``v`` ``(F, E, ROW)`` and ``w`` ``(E, F)`` may be ``None`` (zero); ``saved``: the forward's
    ``z``, ``y`` and ``alpha``; ``chain`` is ``backward_chain``'s (``None`` or empty with gated
    layers: recomputed here); the weight terms only where ``wgrad`` is given (else empty); ``d_y``
    only with alpha and ``w`` (else empty), ``d_alpha`` only with alpha and ``need_alpha``,
    ``d_grad_out`` only with ``need_grad_out`` (else empty: the identity layer's GEMM runs only
    for what needs ``y_dot``).  ``grad_out`` edge-major with unit column stride; ``plan``: the GEMM
    config and, at level 3, the split fp16 products.

    Steps: the tangent through the gated layers (``_gated_tangents``), the identity layer's weight
    reduction, then ``y_dot`` and what reads it (``_identity_tangent``), and ``w``'s terms."""
    n_edges, n_focus, row = grad_out.shape
    layout, apply_alpha = spec.layout, spec.apply_alpha

    def empty():                      # distinct tensors: an operator's outputs may not alias
        return grad_out.new_empty((0,))

    need_alpha = need_alpha and apply_alpha
    d_grad_out = grad_out.new_empty((n_edges, n_focus, row)) if need_grad_out else empty()
    d_z = saved.z.new_empty(saved.z.shape)
    d_alpha = grad_out.new_empty((n_edges, n_focus)) if need_alpha else empty()
    with_w = apply_alpha and w is not None
    d_y = grad_out.new_empty((n_edges, n_focus, row)) if with_w else empty()
    dw = weights.zeros() if wgrad is not None else Weights(empty(), empty(), empty())
    if _is_empty(n_edges):
        return d_grad_out, d_y, d_z, d_alpha, dw.w0, dw.w1, dw.gw
    if weights.n_gated and (chain is None or chain.numel() == 0):
        chain = backward_chain(grad_out, saved, weights, spec, plan)[2]
    u_dot = v.clone(memory_format=torch.contiguous_format) if v is not None else grad_out.new_zeros((n_focus, n_edges, row))
    split = launchers.split_weights(weights.w0, weights.w1) if plan.compensated else None
    z_dot = torch.empty_like(u_dot)
    red = _Reductions(grad_out, n_edges, n_focus, layout, wgrad) if wgrad is not None else None
    tangent = _Tangent(weights, layout, plan.gemm_cfg, split, red, dw)
    _gated_tangents(tangent, u_dot, z_dot, saved.z, chain, d_z)
    if red is not None:
        # z_dot is dead: the top reduction scales grad_out into it (no surface of its own)
        red.top(u_dot, 0, grad_out, saved.alpha if apply_alpha else None, dw.w0, dw.w1, weights.n_gated, scratch=z_dot)
    del z_dot
    if need_grad_out or need_alpha:
        # y_dot, edge-major and unscaled, straight into d_grad_out where that is wanted
        y_dot = d_grad_out if need_grad_out else grad_out.new_empty((n_edges, n_focus, row))
        _identity_tangent(tangent, u_dot, y_dot)
        del u_dot
        if need_alpha:
            launchers.alpha_grad(grad_out, y_dot, d_alpha, layout, weights.w0)
        if need_grad_out and apply_alpha:
            d_grad_out.mul_(saved.alpha.unsqueeze(-1))
            if with_w:
                d_grad_out.addcmul_(saved.y, w.unsqueeze(-1))
    if with_w:
        torch.mul(grad_out, w.unsqueeze(-1), out=d_y)
    return d_grad_out, d_y, d_z, d_alpha, dw.w0, dw.w1, dw.gw


@dataclass(frozen=True)
class _Tangent:
    """What every step of the double backward's pass along ``v`` reads: the weights, the layout,
    the GEMM config and ``split`` (level 3: ``split_weights(w0, w1)``), and the weight reductions
    (``None``: no weight terms) with the gradients ``dw`` they sum into."""

    weights: Weights
    layout: StackLayout
    gemm_cfg: dict | None
    split: tuple | None
    reductions: _Reductions | None
    dw: Weights


def _gated_tangents(t: _Tangent, u_dot, z_dot, z, chain, d_z):
    """The pass through the gated layers, first to last: per layer ``z_dot = u_dot @ W`` (the
    forward's GEMM), with weight terms the relay's ``gz`` from the chain and the reductions,
    then ``curvature.tangent_kernel``: ``u_dot`` in place and ``d_z[k]``."""
    layout, n_focus, n_edges = t.layout, u_dot.shape[0], u_dot.shape[1]
    red = t.reductions
    if red is not None:
        # the gate's products on the BLAS where the first backward's ran there (exact weights only)
        blas = launchers.exact_on_blas(t.split is not None, layout, u_dot)
        fold = pointwise_recomputes_gate(layout) and not blas
        sg = None if fold else u_dot.new_empty((n_focus, n_edges, layout.gate_width))
    cfg = training_pointwise_config(layout)
    grid = (triton.cdiv(n_edges, cfg["BLOCK_M"]), n_focus)
    for k in range(t.weights.n_gated):
        block_gemm(Operand(u_dot), BlockWeights(t.weights.w0, t.weights.w1, k, layout, split=t.split),
                   Epilogue(out=z_dot), t.gemm_cfg)
        if red is not None:
            # gz lives in d_z[k] until the tangent step overwrites it (every column): the
            # reductions read it first, and the double backward's peak holds one surface less
            gz = d_z[k]
            launchers.relay_gz(chain[k], z, t.weights.gw, k, layout, sg, gz, fold=fold, blas=blas)
            red.blocks(u_dot, 0, gz, t.dw.w0, t.dw.w1, k)
            red.gate(chain, k, z, t.weights.gw, t.dw.gw, k, zd=z_dot)
        wrap_triton(tangent_kernel)[grid](
            u_dot, z_dot, z, chain, t.weights.gw, d_z, k, k, n_edges, n_focus,
            LMAX=layout.lmax, CF=layout.focus_dim, CP=triton.next_power_of_2(layout.focus_dim),
            GC=gate_chunk(layout), BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )


def _identity_tangent(t: _Tangent, u_dot, y_dot):
    """``y_dot = u_dot + u_dot @ W`` of the identity layer, edge-major and unscaled."""
    block_gemm(Operand(u_dot), BlockWeights(t.weights.w0, t.weights.w1, t.weights.n_gated, t.layout, split=t.split),
               Epilogue(res=u_dot, out=y_dot, out_edge_major=True), t.gemm_cfg)
