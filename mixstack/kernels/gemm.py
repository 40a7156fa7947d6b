"""The block-diagonal GEMM of the stack, with the epilogues each use needs.

One row of ``u`` times ``blockdiag(W0, W1)``: block 0 maps the m = 0 columns
through ``W0``, block 1 the |m| = 1 columns through ``W1``.  A launch covers
block 0, block 1, or both (the N-tile index runs over both blocks' tiles and
picks the block), for one layer of the stacked weights (passed whole, with the
layer as an integer: a per-layer view would break Inductor's re-trace).

Uses, by constexpr flags:
  forward m0 of a gated layer  STORE_Z
  forward m1 of a gated layer  STORE_Z, GATE, RESIDUAL       -> u_next
  forward identity layer       RESIDUAL, ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_Y (the
                               unscaled result ``y`` the alpha gradient reads)
  backward identity layer      A_EDGE_MAJOR, ALPHA_ON_A, RESIDUAL (``a_se``, ``a_sf``: the
                               strides of the edge-major gradient along E and F; F's may
                               be 0, the gradient of a sum over the focus streams)
  backward gated layer         RESIDUAL (from ``res_ptr``, in place)

The backward passes the transposed weights, materialised once per call: an
in-kernel transposed load of W ran the backward's GEMMs about 3x slower than the
forward's (BENCHMARKS.md, "Level 1, step by step").

The K loop accumulates ``acc = tl.dot(a, w, acc)`` in exact IEEE fp32
(never TF32) in a fixed K order, the degree order of ``degree_order``; launch
configs change the schedule only.  ``COMPENSATED`` (level 3) runs the
split fp16 tensor-core products of ``compensated.compensated_dot`` instead,
with ``w0_ptr``/``w1_ptr`` the fp16 heads of the split weights, ``w0lo_ptr``/
``w1lo_ptr`` their tails and ``wup_ptr`` their power-of-two scales;
``AMAX_IN`` reads the A rows' per-block maxima from ``amax_in_ptr`` ``(F, E, 2)``
instead of finding them, and ``AMAX_OUT`` (an output that the next
compensated GEMM reads) folds the stored rows' maxima into ``amax_out_ptr``
with an atomic max (it must start at zero; several N tiles share a row).
Row offsets are int64: ``F * E * ROW`` may exceed 2**31.
"""

import triton
import triton.language as tl

from .compensated import compensated_dot, row_amax, scale_rows
from .degree_order import degree_order_k
from .rows import m0_width, row_width


@triton.jit
def degree_order_dot(a_ptr, a_rows, col0, e_mask, w_ptr, kdim, n, n_mask, second, alpha,
                     LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALPHA_ON_A: tl.constexpr):
    """``A[rows, col0 : col0 + kdim] @ W[:, n]`` for one block, K in degree order.

    The one exact K loop of the stack: the relay's GEMMs and the fused
    backward's GEMM phase both run it, so they sum in the same order (level
    3's ``compensated_dot`` walks the same ``degree_order``).  ``second``: the
    |m| = 1 block.  ``w_ptr``: the block's (kdim x kdim) weight, row-major.
    """
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(0, kdim // BLOCK_K):
        k = degree_order_k(t, second, LMAX, CF, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] + (col0 + k + rk)[None, :], mask=e_mask[:, None], other=0.0)
        a = scale_rows(a, alpha, ALPHA_ON_A)
        w = tl.load(w_ptr + (k + rk)[:, None] * kdim + n[None, :], mask=n_mask[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision="ieee")
    return acc


@triton.jit
def gemm_rows(e, f, E, F, a_se, a_sf, alpha_ptr, ROW: tl.constexpr, A_EDGE_MAJOR: tl.constexpr,
              LOAD_ALPHA: tl.constexpr):
    """Edges ``e`` of focus ``f``: ``(e < E, the A rows' offsets, alpha)``; A focus-major
    ``(F, E, ROW)`` or, ``A_EDGE_MAJOR``, read through its strides ``a_se``, ``a_sf``; ``alpha``
    loaded where ``LOAD_ALPHA`` (else a placeholder)."""
    e_mask = e < E
    if A_EDGE_MAJOR:
        a_rows = e * a_se + f * a_sf
    else:
        a_rows = (f * E + e) * ROW
    if LOAD_ALPHA:
        alpha = tl.load(alpha_ptr + e * F + f, mask=e_mask, other=0.0)
    else:
        alpha = e_mask     # unused
    return e_mask, a_rows, alpha


@triton.jit
def gemm_epilogue(acc, e, e_mask, f, n, n_mask, col, a_rows, alpha, layer, E, F, res_ptr, out_ptr, z_ptr, y_ptr,
                  sg_ptr, LMAX: tl.constexpr, CF: tl.constexpr, ALPHA_ON_A: tl.constexpr, STORE_Z: tl.constexpr,
                  GATE: tl.constexpr, RESIDUAL: tl.constexpr, ALPHA_ON_OUT: tl.constexpr,
                  OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr, STORE_Y: tl.constexpr):
    """The block GEMM's epilogue over one ``(edges e, columns col)`` tile of the product ``acc``
    (``n``: the tile's columns within its block): store ``z``, gate, residual, store ``y``,
    alpha, store the result, by the flags of the module doc.  ``(val, mask)``: the stored
    result and the tile's mask, for the row maxima of its next reader."""
    ROW: tl.constexpr = row_width(LMAX, CF)
    G: tl.constexpr = LMAX * CF
    mask = e_mask[:, None] & n_mask[None, :]
    if STORE_Z:
        z_rows = ((layer * F + f) * E + e) * ROW     # int64 before the multiply by E
        tl.store(z_ptr + z_rows[:, None] + col[None, :], acc, mask=mask)
    val = acc
    if GATE:
        gcol = ((n // CF) % LMAX) * CF + n % CF
        sg = tl.load(sg_ptr + ((f * E + e) * G)[:, None] + gcol[None, :], mask=mask, other=0.0)
        val = val * sg
    if RESIDUAL:
        res = tl.load(res_ptr + a_rows[:, None] + col[None, :], mask=mask, other=0.0)
        val = scale_rows(res, alpha, ALPHA_ON_A) + val
    if OUT_EDGE_MAJOR:
        out_rows = (e * F + f) * ROW
    else:
        out_rows = (f * E + e) * ROW
    if STORE_Y:
        tl.store(y_ptr + out_rows[:, None] + col[None, :], val, mask=mask)
    if ALPHA_ON_OUT:
        val = val * alpha[:, None]
    if STORE_OUT:
        tl.store(out_ptr + out_rows[:, None] + col[None, :], val, mask=mask)
    return val, mask


@triton.jit(do_not_specialize=["layer"])
def block_gemm_kernel(
    a_ptr, w0_ptr, w1_ptr, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr,
    w0lo_ptr, w1lo_ptr, wup_ptr, amax_in_ptr, amax_out_ptr,
    layer, E, F, a_se, a_sf,
    LMAX: tl.constexpr, CF: tl.constexpr,
    FIRST_BLOCK: tl.constexpr, BOTH_BLOCKS: tl.constexpr,
    A_EDGE_MAJOR: tl.constexpr, ALPHA_ON_A: tl.constexpr,
    STORE_Z: tl.constexpr, GATE: tl.constexpr, RESIDUAL: tl.constexpr,
    ALPHA_ON_OUT: tl.constexpr, OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr,
    STORE_Y: tl.constexpr, COMPENSATED: tl.constexpr, AMAX_IN: tl.constexpr, AMAX_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    M1: tl.constexpr = ROW - M0
    NT0: tl.constexpr = (M0 + BLOCK_N - 1) // BLOCK_N
    NT1: tl.constexpr = (M1 + BLOCK_N - 1) // BLOCK_N
    if BOTH_BLOCKS:
        NT: tl.constexpr = NT0 + NT1
    elif FIRST_BLOCK == 0:
        NT: tl.constexpr = NT0
    else:
        NT: tl.constexpr = NT1

    pid = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    pid_m = pid // NT
    pid_n = pid % NT

    if BOTH_BLOCKS:
        second = pid_n >= NT0
        tile_n = tl.where(second, pid_n - NT0, pid_n)
    else:
        second = (pid_n * 0 + FIRST_BLOCK) == 1
        tile_n = pid_n
    if second:
        col0 = M0
        kdim = M1
        w_ptr = w1_ptr + (layer * F + f) * (M1 * M1)
        wlo_ptr = w1lo_ptr + (layer * F + f) * (M1 * M1)
    else:
        col0 = 0
        kdim = M0
        w_ptr = w0_ptr + (layer * F + f) * (M0 * M0)
        wlo_ptr = w0lo_ptr + (layer * F + f) * (M0 * M0)

    e = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    e_mask, a_rows, alpha = gemm_rows(e, f, E, F, a_se, a_sf, alpha_ptr, ROW, A_EDGE_MAJOR, ALPHA_ON_A or ALPHA_ON_OUT)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < kdim
    if COMPENSATED:
        w_up = tl.load(wup_ptr + (layer * F + f) * 2 + second.to(tl.int64))
        if AMAX_IN:
            amax = tl.load(amax_in_ptr + (f * E + e) * 2 + second.to(tl.int64), mask=e_mask, other=0.0)
        else:
            amax = alpha     # unused: the kernel's pre-pass finds it
        acc = compensated_dot(a_ptr, a_rows, col0, e_mask, w_ptr, wlo_ptr, w_up, kdim, n, n_mask, second,
                              alpha, amax, LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, ALPHA_ON_A, AMAX_IN)
    else:
        acc = degree_order_dot(a_ptr, a_rows, col0, e_mask, w_ptr, kdim, n, n_mask, second, alpha,
                               LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, ALPHA_ON_A)

    val, mask = gemm_epilogue(acc, e, e_mask, f, n, n_mask, col0 + n, a_rows, alpha, layer, E, F, res_ptr, out_ptr,
                              z_ptr, y_ptr, sg_ptr, LMAX, CF, ALPHA_ON_A, STORE_Z, GATE, RESIDUAL, ALPHA_ON_OUT,
                              OUT_EDGE_MAJOR, STORE_OUT, STORE_Y)
    if AMAX_OUT:     # the result is the next compensated GEMM's operand: record its rows' maxima
        tl.atomic_max(amax_out_ptr + (f * E + e) * 2 + second.to(tl.int64), row_amax(val, mask), mask=e_mask)
