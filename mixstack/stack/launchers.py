"""Launchers: allocate the surfaces, pick launch configs, launch the kernels.

Everything here is plain Python over tensor metadata, so it runs unchanged
eagerly and inside a ``triton_op`` body being traced (kernels go through
``wrap_triton``; configs become constants of the traced graph).

Launch configs come from ``configs`` (the level-1 defaults) or, at level >= 2,
from the caller's ``LaunchPlan`` (a tuned table entry).  A call takes the stack's values as
``stack.values`` groups them: its ``StackSpec``, its ``Weights`` and, in the backward, the
forward's ``Saved`` state.  Surfaces (all float32): the forward writes ``z (n_gated, F, E, ROW)``, the
edge-major result and, with alpha, the unscaled result ``y``, using two
ping-pong ``(F, E, ROW)`` activation buffers and a ``(F, E, G)`` gate-sigmoid
surface.  The relay backward keeps one running gradient ``h (F, E, ROW)``
updated in place, one ``gz (F, E, ROW)`` and one sigmoid surface, each reused
by every layer; the fused backward keeps only ``h`` and a per-program scratch
whose size does not depend on E.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from torch.library import wrap_triton

from ..core.layout import StackLayout
from ..kernels.compensated import split_weights_kernel
from ..kernels.fused import fused_backward_kernel
from ..kernels.gate import gate_backward_kernel, gate_kernel
from ..kernels.gate_elementwise import gate_cotangent_kernel, gate_from_logits_kernel
from ..kernels.reduce import alpha_grad_kernel
from ..tuning.configs import (
    ALPHA_GRAD_CONFIG,
    FUSED_PROGRAMS_PER_SM,
    block_k,
    gate_chunk,
    gate_config,
    pointwise_config,
    pointwise_recomputes_gate,
)
from ..tuning.products import on_blas
from .blas import add_logit_contraction, gate_logits, route_weights
from .gemm import BlockWeights, Epilogue, Operand, block_gemm, persistent_programs
from .values import Saved, StackSpec, Weights


def _is_empty(n) -> bool:
    return isinstance(n, int) and n == 0


SPLIT_BLOCK = 1024


def split_matrices(w):
    """Level 3: the fp16 head and tail of each matrix of ``w`` (``(n, F, rows, cols)``)
    and its power-of-two scale, ``(hi, lo, up (n, F))`` (``kernels.compensated``)."""
    hi = torch.empty(w.shape, dtype=torch.float16, device=w.device)
    lo = torch.empty_like(hi)
    up = w.new_empty(w.shape[:2])
    wrap_triton(split_weights_kernel)[(w.shape[0] * w.shape[1],)](
        w, hi, lo, up, SIZE=w.shape[-1] * w.shape[-2], BLOCK=SPLIT_BLOCK)
    return hi, lo, up


def split_weights(w0, w1):
    """Level 3: ``(w0_hi, w0_lo, w1_hi, w1_lo, up (n, F, 2))``, ``split_matrices`` of both blocks."""
    w0_hi, w0_lo, up0 = split_matrices(w0)
    w1_hi, w1_lo, up1 = split_matrices(w1)
    return w0_hi, w0_lo, w1_hi, w1_lo, torch.stack((up0, up1), -1)


def _gate_weights(gw, gate_split):
    """``(gw or its head, tail, scales)`` as the gate kernels take them: ``gate_split``
    (level 3) is ``split_matrices(gw)``; without it the tail and scale pointers are unused."""
    return gate_split if gate_split is not None else (gw, gw, gw)


def exact_on_blas(compensated: bool, layout: StackLayout, t) -> bool:
    """Whether a call's exact products (every product unless it is ``compensated``) run on the
    BLAS (``tuning.products``): the gate's here; the block GEMMs decide in ``block_gemm``."""
    return not compensated and on_blas(layout, t)


def gate(z, gw, layer, sg, n_edges, n_focus, layout, u=None, u_next=None, amax=None, gate_split=None, blas=False):
    """The gate kernel; ``amax`` (level 3, with ``u_next``): record the m = 0 block's row maxima;
    ``gate_split`` (level 3): ``split_matrices(gw)``, the logits on split fp16 products; ``blas``
    (the exact forward): the logits a BLAS product into ``sg``, then the elementwise kernel."""
    cfg = gate_config(layout)
    grid = ((n_edges + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"], n_focus)
    if blas:
        if amax is not None or gate_split is not None or u is None or u_next is None:
            raise ValueError("the gate's BLAS products are the exact forward's: u and u_next, no split or maxima")
        gate_logits(z, gw, layer, sg, layout.focus_dim)
        wrap_triton(gate_from_logits_kernel)[grid](
            z, u, u_next, sg, layer, n_edges, n_focus, LMAX=layout.lmax, CF=layout.focus_dim, GC=gate_chunk(layout),
            BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        return
    gw_main, gw_lo, gw_up = _gate_weights(gw, gate_split)
    wrap_triton(gate_kernel)[grid](
        z, gw_main, gw if u is None else u, gw if u_next is None else u_next, sg,      # gw: unused pointers
        gw if amax is None else amax, gw_lo, gw_up,
        layer, n_edges, n_focus,
        LMAX=layout.lmax, CF=layout.focus_dim, GC=gate_chunk(layout),
        WRITE_U=u is not None, WRITE_AMAX=amax is not None, COMPENSATED=gate_split is not None,
        BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


@dataclass(frozen=True)
class LaunchPlan:
    """How one call's kernels launch: ``gemm_cfg`` a tuned GEMM launch config (``None``: the
    level-1 default); ``fused_cfg`` (the backward) the fused kernel's config (``None``: the relay);
    ``compensated`` (level 3) the GEMMs on split fp16 products; ``writer_amax`` (level 3) each
    compensated GEMM's operand comes with its rows' per-block maxima, recorded by the kernel that
    wrote it (``False``, for tests and probes: every compensated GEMM finds them itself, with the
    same bits)."""

    gemm_cfg: dict | None = None
    fused_cfg: dict | None = None
    compensated: bool = False
    writer_amax: bool = True


@dataclass(frozen=True)
class Training:
    """What a training backward adds to the relay (``stack.training``; the fused kernel keeps no
    ``gz`` surface, so none of these runs there).

    ``chain`` ``(n_gated, F, E, ROW)`` receives, at ``k``, the cotangent of gated layer ``k``'s
    output (each GEMM writes the next layer's ``h`` there instead of in place: the same kernels,
    the same bits), which the double backward reads; ``g_top`` (focus-major, ``(F, E, ROW)``)
    replaces ``grad_out * alpha`` as the cotangent of ``y`` (the forward's backward when the
    double backward handed back a cotangent of ``y`` too); ``grad_z`` ``(n_gated, F, E, ROW)`` is
    added to each layer's ``gz`` (the double backward's cotangent of the saved ``z``);
    ``on_gz(k, h, gz)`` runs after layer ``k``'s ``gz`` is formed and before ``h`` moves on (the
    weight gradients read both there)."""

    chain: torch.Tensor | None = None
    g_top: torch.Tensor | None = None
    grad_z: torch.Tensor | None = None
    on_gz: Callable | None = None

    def h_of(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Where the cotangent of gated layer ``k``'s output lives (``k = -1``: the input's)."""
        return h if self.chain is None or k < 0 else self.chain[k]


def stack_forward(u0, alpha, weights: Weights, spec: StackSpec, plan: LaunchPlan = LaunchPlan()):
    """Level-1 forward: ``(result, z, y)``; inputs contiguous fp32.

    ``result (E, F, ROW)``, ``z (n_gated, F, E, ROW)``, and with alpha the
    unscaled result ``y (E, F, ROW)`` for the alpha gradient (else empty).
    ``plan``: the GEMM config; ``compensated`` (level 3): the GEMMs run split fp16 products, and
    each layer input after the first comes with its rows' per-block maxima, recorded by the gate
    kernel and the |m| = 1 GEMM that wrote it (unless ``writer_amax`` is off).
    """
    w0, w1, gw = weights.w0, weights.w1, weights.gw
    layout, apply_alpha, gemm_cfg = spec.layout, spec.apply_alpha, plan.gemm_cfg
    n_focus, n_edges, row = u0.shape
    n_gated = weights.n_gated
    z = u0.new_empty((n_gated, n_focus, n_edges, row))
    y = u0.new_empty((n_edges, n_focus, row) if apply_alpha else (0,))
    if _is_empty(n_edges):
        return u0.new_empty((n_edges, n_focus, row)), z, y
    u = u0
    split = split_weights(w0, w1) if plan.compensated else None
    # The forward gate stays exact at level 3: split fp16 logits doubled its registers and
    # slowed the level-3 forward (BENCHMARKS.md, "The gate's products on tensor cores").
    record = plan.compensated and plan.writer_amax
    blas = exact_on_blas(plan.compensated, layout, u0)
    if blas:                             # laid out once for the BLAS's products, not per product
        w0, w1 = route_weights(w0, w1, transposed=False)
    amax = None                          # the row maxima of u, where a kernel recorded them
    if n_gated:
        sg = u0.new_empty((n_focus, n_edges, layout.gate_width))
        buffers = [torch.empty_like(u0), torch.empty_like(u0) if n_gated > 1 else None]
        if record:                       # every gated layer's row maxima, zeroed in one launch
            maxima = u0.new_zeros((n_gated, n_focus, n_edges, 2))
    for k in range(n_gated):
        u_next = buffers[k % 2]
        amax_next = maxima[k] if record else None
        a = Operand(u, amax=amax)
        block_gemm(a, BlockWeights(w0, w1, k, layout, (0,), split), Epilogue(z=z), gemm_cfg)
        gate(z, gw, k, sg, n_edges, n_focus, layout, u=u, u_next=u_next, amax=amax_next, blas=blas)
        block_gemm(a, BlockWeights(w0, w1, k, layout, (1,), split),
                   Epilogue(z=z, sg=sg, res=u, out=u_next, amax_out=amax_next), gemm_cfg)
        u, amax = u_next, amax_next
    if n_gated:
        # The result is allocated only now, once the sigmoids and the ping-pong buffer that
        # is no longer read are released: eagerly, the caching allocator hands it their
        # memory, so the forward's peak holds one surface less (z, y and the live buffer).
        del sg, buffers
        if record:
            del maxima
    out = u0.new_empty((n_edges, n_focus, row))
    block_gemm(Operand(u, amax=amax), BlockWeights(w0, w1, n_gated, layout, split=split),
               Epilogue(res=u, out=out, y=y if apply_alpha else None, alpha=alpha if apply_alpha else None,
                        alpha_on_out=apply_alpha, out_edge_major=True), gemm_cfg)
    return out, z, y


def stack_backward(grad_out, saved: Saved, weights: Weights, spec: StackSpec, plan: LaunchPlan = LaunchPlan(),
                   training: Training | None = None):
    """Level-1/2 backward: ``(grad_u0 (F, E, ROW), grad_alpha (E, F) or empty)`` from the saved
    ``z`` and ``y`` (``saved.u0`` is not read).

    The identity layer (with the alpha fold) and ``grad_alpha`` first; then per
    gated layer either the relay (recompute the gate sigmoids, write ``gz``
    pointwise, ``h += gz @ W^T`` over both blocks) or, with ``plan.fused_cfg``, the
    fused kernel's two passes, which allocate no sigmoid or ``gz`` surface.
    ``W^T`` is materialised once per call; ``grad_out`` is edge-major with
    unit column stride (its F stride may be 0: the gradient of a sum over the
    focus streams is read as it is, not copied); ``y`` is contiguous; ``h`` is
    updated in place.  ``plan.compensated``
    (level 3): the GEMMs run split fp16 products (the fused kernel's GEMM phase too);
    the alpha-gradient kernel records the per-block row maxima of ``grad_out * alpha``
    and the pointwise kernel those of ``gz`` for them (unless ``plan.writer_amax`` is off:
    the GEMMs find them, as in ``stack_forward``).

    ``training`` (the relay only): what a training backward adds (``Training``).
    ``grad_out=None`` (training: the result has no cotangent, only ``z`` and ``y`` have one):
    ``grad_alpha`` is zero, and the cotangent of ``y`` is ``training.g_top`` or, without it, zero
    (no identity-layer GEMM runs).
    """
    z = saved.z
    h = z.new_empty(saved.focus_major())
    grad_alpha = z.new_empty((saved.n_edges, saved.n_focus) if spec.apply_alpha else (0,))
    if _is_empty(saved.n_edges):
        return h, grad_alpha
    fused = plan.fused_cfg is not None
    if fused and (training is not None or grad_out is None):
        raise ValueError("the fused backward keeps no gz surface: chain, g_top, grad_z and on_gz "
                         "need the relay (fused_cfg=None)")
    training = training if training is not None else Training()
    # the row maxima of each compensated GEMM's operand, in turn g * alpha and every layer's gz
    record = plan.compensated and plan.writer_amax and not fused and training.grad_z is None
    amax = h.new_empty((saved.n_focus, saved.n_edges, 2)) if record else None
    if spec.apply_alpha and grad_out is None:
        grad_alpha.zero_()
    elif spec.apply_alpha:
        alpha_grad(grad_out, saved.y, grad_alpha, spec.layout, weights.w0,
                   alpha=saved.alpha, amax=amax if training.g_top is None else None)
    if exact_on_blas(plan.compensated, spec.layout, z):      # each W^T as the BLAS's products read it
        wt = Weights(*route_weights(weights.w0, weights.w1, transposed=True), weights.gw)
    else:
        wt = weights.transposed()
    split = split_weights(wt.w0, wt.w1) if plan.compensated else None
    gate_split = split_matrices(wt.gw) if plan.compensated and wt.n_gated and not fused else None
    top = BlockWeights(wt.w0, wt.w1, wt.n_gated, spec.layout, split=split)
    scaled = spec.apply_alpha
    identity_layer(grad_out, saved.alpha if scaled else None, top, training.h_of(wt.n_gated - 1, h),
                   amax=amax if scaled else None, g_top=training.g_top, gemm_cfg=plan.gemm_cfg)
    if fused:
        _fused_layers(h, z, wt, spec.layout, plan.fused_cfg, split)
    else:
        _relay_layers(h, z, wt, spec.layout, plan, (split, gate_split), amax, training)
    return h, grad_alpha


def alpha_grad(grad_out, y, grad_alpha, layout: StackLayout, unused, alpha=None, amax=None):
    """``grad_alpha[e, f] = sum(grad_out[e, f] * y[e, f])`` (``kernels.reduce.alpha_grad_kernel``),
    both edge-major ``(E, F, ROW)`` (``grad_out`` with unit column stride); with ``amax`` (level 3)
    also the per-block row maxima of ``grad_out * alpha``.  ``unused`` fills the unused pointers."""
    cfg = ALPHA_GRAD_CONFIG
    n_edges, n_focus, row = grad_out.shape
    n_rows = n_edges * n_focus
    wrap_triton(alpha_grad_kernel)[((n_rows + cfg["BLOCK_R"] - 1) // cfg["BLOCK_R"],)](
        grad_out, y, grad_alpha, unused if amax is None else alpha, unused if amax is None else amax,
        n_rows, n_focus, grad_out.stride(0), grad_out.stride(1),
        ROW=row, M0=layout.m0, WRITE_AMAX=amax is not None,
        BLOCK_R=cfg["BLOCK_R"], BLOCK_C=cfg["BLOCK_C"], num_warps=cfg["num_warps"],
    )


def identity_layer(grad_out, alpha, top: BlockWeights, out, *, amax=None, g_top=None, gemm_cfg=None):
    """The identity layer's backward into ``out`` (focus-major): ``g + g @ W^T`` over both blocks
    of ``top`` (transposed), with ``g`` the edge-major ``grad_out`` scaled by ``alpha`` inside
    the GEMM (``alpha`` ``None``: unscaled; ``amax`` (level 3): the row maxima of ``grad_out *
    alpha``), or ``g_top`` (focus-major) in its place; neither: ``out`` is zero."""
    if g_top is not None:
        block_gemm(Operand(g_top), top, Epilogue(res=g_top, out=out), gemm_cfg)
    elif grad_out is None:
        out.zero_()
    else:
        block_gemm(Operand(grad_out, edge_major=True, amax=amax), top,
                   Epilogue(res=grad_out, out=out, alpha=alpha, alpha_on_a=alpha is not None), gemm_cfg)


def relay_gz(h, z, gw, layer, layout, sg, gz, amax=None, gate_split=None, fold=False, blas=False):
    """The relay's pointwise part of one gated layer: the gate sigmoids (``fold``: formed
    inside the pointwise kernel; else recomputed into ``sg`` by a gate launch), then
    ``gz`` from ``h`` and ``z`` (``amax``: ``gz``'s row maxima, recorded for the
    compensated GEMM; ``gate_split``: ``split_matrices(gw)``, the gate's products
    compensated as in the forward; ``blas``: the gate's two products on the BLAS, the logits
    and then the logit gradients passing through ``sg``)."""
    n_focus, n_edges = z.shape[1], z.shape[2]
    if blas:
        if fold or amax is not None or gate_split is not None:
            raise ValueError("the gate's BLAS products need the sigmoid surface and exact weights")
        gate_logits(z, gw, layer, sg, layout.focus_dim)        # the kernel forms the sigmoids from them
        cfg = pointwise_config(layout)
        wrap_triton(gate_cotangent_kernel)[((n_edges + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"], n_focus)](
            h, z, sg, gz, layer, n_edges, n_focus, LMAX=layout.lmax, CF=layout.focus_dim, GC=gate_chunk(layout),
            BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        add_logit_contraction(gz, sg, gw, layer, layout.focus_dim)
        return
    if not fold:
        gate(z, gw, layer, sg, n_edges, n_focus, layout, gate_split=gate_split)
    cfg = pointwise_config(layout)
    gw_main, gw_lo, gw_up = _gate_weights(gw, gate_split)
    wrap_triton(gate_backward_kernel)[((n_edges + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"], n_focus)](
        h, z, gw if fold else sg, gw_main, gz, gw if amax is None else amax, gw_lo, gw_up,  # gw: unused
        layer, n_edges, n_focus,
        LMAX=layout.lmax, CF=layout.focus_dim, CP=triton.next_power_of_2(layout.focus_dim), GC=gate_chunk(layout),
        WRITE_AMAX=amax is not None, RECOMPUTE_SG=fold, COMPENSATED=gate_split is not None,
        BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def _relay_layers(h, z, wt: Weights, layout: StackLayout, plan: LaunchPlan, splits, amax, training: Training):
    """The relay over the gated layers, last to first: per layer ``relay_gz``, ``training``'s
    additions, then ``h_out = h_in + gz @ W^T`` over both blocks of ``wt`` (transposed).
    ``splits`` (level 3): ``(split_weights(w0t, w1t), split_matrices(gw))``, else ``(None, None)``;
    ``amax``: the operands' row maxima, recorded by the pointwise kernel."""
    if not wt.n_gated:
        return
    split, gate_split = splits
    n_focus, n_edges = z.shape[1], z.shape[2]
    blas = exact_on_blas(plan.compensated, layout, h)
    fold = pointwise_recomputes_gate(layout, plan.compensated) and not blas
    sg = None if fold else h.new_empty((n_focus, n_edges, layout.gate_width))
    gz = torch.empty_like(h)
    for k in range(wt.n_gated - 1, -1, -1):
        h_in, h_out = training.h_of(k, h), training.h_of(k - 1, h)
        relay_gz(h_in, z, wt.gw, k, layout, sg, gz, amax=amax, gate_split=gate_split, fold=fold, blas=blas)
        if training.grad_z is not None:
            gz.add_(training.grad_z[k])
        if training.on_gz is not None:
            training.on_gz(k, h_in, gz)
        block_gemm(Operand(gz, amax=amax), BlockWeights(wt.w0, wt.w1, k, layout, split=split),
                   Epilogue(res=h_in, out=h_out), plan.gemm_cfg)


def _fused_layers(h, z, wt: Weights, layout: StackLayout, cfg: dict, split):
    """The fused backward over the gated layers, last to first, in ``h``: one scratch for the
    call, sized by the persistent grid, not by E."""
    if not wt.n_gated:
        return
    n_focus, n_edges = z.shape[1], z.shape[2]
    bm = cfg["BLOCK_M"]
    programs = persistent_programs(h, (n_edges + bm - 1) // bm * n_focus, FUSED_PROGRAMS_PER_SM)
    scratch = h.new_empty((programs, bm, max(layout.m0, layout.m1)))
    for k in range(wt.n_gated - 1, -1, -1):
        fused_layer(h, z, wt, k, layout, cfg, scratch, split=split)


def fused_layer(h, z, wt: Weights, layer: int, layout: StackLayout, cfg: dict, scratch, split=None):
    """One gated layer of the fused backward: the m = 0 pass, then the |m| = 1 pass
    (the m = 0 pass reads the |m| = 1 columns of ``h`` before they change).  ``wt``: the
    transposed block weights and ``gw``; ``split`` (level 3): ``split_weights(w0t, w1t)``, the
    GEMM phase runs the compensated products."""
    n_focus, n_edges = z.shape[1], z.shape[2]
    bm = cfg["BLOCK_M"]
    n_tiles = (n_edges + bm - 1) // bm * n_focus
    programs = scratch.shape[0]
    w0t, w0lo, w1t, w1lo, wup = BlockWeights(wt.w0, wt.w1, layer, layout, split=split).pointers()
    for segment in (0, 1):
        wrap_triton(fused_backward_kernel)[(programs,)](
            h, z, wt.gw, w0t, w1t, scratch, w0lo, w1lo, wup, layer, n_edges, n_focus, n_tiles,
            LMAX=layout.lmax, CF=layout.focus_dim, SEGMENT=segment, COMPENSATED=split is not None,
            BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k(layout), GC=gate_chunk(layout),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
