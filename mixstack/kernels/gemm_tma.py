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

from .compensated import pow2_scales, row_amax, split_fp16, split_products, split_result
from .degree_order import degree_order_k


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
            a = a_desc.load([row0, col0 + degree_order_k(t, second, LMAX, CF, BLOCK_K)])
            if ALPHA_ON_A:
                a = a * alpha[:, None]
            amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
    down, up = pow2_scales(amax)
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(0, n_k, warp_specialize=SPECIALISE):
        k = degree_order_k(t, second, LMAX, CF, BLOCK_K)
        a = a_desc.load([row0, col0 + k])
        if ALPHA_ON_A:
            a = a * alpha[:, None]
        a_hi, a_lo = split_fp16(a * down[:, None])
        w_hi = whi_desc.load([k, n0])
        w_lo = wlo_desc.load([k, n0])
        head, tail = split_products(a_hi, a_lo, w_hi, w_lo, head, tail)
    return split_result(head, tail, up * w_up)


@triton.jit(do_not_specialize=["layer"])
def tma_block_gemm_kernel(
    a_ptr, w0_ptr, w1_ptr, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr,
    w0lo_ptr, w1lo_ptr, wup_ptr, amax_in_ptr, amax_out_ptr,
    layer, E, F, a_se, a_sf,
    LMAX: tl.constexpr, CF: tl.constexpr,
    FIRST_BLOCK: tl.constexpr, BOTH_BLOCKS: tl.constexpr,
    A_EDGE_MAJOR: tl.constexpr, ALPHA_ON_A: tl.constexpr,
    STORE_Z: tl.constexpr, GATE: tl.constexpr, RESIDUAL: tl.constexpr,
    ALPHA_ON_OUT: tl.constexpr, OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr,
    STORE_Y: tl.constexpr, COMPENSATED: tl.constexpr, AMAX_IN: tl.constexpr, AMAX_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """``gemm.block_gemm_kernel``'s arguments and uses, level 3 only (``COMPENSATED`` must be
    set; the weight pointers are the split heads and tails) and one block per launch
    (``BOTH_BLOCKS`` unset): Triton 3.6's Hopper pass specialises the K loop's warps only
    where the block, and with it the loop's trip count, is a compile-time constant.
    ``PERSISTENT``: each program strides over the ``(E tile, N tile)`` pairs of its focus stream,
    and the tile loop, not the K loop, is specialised, so that one tile's epilogue can overlap
    the next tile's loads and products."""
    tl.static_assert(COMPENSATED, "the TMA block GEMM runs the compensated products only")
    tl.static_assert(not BOTH_BLOCKS, "the TMA block GEMM runs one block per launch")
    M0: tl.constexpr = (LMAX + 1) * CF
    M1: tl.constexpr = 2 * LMAX * CF
    ROW: tl.constexpr = M0 + M1
    SECOND: tl.constexpr = FIRST_BLOCK == 1
    NT: tl.constexpr = ((M1 if SECOND else M0) + BLOCK_N - 1) // BLOCK_N
    KDIM: tl.constexpr = M1 if SECOND else M0

    f = tl.program_id(1).to(tl.int64)
    w_offset = (layer * F + f) * (KDIM * KDIM)
    if SECOND:
        whi_ptr = w1_ptr + w_offset
        wlo_ptr = w1lo_ptr + w_offset
    else:
        whi_ptr = w0_ptr + w_offset
        wlo_ptr = w0lo_ptr + w_offset
    whi_desc = tl.make_tensor_descriptor(whi_ptr, shape=[KDIM, KDIM], strides=[KDIM, 1],
                                         block_shape=[BLOCK_K, BLOCK_N])
    wlo_desc = tl.make_tensor_descriptor(wlo_ptr, shape=[KDIM, KDIM], strides=[KDIM, 1],
                                         block_shape=[BLOCK_K, BLOCK_N])
    if A_EDGE_MAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr + f * a_sf, shape=[E, ROW], strides=[a_se, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr + f * E * ROW, shape=[E, ROW], strides=[ROW, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])

    if PERSISTENT:
        n_tiles = tl.cdiv(E, BLOCK_M) * NT
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), warp_specialize=True):
            _tma_tile(tile, f, a_desc, whi_desc, wlo_desc, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr, wup_ptr,
                      amax_in_ptr, amax_out_ptr, layer, E, F, a_se, a_sf, LMAX, CF, FIRST_BLOCK, A_EDGE_MAJOR,
                      ALPHA_ON_A, STORE_Z, GATE, RESIDUAL, ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_OUT, STORE_Y, AMAX_IN,
                      AMAX_OUT, BLOCK_M, BLOCK_N, BLOCK_K, False)
    else:
        _tma_tile(tl.program_id(0), f, a_desc, whi_desc, wlo_desc, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr,
                  wup_ptr, amax_in_ptr, amax_out_ptr, layer, E, F, a_se, a_sf, LMAX, CF, FIRST_BLOCK, A_EDGE_MAJOR,
                  ALPHA_ON_A, STORE_Z, GATE, RESIDUAL, ALPHA_ON_OUT, OUT_EDGE_MAJOR, STORE_OUT, STORE_Y, AMAX_IN,
                  AMAX_OUT, BLOCK_M, BLOCK_N, BLOCK_K, True)


@triton.jit
def _tma_tile(tile, f, a_desc, whi_desc, wlo_desc, res_ptr, out_ptr, z_ptr, y_ptr, sg_ptr, alpha_ptr, wup_ptr,
              amax_in_ptr, amax_out_ptr, layer, E, F, a_se, a_sf,
              LMAX: tl.constexpr, CF: tl.constexpr, FIRST_BLOCK: tl.constexpr, A_EDGE_MAJOR: tl.constexpr,
              ALPHA_ON_A: tl.constexpr, STORE_Z: tl.constexpr, GATE: tl.constexpr, RESIDUAL: tl.constexpr,
              ALPHA_ON_OUT: tl.constexpr, OUT_EDGE_MAJOR: tl.constexpr, STORE_OUT: tl.constexpr,
              STORE_Y: tl.constexpr, AMAX_IN: tl.constexpr, AMAX_OUT: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPECIALISE_K: tl.constexpr):
    """One ``(E tile, N tile)`` of ``tma_block_gemm_kernel``: the products and the epilogue."""
    M0: tl.constexpr = (LMAX + 1) * CF
    M1: tl.constexpr = 2 * LMAX * CF
    ROW: tl.constexpr = M0 + M1
    G: tl.constexpr = LMAX * CF
    SECOND: tl.constexpr = FIRST_BLOCK == 1
    NT: tl.constexpr = ((M1 if SECOND else M0) + BLOCK_N - 1) // BLOCK_N
    COL0: tl.constexpr = M0 if SECOND else 0
    KDIM: tl.constexpr = M1 if SECOND else M0
    pid_m = tile // NT
    pid_n = tile % NT
    row0 = pid_m * BLOCK_M
    e = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
    e_mask = e < E
    if A_EDGE_MAJOR:
        a_rows = e * a_se + f * a_sf
    else:
        a_rows = (f * E + e) * ROW
    if ALPHA_ON_A or ALPHA_ON_OUT:
        alpha = tl.load(alpha_ptr + e * F + f, mask=e_mask, other=0.0)
    else:
        alpha = e_mask     # unused
    n0 = pid_n * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < KDIM
    w_up = tl.load(wup_ptr + (layer * F + f) * 2 + FIRST_BLOCK)
    if AMAX_IN:
        amax = tl.load(amax_in_ptr + (f * E + e) * 2 + FIRST_BLOCK, mask=e_mask, other=0.0)
    else:
        amax = alpha     # unused: the kernel's pre-pass finds it
    acc = tma_compensated_dot(a_desc, row0, COL0, whi_desc, wlo_desc, w_up, n0, KDIM, SECOND, alpha, amax,
                              LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, ALPHA_ON_A, AMAX_IN, SPECIALISE_K)

    col = COL0 + n
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
        if ALPHA_ON_A:
            res = res * alpha[:, None]
        val = res + val
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
    if AMAX_OUT:     # the result is the next compensated GEMM's operand: its rows' maxima, per N tile
        tl.store(amax_out_ptr + (f * E + e) * NT + pid_n, row_amax(val, mask), mask=e_mask)


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
