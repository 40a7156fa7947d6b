"""Launchers: allocate the surfaces, pick launch configs, launch the kernels.

Everything here is plain Python over tensor metadata, so it runs unchanged
eagerly and inside a ``triton_op`` body being traced (kernels go through
``wrap_triton``; configs become constants of the traced graph).

Launch configs come from ``configs`` (the level-1 defaults) or, at level >= 2,
from the caller (a tuned table entry).  Surfaces (all float32): the forward writes ``z (n_gated, F, E, ROW)``, the
edge-major result and, with alpha, the unscaled result ``y``, using two
ping-pong ``(F, E, ROW)`` activation buffers and a ``(F, E, G)`` gate-sigmoid
surface.  The relay backward keeps one running gradient ``h (F, E, ROW)``
updated in place, one ``gz (F, E, ROW)`` and one sigmoid surface, each reused
by every layer; the fused backward keeps only ``h`` and a per-program scratch
whose size does not depend on E.
"""

from __future__ import annotations

import torch
import triton
from torch.library import wrap_triton

from ..core.layout import StackLayout
from ..kernels.compensated import split_weights_kernel
from ..kernels.fused import fused_backward_kernel
from ..kernels.gate import gate_backward_kernel, gate_kernel
from ..kernels.gemm import block_gemm_kernel
from ..kernels.gemm_tma import fold_tile_amax_kernel, tma_block_gemm_kernel
from ..kernels.reduce import alpha_grad_kernel
from ..tuning.configs import (
    ALPHA_GRAD_CONFIG,
    FUSED_PROGRAMS_PER_SM,
    INTERPRETER_PROGRAMS,
    block_k,
    default_gemm_config,
    gate_chunk,
    gate_config,
    gemm_block_k,
    pointwise_config,
    pointwise_recomputes_gate,
)


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


def _weight_args(w0, w1, split):
    """The weight pointers a GEMM-phase kernel takes, ``(w0, w0_lo, w1, w1_lo, up)``: with
    ``split`` (level 3) its heads, tails and scales; without, ``w0`` fills the unused ones."""
    return split if split is not None else (w0, w0, w1, w0, w0)


def block_gemm(a, w0, w1, layer, n_edges, n_focus, layout, gemm_cfg, *, blocks, res=None, out=None, z=None,
               y=None, sg=None, alpha=None, a_edge_major=False, alpha_on_a=False,
               gate=False, alpha_on_out=False, out_edge_major=False, split=None, amax_in=None,
               amax_out=None):
    """Launch ``block_gemm_kernel`` over ``blocks`` (``(0,)``, ``(1,)`` or ``(0, 1)``);
    ``split`` (level 3): ``split_weights(w0, w1)``, run the compensated products,
    with ``amax_in`` ``(F, E, 2)`` the rows' per-block maxima of ``a`` as its writer
    recorded them (``None``: the kernel finds them), and ``amax_out`` (zeroed) where
    ``out`` is the next compensated GEMM's operand.
    An edge-major ``a`` (``a_edge_major``) is read through its E and F strides.  A level-3
    config with ``TMA_FIELD`` set runs ``gemm_tma.tma_block_gemm_kernel`` instead, one launch
    per block, where ``tma_fits(a)``."""
    cfg = gemm_cfg or default_gemm_config(layout)
    use_tma = bool(split is not None and cfg.get(TMA_FIELD) and tma_fits(a, a_edge_major))
    if use_tma and len(blocks) == 2:
        # One launch per block: Triton 3.6's Hopper pass specialises the K loop's warps only
        # where the block (and with it the trip count) is a compile-time constant.
        for block in blocks:
            block_gemm(a, w0, w1, layer, n_edges, n_focus, layout, gemm_cfg, blocks=(block,), res=res, out=out,
                       z=z, y=y, sg=sg, alpha=alpha, a_edge_major=a_edge_major, alpha_on_a=alpha_on_a, gate=gate,
                       alpha_on_out=alpha_on_out, out_edge_major=out_edge_major, split=split, amax_in=amax_in,
                       amax_out=amax_out)
        return
    # Pointers the constexpr flags leave unused get a weight tensor, never an
    # activation surface, so no surface reaches a compiler as several aliased
    # arguments for nothing.  (On the H200 the compiled level-2 model frame,
    # which passed the activation as these placeholders, held ~6 surfaces more
    # at its peak than level 3, which passed weights; with weights here both
    # levels' frames peak alike, 11589 vs 11584 MiB at cu-bcc-4394.)
    w0, w0lo, w1, w1lo, wup = _weight_args(w0, w1, split)
    unused = w0
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], gemm_block_k(layout, cfg)
    widths = {0: layout.m0, 1: layout.m1}
    n_tiles = sum(triton.cdiv(widths[b], bn) for b in blocks)
    grid = ((n_edges + bm - 1) // bm * n_tiles, n_focus)
    kernel, tile_amax, extra = block_gemm_kernel, None, {}
    if use_tma:
        kernel = tma_block_gemm_kernel
        ensure_allocator()
        extra = {"PERSISTENT": bool(cfg.get(PERSISTENT_FIELD))}
        if extra["PERSISTENT"]:           # one program per SM, shared among the focus streams
            grid = (max(1, min(grid[0], persistent_programs(a, grid[0] * n_focus, 1) // n_focus)), n_focus)
        if amax_out is not None:       # the TMA kernel stores each N tile's row maxima; folded below
            tile_amax = amax_out.new_empty((n_focus, n_edges, n_tiles))
    wrap_triton(kernel)[grid](
        a, w0, w1, unused if res is None else res, unused if out is None else out,
        unused if z is None else z, unused if y is None else y, unused if sg is None else sg,
        unused if alpha is None else alpha,
        w0lo, w1lo, wup, unused if amax_in is None else amax_in,
        unused if amax_out is None else (amax_out if tile_amax is None else tile_amax),
        layer, n_edges, n_focus, a.stride(0) if a_edge_major else 0, a.stride(1) if a_edge_major else 0,
        LMAX=layout.lmax, CF=layout.focus_dim,
        FIRST_BLOCK=blocks[0], BOTH_BLOCKS=len(blocks) == 2,
        A_EDGE_MAJOR=a_edge_major, ALPHA_ON_A=alpha_on_a,
        STORE_Z=z is not None, GATE=gate, RESIDUAL=res is not None,
        ALPHA_ON_OUT=alpha_on_out, OUT_EDGE_MAJOR=out_edge_major, STORE_OUT=out is not None,
        STORE_Y=y is not None, COMPENSATED=split is not None,
        AMAX_IN=amax_in is not None, AMAX_OUT=amax_out is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **extra,
    )
    if tile_amax is not None:
        rows = n_focus * n_edges
        wrap_triton(fold_tile_amax_kernel)[(triton.cdiv(rows, FOLD_BLOCK),)](
            tile_amax, amax_out, rows, NT=n_tiles, SLOT=blocks[0], BLOCK=FOLD_BLOCK)


FOLD_BLOCK = 256
TMA_FIELD = "TMA"      # a level-3 GEMM config with this set runs ``gemm_tma`` (docs/contract.md §4)
PERSISTENT_FIELD = "persistent"     # ... and with this set too, its persistent form


def tma_fits(a, a_edge_major: bool) -> bool:
    """Whether a TMA descriptor can read ``a``'s rows: a 16-byte aligned start and row stride
    (the whole surfaces the stack allocates always are; a caller's offset view may not be)."""
    row_stride = a.stride(0) if a_edge_major else a.shape[-1]
    return a.storage_offset() % 4 == 0 and row_stride % 4 == 0 and (not a_edge_major or a.stride(1) % 4 == 0)


def _scratch(size: int, alignment: int, stream):
    """Global scratch for the TMA kernel's device-side descriptors, from torch's allocator."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton an allocator for kernels' global scratch where none is set (its default
    raises at launch); one the caller set is kept."""
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _gate_weights(gw, gate_split):
    """``(gw or its head, tail, scales)`` as the gate kernels take them: ``gate_split``
    (level 3) is ``split_matrices(gw)``; without it the tail and scale pointers are unused."""
    return gate_split if gate_split is not None else (gw, gw, gw)


def gate(z, gw, layer, sg, n_edges, n_focus, layout, u=None, u_next=None, amax=None, gate_split=None):
    """The gate kernel; ``amax`` (level 3, with ``u_next``): record the m = 0 block's row maxima;
    ``gate_split`` (level 3): ``split_matrices(gw)``, the logits on split fp16 products."""
    cfg = gate_config(layout)
    grid = ((n_edges + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"], n_focus)
    gw_main, gw_lo, gw_up = _gate_weights(gw, gate_split)
    wrap_triton(gate_kernel)[grid](
        z, gw_main, gw if u is None else u, gw if u_next is None else u_next, sg,      # gw: unused pointers
        gw if amax is None else amax, gw_lo, gw_up,
        layer, n_edges, n_focus,
        LMAX=layout.lmax, CF=layout.focus_dim, GC=gate_chunk(layout),
        WRITE_U=u is not None, WRITE_AMAX=amax is not None, COMPENSATED=gate_split is not None,
        BLOCK_M=cfg["BLOCK_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def stack_forward(u0, alpha, w0, w1, gw, layout: StackLayout, apply_alpha: bool, gemm_cfg=None,
                  compensated: bool = False, writer_amax: bool = True):
    """Level-1 forward: ``(result, z, y)``; inputs contiguous fp32.

    ``result (E, F, ROW)``, ``z (n_gated, F, E, ROW)``, and with alpha the
    unscaled result ``y (E, F, ROW)`` for the alpha gradient (else empty).
    ``gemm_cfg``: a tuned GEMM launch config (``None``: the level-1 default).
    ``compensated`` (level 3): the GEMMs run split fp16 products; each layer input
    after the first comes with its rows' per-block maxima, recorded by the gate
    kernel and the |m| = 1 GEMM that wrote it (``writer_amax=False``, for tests
    and probes: every compensated GEMM finds them itself, with the same bits).
    """
    n_focus, n_edges, row = u0.shape
    n_gated = w0.shape[0] - 1
    z = u0.new_empty((n_gated, n_focus, n_edges, row))
    y = u0.new_empty((n_edges, n_focus, row) if apply_alpha else (0,))
    if _is_empty(n_edges):
        return u0.new_empty((n_edges, n_focus, row)), z, y
    u = u0
    split = split_weights(w0, w1) if compensated else None
    # The forward gate stays exact at level 3: with split fp16 logits (122 registers
    # against 56) the level-3 forward at the S1 key took 5.50-5.91 ms on the H200
    # (2026-12-01, two runs) against 4.94 with the exact gate (2026-11-30).
    record = compensated and writer_amax
    amax = None                          # the row maxima of u, where a kernel recorded them
    if n_gated:
        sg = u0.new_empty((n_focus, n_edges, layout.gate_width))
        buffers = [torch.empty_like(u0), torch.empty_like(u0) if n_gated > 1 else None]
        if record:
            maxima = [u0.new_empty((n_focus, n_edges, 2)) for _ in range(min(n_gated, 2))]
    for k in range(n_gated):
        u_next = buffers[k % 2]
        amax_next = maxima[k % 2].zero_() if record else None
        block_gemm(u, w0, w1, k, n_edges, n_focus, layout, gemm_cfg, blocks=(0,), z=z, split=split,
              amax_in=amax)
        gate(z, gw, k, sg, n_edges, n_focus, layout, u=u, u_next=u_next, amax=amax_next)
        block_gemm(u, w0, w1, k, n_edges, n_focus, layout, gemm_cfg, blocks=(1,), z=z, sg=sg, gate=True,
              res=u, out=u_next, split=split, amax_in=amax, amax_out=amax_next)
        u, amax = u_next, amax_next
    if n_gated:
        # The result is allocated only now, once the sigmoids and the ping-pong buffer that
        # is no longer read are released: eagerly, the caching allocator hands it their
        # memory, so the forward's peak holds one surface less (z, y and the live buffer).
        del sg, buffers
        if record:
            del maxima
    out = u0.new_empty((n_edges, n_focus, row))
    block_gemm(u, w0, w1, n_gated, n_edges, n_focus, layout, gemm_cfg, blocks=(0, 1), res=u, out=out,
          y=y if apply_alpha else None, alpha=alpha if apply_alpha else None,
          alpha_on_out=apply_alpha, out_edge_major=True, split=split, amax_in=amax)
    return out, z, y


def stack_backward(grad_out, y, z, alpha, w0, w1, gw, layout: StackLayout, apply_alpha: bool,
                   gemm_cfg=None, fused_cfg=None, compensated: bool = False, writer_amax: bool = True, *,
                   chain=None, g_top=None, grad_z=None, on_gz=None):
    """Level-1/2 backward: ``(grad_u0 (F, E, ROW), grad_alpha (E, F) or empty)``.

    The identity layer (with the alpha fold) and ``grad_alpha`` first; then per
    gated layer either the relay (recompute the gate sigmoids, write ``gz``
    pointwise, ``h += gz @ W^T`` over both blocks) or, with ``fused_cfg``, the
    fused kernel's two passes, which allocate no sigmoid or ``gz`` surface.
    ``W^T`` is materialised once per call; ``grad_out`` is edge-major with
    unit column stride (its F stride may be 0: the gradient of a sum over the
    focus streams is read as it is, not copied); ``y`` is contiguous; ``h`` is
    updated in place.  ``compensated``
    (level 3): the GEMMs run split fp16 products (the fused kernel's GEMM phase too);
    the alpha-gradient kernel records the per-block row maxima of ``grad_out * alpha``
    and the pointwise kernel those of ``gz`` for them (``writer_amax=False``: the
    GEMMs find them, as in ``stack_forward``).

    Training (the relay only; ``stack.training``): ``chain`` ``(n_gated, F, E, ROW)`` receives,
    at ``k``, the cotangent of gated layer ``k``'s output (each GEMM writes the next
    layer's ``h`` there instead of in place: the same kernels, the same bits), which the
    double backward reads; ``g_top`` (focus-major, ``(F, E, ROW)``) replaces
    ``grad_out * alpha`` as the cotangent of ``y`` (the forward's backward when the double
    backward handed back a cotangent of ``y`` too); ``grad_z`` ``(n_gated, F, E, ROW)`` is
    added to each layer's ``gz`` (the double backward's cotangent of the saved ``z``);
    ``on_gz(k, h, gz)`` runs after layer ``k``'s ``gz`` is formed and before ``h`` moves on
    (the weight gradients read both there).  ``grad_out=None`` (training: the result has no
    cotangent, only ``z`` and ``y`` have one): ``grad_alpha`` is zero, and the cotangent of
    ``y`` is ``g_top`` or, without it, zero (no identity-layer GEMM runs).
    """
    n_focus, n_edges, row = z.shape[1:]
    n_gated = w0.shape[0] - 1
    h = z.new_empty((n_focus, n_edges, row))
    grad_alpha = z.new_empty((n_edges, n_focus) if apply_alpha else (0,))
    if _is_empty(n_edges):
        return h, grad_alpha
    training = (chain is not None or g_top is not None or grad_z is not None or on_gz is not None
                or grad_out is None)
    if training and fused_cfg is not None:
        raise ValueError("the fused backward keeps no gz surface: chain, g_top, grad_z and on_gz "
                         "need the relay (fused_cfg=None)")
    record = compensated and writer_amax and fused_cfg is None and grad_z is None
    # the row maxima of each compensated GEMM's operand, in turn g * alpha and every layer's gz
    amax = h.new_empty((n_focus, n_edges, 2)) if record else None
    if apply_alpha and grad_out is None:
        grad_alpha.zero_()
    elif apply_alpha:
        cfg = ALPHA_GRAD_CONFIG
        n_rows = n_edges * n_focus
        top_amax = amax if g_top is None else None
        wrap_triton(alpha_grad_kernel)[((n_rows + cfg["BLOCK_R"] - 1) // cfg["BLOCK_R"],)](
            grad_out, y, grad_alpha, w0 if top_amax is None else alpha, w0 if top_amax is None else top_amax,
            n_rows, n_focus, grad_out.stride(0), grad_out.stride(1),          # w0: unused pointers
            ROW=row, M0=layout.m0, WRITE_AMAX=top_amax is not None,
            BLOCK_R=cfg["BLOCK_R"], BLOCK_C=cfg["BLOCK_C"], num_warps=cfg["num_warps"],
        )
    w0t = w0.transpose(-1, -2).contiguous()
    w1t = w1.transpose(-1, -2).contiguous()
    split = split_weights(w0t, w1t) if compensated else None
    gate_split = split_matrices(gw) if compensated and n_gated and fused_cfg is None else None

    def h_of(k):                 # where the cotangent of gated layer k's output lives
        return h if chain is None or k < 0 else chain[k]

    top_out = h_of(n_gated - 1)
    if g_top is None and grad_out is None:
        top_out.zero_()
    elif g_top is None:
        block_gemm(grad_out, w0t, w1t, n_gated, n_edges, n_focus, layout, gemm_cfg, blocks=(0, 1),
                   res=grad_out, out=top_out, alpha=alpha if apply_alpha else None, a_edge_major=True,
                   alpha_on_a=apply_alpha, split=split, amax_in=amax if apply_alpha else None)
    else:
        block_gemm(g_top, w0t, w1t, n_gated, n_edges, n_focus, layout, gemm_cfg, blocks=(0, 1),
                   res=g_top, out=top_out, split=split)
    if n_gated and fused_cfg is None:
        fold = pointwise_recomputes_gate(layout, compensated)
        sg = None if fold else h.new_empty((n_focus, n_edges, layout.gate_width))
        gz = torch.empty_like(h)
    elif n_gated:
        bm = fused_cfg["BLOCK_M"]
        programs = persistent_programs(h, (n_edges + bm - 1) // bm * n_focus, FUSED_PROGRAMS_PER_SM)
        scratch = h.new_empty((programs, bm, max(layout.m0, layout.m1)))
    for k in range(n_gated - 1, -1, -1):
        if fused_cfg is not None:
            fused_layer(h, z, gw, w0t, w1t, k, n_edges, n_focus, layout, fused_cfg, scratch, split=split)
            continue
        if not training:
            relay_layer(h, z, gw, w0t, w1t, k, n_edges, n_focus, layout, gemm_cfg, sg, gz, split=split,
                        amax=amax, gate_split=gate_split, fold=fold)
            continue
        h_in, h_out = h_of(k), h_of(k - 1)
        relay_gz(h_in, z, gw, k, n_edges, n_focus, layout, sg, gz, amax=amax, gate_split=gate_split, fold=fold)
        if grad_z is not None:
            gz.add_(grad_z[k])
        if on_gz is not None:
            on_gz(k, h_in, gz)
        block_gemm(gz, w0t, w1t, k, n_edges, n_focus, layout, gemm_cfg, blocks=(0, 1), res=h_in, out=h_out,
                   split=split, amax_in=amax)
    return h, grad_alpha


def relay_gz(h, z, gw, layer, n_edges, n_focus, layout, sg, gz, amax=None, gate_split=None, fold=False):
    """The relay's pointwise part of one gated layer: the gate sigmoids (``fold``: formed
    inside the pointwise kernel; else recomputed into ``sg`` by a gate launch), then
    ``gz`` from ``h`` and ``z`` (``amax``: ``gz``'s row maxima, recorded for the
    compensated GEMM; ``gate_split``: ``split_matrices(gw)``, the gate's products
    compensated as in the forward)."""
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


def relay_layer(h, z, gw, w0t, w1t, layer, n_edges, n_focus, layout, gemm_cfg, sg, gz, split=None,
                amax=None, gate_split=None, fold=False):
    """One gated layer of the relay: ``relay_gz``, then ``h += gz @ W^T`` over both blocks
    (``split``: the compensated products)."""
    relay_gz(h, z, gw, layer, n_edges, n_focus, layout, sg, gz, amax=amax, gate_split=gate_split, fold=fold)
    block_gemm(gz, w0t, w1t, layer, n_edges, n_focus, layout, gemm_cfg, blocks=(0, 1), res=h, out=h,
               split=split, amax_in=amax)


def persistent_programs(t, n_tiles: int, per_sm: int) -> int:
    """Programs of a persistent launch over ``n_tiles`` tiles: ``per_sm`` on each SM of ``t``'s
    GPU, a few under the interpreter (so that the tile loop is exercised)."""
    if t.device.type == "cuda":
        sms = torch.cuda.get_device_properties(t.device).multi_processor_count
        return max(1, min(n_tiles, sms * per_sm))
    return max(1, min(n_tiles, INTERPRETER_PROGRAMS))


def fused_layer(h, z, gw, w0t, w1t, layer, n_edges, n_focus, layout, cfg, scratch, split=None):
    """One gated layer of the fused backward: the m = 0 pass, then the |m| = 1 pass
    (the m = 0 pass reads the |m| = 1 columns of ``h`` before they change).
    ``split`` (level 3): ``split_weights(w0t, w1t)``, the GEMM phase runs the
    compensated products."""
    bm = cfg["BLOCK_M"]
    n_tiles = (n_edges + bm - 1) // bm * n_focus
    programs = scratch.shape[0]
    w0t, w0lo, w1t, w1lo, wup = _weight_args(w0t, w1t, split)
    for segment in (0, 1):
        wrap_triton(fused_backward_kernel)[(programs,)](
            h, z, gw, w0t, w1t, scratch, w0lo, w1lo, wup, layer, n_edges, n_focus, n_tiles,
            LMAX=layout.lmax, CF=layout.focus_dim, SEGMENT=segment, COMPENSATED=split is not None,
            BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k(layout), GC=gate_chunk(layout),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
