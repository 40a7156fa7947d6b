"""Level 3's block GEMM on Hopper's copy engine: TMA-fed, warp-specialised compensated products.

The same math as ``gemm.block_gemm_kernel`` with ``COMPENSATED`` (``compensated``: the fp16
head and tail split of every fp32 operand, three tensor-core products into two fp32
accumulators, K in ``degree_order``), the same arguments, flags and epilogues, and the same
row maxima (with ``AMAX_OUT``, ``amax_out_ptr`` takes each N tile's row maxima, ``(F, E, NT)``,
folded into the ``(F, E, 2)`` maxima by ``fold_tile_amax_kernel``).  What differs is how the
operand tiles arrive.  Each program builds device-side tensor descriptors
(``tl.make_tensor_descriptor``) for its A rows and for its weight block's head and tail, and a
loop of it is tagged ``warp_specialize``.  On sm_90 Triton's Hopper pass then splits the
program into a producer partition that issues TMA loads into a ring of ``num_stages``
shared-memory buffers and consumer partitions that split A and issue the warpgroup MMAs, so the
next tiles' loads overlap this tile's split and products.  The pointer kernel leaves that
overlap to the software pipeliner, whose loads share the consumers' registers.  Tiled, one
program computes one output tile and its K loop is the specialised one; ``PERSISTENT``, a
program per SM strides over its focus stream's tiles and the tile loop is specialised, so one
tile's epilogue can overlap the next tile's products.

Descriptors zero-fill what lies outside their shape, which is what the pointer kernel's
masks load: rows past ``E`` of this focus stream, and weight columns past the block.  So the
products, and with them the results, are those of the pointer kernel for the same tile and
K order (the interpreter tests hold the two bit for bit).

What the pass makes of it at BLOCK_M 64 (its TTGIR): one producer and two consumer partitions
of four warps, both consumers holding the whole tile, so their products and epilogue run
twice; at BLOCK_M 128, where it would give each consumer 64 rows, it does not build with a row
scale loaded or computed in the kernel (``repro/triton_hopper_ws_partition.py``).  Whether the
overlap pays for that is the tuner's measurement (BENCHMARKS.md, "Level 3 on TMA loads and
specialised warps").

What the pass needs (Triton 3.6 and 3.7, checked offline for sm_90): four warps, a loop
without an ``else`` block, descriptors made in the kernel, no atomic anywhere in it, a block
fixed at compile time, and an allocator for the descriptors' global scratch
(``triton.set_allocator``; ``stack.launchers`` sets one where none is).  A Triton or GPU where
the kernel does not build refuses the candidate; the pointer kernel runs (docs/contract.md §4).
"""

import triton
import triton.language as tl

from .compensated import compensated_step, pow2_scales, row_amax, scale_rows, split_result
from .degree_order import degree_order_k
from .gemm import gemm_epilogue, gemm_rows
from .rows import m0_width, row_width


@triton.jit
def tma_compensated_dot(a_desc, row0, col0, whi_desc, wlo_desc, w_up, n0, kdim, second, alpha, amax,
                        LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALPHA_ON_A: tl.constexpr,
                        AMAX_GIVEN: tl.constexpr, SPECIALISE: tl.constexpr):
    """``A[row0 :, col0 : col0 + kdim] @ W[:, n0 :]`` for one block from TMA tiles:
    ``compensated.compensated_dot``'s products, with ``a_desc`` over this focus stream's
    ``(E, ROW)`` rows and ``whi_desc`` / ``wlo_desc`` over the block's fp16 head and tail;
    ``SPECIALISE``: this K loop is the one whose warps are specialised."""
    n_k = kdim // BLOCK_K
    if not AMAX_GIVEN:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for t in tl.range(0, n_k):
            a = scale_rows(a_desc.load([row0, col0 + degree_order_k(t, second, LMAX, CF, BLOCK_K)]), alpha,
                           ALPHA_ON_A)
            amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
    down, up = pow2_scales(amax)
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(0, n_k, warp_specialize=SPECIALISE):
        k = degree_order_k(t, second, LMAX, CF, BLOCK_K)
        a = scale_rows(a_desc.load([row0, col0 + k]), alpha, ALPHA_ON_A)
        head, tail = compensated_step(a, down, whi_desc.load([k, n0]), wlo_desc.load([k, n0]), head, tail)
    return split_result(head, tail, up * w_up)


@triton.jit(do_not_specialize=["layer"])
def tma_block_gemm_kernel(
    a_ptr, whi_ptr, wlo_ptr, wup_ptr, amax_in_ptr, tile_amax_ptr, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr,
    layer, E, F, a_se, a_sf,
    LMAX: tl.constexpr, CF: tl.constexpr, FIRST_BLOCK: tl.constexpr, A_EDGE_MAJOR: tl.constexpr,
    AMAX_IN: tl.constexpr, ALPHA_ON_A: tl.constexpr, STORE_Z: tl.constexpr, GATE: tl.constexpr,
    RESIDUAL: tl.constexpr, ALPHA_ON_OUT: tl.constexpr, OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr,
    STORE_Y: tl.constexpr, AMAX_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PERSISTENT: tl.constexpr,
    SPECIALISE: tl.constexpr,
):
    """Level 3's block GEMM of block ``FIRST_BLOCK`` alone: ``whi_ptr`` / ``wlo_ptr`` that block's
    split weights ``(n, F, K, K)`` (fp16 heads and tails), ``wup_ptr`` the scales ``(n, F, 2)``;
    the other arguments and flags are ``gemm.block_gemm_kernel``'s, except that the row maxima
    of the result (``AMAX_OUT``) go per N tile into ``tile_amax_ptr`` ``(F, E, NT)``.  One block
    a launch, so the K loop's trip count is a constant.  ``PERSISTENT``: each program strides
    over the ``(E tile, N tile)`` pairs of its focus stream; ``SPECIALISE``: the loop over K
    (tiled) or over tiles (persistent) is warp-specialised by Triton's Hopper pass."""
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    KDIM: tl.constexpr = ROW - M0 if FIRST_BLOCK == 1 else M0
    NT: tl.constexpr = (KDIM + BLOCK_N - 1) // BLOCK_N

    f = tl.program_id(1).to(tl.int64)
    w_offset = (layer * F + f) * (KDIM * KDIM)
    whi_desc = tl.make_tensor_descriptor(whi_ptr + w_offset, shape=[KDIM, KDIM], strides=[KDIM, 1],
                                         block_shape=[BLOCK_K, BLOCK_N])
    wlo_desc = tl.make_tensor_descriptor(wlo_ptr + w_offset, shape=[KDIM, KDIM], strides=[KDIM, 1],
                                         block_shape=[BLOCK_K, BLOCK_N])
    if A_EDGE_MAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr + f * a_sf, shape=[E, ROW], strides=[a_se, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr + f * E * ROW, shape=[E, ROW], strides=[ROW, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    w_up = tl.load(wup_ptr + (layer * F + f) * 2 + FIRST_BLOCK)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tl.cdiv(E, BLOCK_M) * NT, tl.num_programs(0),
                             warp_specialize=SPECIALISE):
            _tma_tile(tile, f, a_desc, whi_desc, wlo_desc, w_up, amax_in_ptr, tile_amax_ptr, res_ptr, out_ptr, z_ptr,
                      y_ptr, sg_ptr, alpha_ptr, layer, E, F, a_se, a_sf, LMAX, CF, FIRST_BLOCK, A_EDGE_MAJOR, AMAX_IN,
                      ALPHA_ON_A, STORE_Z, GATE, RESIDUAL, ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_OUT, STORE_Y, AMAX_OUT,
                      BLOCK_M, BLOCK_N, BLOCK_K, False)
    else:
        _tma_tile(tl.program_id(0), f, a_desc, whi_desc, wlo_desc, w_up, amax_in_ptr, tile_amax_ptr, res_ptr,
                  out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr, layer, E, F, a_se, a_sf, LMAX, CF, FIRST_BLOCK,
                  A_EDGE_MAJOR, AMAX_IN, ALPHA_ON_A, STORE_Z, GATE, RESIDUAL, ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_OUT,
                  STORE_Y, AMAX_OUT, BLOCK_M, BLOCK_N, BLOCK_K, SPECIALISE)


@triton.jit
def _tma_tile(tile, f, a_desc, whi_desc, wlo_desc, w_up, amax_in_ptr, tile_amax_ptr, res_ptr, out_ptr, z_ptr, y_ptr,
              sg_ptr, alpha_ptr, layer, E, F, a_se, a_sf, LMAX: tl.constexpr, CF: tl.constexpr,
              FIRST_BLOCK: tl.constexpr, A_EDGE_MAJOR: tl.constexpr, AMAX_IN: tl.constexpr, ALPHA_ON_A: tl.constexpr,
              STORE_Z: tl.constexpr, GATE: tl.constexpr, RESIDUAL: tl.constexpr, ALPHA_ON_OUT: tl.constexpr,
              OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr, STORE_Y: tl.constexpr, AMAX_OUT: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPECIALISE_K: tl.constexpr):
    """One ``(E tile, N tile)`` of ``tma_block_gemm_kernel``: the products and the epilogue."""
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    COL0: tl.constexpr = M0 if FIRST_BLOCK == 1 else 0
    KDIM: tl.constexpr = ROW - M0 if FIRST_BLOCK == 1 else M0
    NT: tl.constexpr = (KDIM + BLOCK_N - 1) // BLOCK_N
    pid_m = tile // NT
    pid_n = tile % NT
    row0 = pid_m * BLOCK_M
    e = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
    e_mask, a_rows, alpha = gemm_rows(e, f, E, F, a_se, a_sf, alpha_ptr, ROW, A_EDGE_MAJOR, ALPHA_ON_A or ALPHA_ON_OUT)
    n0 = pid_n * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    if AMAX_IN:
        amax = tl.load(amax_in_ptr + (f * E + e) * 2 + FIRST_BLOCK, mask=e_mask, other=0.0)
    else:
        amax = alpha     # unused: the kernel's pre-pass finds it
    acc = tma_compensated_dot(a_desc, row0, COL0, whi_desc, wlo_desc, w_up, n0, KDIM, FIRST_BLOCK == 1, alpha,
                              amax, LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, ALPHA_ON_A, AMAX_IN, SPECIALISE_K)
    val, mask = gemm_epilogue(acc, e, e_mask, f, n, n < KDIM, COL0 + n, a_rows, alpha, layer, E, F, res_ptr,
                              out_ptr, z_ptr, y_ptr, sg_ptr, LMAX, CF, ALPHA_ON_A, STORE_Z, GATE, RESIDUAL,
                              ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_OUT, STORE_Y)
    if AMAX_OUT:     # the result is the next compensated GEMM's operand: its rows' maxima, per N tile
        tl.store(tile_amax_ptr + (f * E + e) * NT + pid_n, row_amax(val, mask), mask=e_mask)


@triton.jit
def fold_tile_amax_kernel(tiles_ptr, amax_ptr, rows, NT: tl.constexpr, SLOT: tl.constexpr, BLOCK: tl.constexpr):
    """Fold one launch's per-N-tile row maxima ``tiles (rows, NT)`` into the rows' maxima of its
    block, ``amax[:, SLOT]`` of ``(rows, 2)`` (max with what is there): the value the pointer
    kernel's atomic max leaves.  Triton 3.6's Hopper warp specialisation fails to build a kernel
    with any atomic in it, so the GEMM stores and this launch folds."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = r < rows
    m = tl.load(amax_ptr + r * 2 + SLOT, mask=live, other=0.0)
    for t in tl.static_range(NT):
        m = tl.maximum(m, tl.load(tiles_ptr + r * NT + t, mask=live, other=0.0))
    tl.store(amax_ptr + r * 2 + SLOT, m, mask=live)
