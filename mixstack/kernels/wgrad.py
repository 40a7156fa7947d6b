"""Weight gradients: reductions over the edges in fixed-size chunks, summed in a fixed order.

Every weight gradient of the stack is a sum over the edges of outer products of two rows
(docs/contract.md §1): a block weight's ``dW = A^T B`` with ``A`` the layer's input rows
(``u_k``, or the double backward's tangent ``u_dot``) and ``B`` the cotangent of its
pre-activations (``gz``); the gate projection's ``dgw = s^T gl`` (plus the double backward's
curvature terms).  With ``E`` in the hundreds of thousands and outputs of a few hundred
squared, one program per output tile would leave the GPU idle, and atomics would make the
bits depend on the order programs finish.  So each reduction runs in two launches:

1. ``wgrad_kernel`` / ``gate_wgrad_kernel``: one program per (edge chunk, output tile,
   focus) sums its chunk of ``CHUNK`` edges (a constant of the launchers, never tuned: it
   fixes the order of the sum) into a partial-sum buffer ``(n_chunks, F, size)``;
2. ``chunk_sum_kernel`` adds the partials of the chunks in chunk order.

Launch configs change the schedule only: inside a chunk the K loop runs ``BLOCK_K`` edges at a
time in edge order, whatever the output tile, so level 2 gives level 1's bits and any two
runs give the same bits.

``COMPENSATED`` (level 3): the block reductions run split fp16 tensor-core products
(``compensated``): per K step each column of both operand tiles is brought into [1, 2) by an
exact power of two (the reduction runs over the edges, so a row scale, as in the stack's
GEMMs, cannot be taken out of the sum; a column scale per K step can), split into head and
tail, and the step's three products, into fresh head and tail accumulators, are scaled back
exactly and added.  Within the float64 contract like every level-3 product.

``gate_wgrad_kernel`` forms ``gl`` itself, in registers, from the saved ``z``, the cotangent
``h`` of the layer output and the gate sigmoids, with the shared helpers of ``activations``
and ``gate.gate_sigmoids`` that the relay's pointwise kernel calls (same operator sequence,
same bits); with ``CURVATURE`` (the double backward) it adds ``s^T gl_curv`` and
``s_dot^T gl`` (``curvature``).

``layer_input_kernel`` rebuilds a layer input ``u_{k+1} = u_k + a(z_k)`` from the saved
``z`` (the forward does not keep the layer inputs) for the block-weight gradients.

Row offsets are int64.
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, silu
from .compensated import pow2_scales, split_fp16, split_products, split_result
from .curvature import gate_logit_curvature, tangent_logits
from .gate import gate_sigmoids
from .rows import degree_cols, edge_tile, load_degree_cols, m0_width, row_width


@triton.jit
def split_columns(x):
    """Level-3 operand tile whose K runs along its rows: each column scaled into [1, 2) by its
    largest magnitude (an exact power of two), then split: ``(hi, lo, up)``."""
    down, up = pow2_scales(tl.max(tl.abs(x), axis=0))
    hi, lo = split_fp16(x * down[None, :])
    return hi, lo, up


@triton.jit(do_not_specialize=["a_layer"])
def wgrad_kernel(
    part_ptr, a_ptr, b_ptr,
    a_layer, E, F, b_se, b_sf,
    LMAX: tl.constexpr, CF: tl.constexpr, CHUNK: tl.constexpr,
    B_EDGE_MAJOR: tl.constexpr, COMPENSATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Partial sums over one edge chunk of both blocks' ``A^T B``: block 0 (``m0 x m0``) at
    offset 0 of a chunk's row of ``part``, block 1 (``m1 x m1``) after it.

    ``A`` is focus-major ``(n, F, E, ROW)``, read at ``a_layer``; ``B`` focus-major
    ``(F, E, ROW)`` or, with ``B_EDGE_MAJOR``, read through its E and F strides (the incoming
    gradient, whose F stride may be 0).  (Scaling ``B`` by alpha in here, per K step, took 255
    registers and spilled 360 bytes for sm_90 with 3 stages, 95 registers unpipelined; the
    launchers scale it outside.)"""
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    M1: tl.constexpr = ROW - M0
    SIZE: tl.constexpr = M0 * M0 + M1 * M1
    TN0: tl.constexpr = (M0 + BLOCK_N - 1) // BLOCK_N
    TN1: tl.constexpr = (M1 + BLOCK_N - 1) // BLOCK_N
    NT0: tl.constexpr = (M0 + BLOCK_M - 1) // BLOCK_M * TN0
    NT: tl.constexpr = NT0 + (M1 + BLOCK_M - 1) // BLOCK_M * TN1

    pid = tl.program_id(0)
    f = tl.program_id(1).to(tl.int64)
    chunk = pid // NT
    t = pid % NT
    second = t >= NT0
    t = tl.where(second, t - NT0, t)
    tn = tl.where(second, TN1, TN0)
    kdim = tl.where(second, M1, M0)
    col0 = tl.where(second, M0, 0)
    m = (t // tn) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = (t % tn) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < kdim
    n_mask = n < kdim

    e_start = chunk.to(tl.int64) * CHUNK
    n_rows = tl.minimum(E - e_start, CHUNK)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, n_rows, BLOCK_K):
        e = e_start + k0 + rk
        e_mask = e < E
        a_rows = ((a_layer * F + f) * E + e) * ROW
        a = tl.load(a_ptr + a_rows[:, None] + (col0 + m)[None, :], mask=e_mask[:, None] & m_mask[None, :],
                    other=0.0)
        if B_EDGE_MAJOR:
            b_rows = e * b_se + f * b_sf
        else:
            b_rows = (f * E + e) * ROW
        b = tl.load(b_ptr + b_rows[:, None] + (col0 + n)[None, :], mask=e_mask[:, None] & n_mask[None, :],
                    other=0.0)
        if COMPENSATED:
            a_hi, a_lo, a_up = split_columns(a)
            b_hi, b_lo, b_up = split_columns(b)
            zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            head_k, tail_k = split_products(tl.trans(a_hi), tl.trans(a_lo), b_hi, b_lo, zero, zero)
            scale = a_up[:, None] * b_up[None, :]
            acc += head_k * scale
            tail += tail_k * scale
        else:
            acc = tl.dot(tl.trans(a), b, acc, input_precision="ieee")
    if COMPENSATED:
        acc = split_result(acc, tail, tl.full((BLOCK_M,), 1.0, tl.float32))
    offs = (chunk.to(tl.int64) * F + f) * SIZE + tl.where(second, M0 * M0, 0) + m[:, None] * kdim + n[None, :]
    tl.store(part_ptr + offs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["layer", "h_layer"])
def gate_wgrad_kernel(
    part_ptr, h_ptr, z_ptr, zd_ptr, gw_ptr,
    layer, h_layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr, GC: tl.constexpr, CHUNK: tl.constexpr,
    CURVATURE: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Partial sums over one edge chunk of the gate projection's gradient, ``(Cf, G)`` per
    focus: ``s^T gl`` from the cotangent ``h`` of the layer output (``(n, F, E, ROW)`` read at
    ``h_layer``) and the saved ``z`` (at ``layer``); with ``CURVATURE`` plus
    ``s^T gl_curv + s_dot^T gl``, ``s_dot`` the scalar columns of ``z_dot`` (``(F, E, ROW)``).
    Gate columns ``GC`` at a time (the outer loop), the chunk's edges ``BLOCK_M`` at a time."""
    ROW: tl.constexpr = row_width(LMAX, CF)
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    chunk = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    cg = tl.arange(0, GC)
    c = tl.arange(0, CP)
    c_mask = c < CF
    gw_base = gw_ptr + (layer * F + f) * (CF * G)
    e_start = chunk * CHUNK
    n_rows = tl.minimum(E - e_start, CHUNK)
    r = tl.arange(0, BLOCK_M).to(tl.int64)
    unused = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        col_m0, col_neg, col_pos = degree_cols(gcol, LMAX, CF)
        acc = tl.zeros((CP, GC), dtype=tl.float32)
        for r0 in tl.range(0, n_rows, BLOCK_M):
            e = e_start + r0 + r
            mask = (e < E)[:, None]
            full = mask & c_mask[None, :]
            z_rows = ((layer * F + f) * E + e) * ROW
            z2 = z_rows[:, None]
            h2 = (((h_layer * F + f) * E + e) * ROW)[:, None]
            sg = gate_sigmoids(z_ptr + z_rows, mask, unused, unused, gw_base, gw_base, 1.0, gcol,
                               G, GC, R, BLOCK_M, False)
            h_m0, h_neg, h_pos = load_degree_cols(h_ptr, h2, col_m0, col_neg, col_pos, mask)
            z_m0, z_neg, z_pos = load_degree_cols(z_ptr, z2, col_m0, col_neg, col_pos, mask)
            gsg = gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos)
            gl = gate_logit_grad(gsg, sg)
            s = tl.load(z_ptr + z2 + c[None, :], mask=full, other=0.0)
            if CURVATURE:
                d_rows = (f * E + e) * ROW
                d2 = d_rows[:, None]
                zd_m0, zd_neg, zd_pos = load_degree_cols(zd_ptr, d2, col_m0, col_neg, col_pos, mask)
                t_dot = tangent_logits(zd_ptr + d_rows, mask, gw_base, gcol, G, GC, R, BLOCK_M)
                gl_curv = gate_logit_curvature(gate_grad(h_m0, zd_m0, h_neg, zd_neg, h_pos, zd_pos), gsg,
                                               t_dot, sg)
                s_dot = tl.load(zd_ptr + d2 + c[None, :], mask=full, other=0.0)
                acc = tl.dot(tl.trans(s), gl_curv, acc, input_precision="ieee")
                acc = tl.dot(tl.trans(s_dot), gl, acc, input_precision="ieee")
            else:
                acc = tl.dot(tl.trans(s), gl, acc, input_precision="ieee")
        offs = (chunk * F + f) * (CF * G) + c[:, None] * G + gcol[None, :]
        tl.store(part_ptr + offs, acc, mask=c_mask[:, None])


@triton.jit(do_not_specialize=["n_chunks", "layer"])
def chunk_sum_kernel(
    part_ptr, out0_ptr, out1_ptr, n_chunks, layer, F,
    SIZE: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
):
    """``out[layer, f] = sum over chunks c (in order) of part[c, f]``; the first ``SPLIT`` of a
    partial's ``SIZE`` values go to ``out0`` ``(n, F, SPLIT)``, the rest to ``out1``."""
    pid = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < SIZE
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for ch in tl.range(0, n_chunks):
        acc += tl.load(part_ptr + (ch * F + f) * SIZE + idx, mask=mask, other=0.0)
    first = idx < SPLIT
    tl.store(out0_ptr + (layer * F + f) * SPLIT + idx, acc, mask=mask & first)
    tl.store(out1_ptr + (layer * F + f) * (SIZE - SPLIT) + (idx - SPLIT), acc, mask=mask & (idx >= SPLIT))


@triton.jit(do_not_specialize=["layer", "u_layer", "out_layer"])
def layer_input_kernel(
    u_ptr, out_ptr, z_ptr, gw_ptr,
    layer, u_layer, out_layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, GC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """``out[out_layer] = u[u_layer] + a(z[layer])``: the input of gated layer ``layer + 1`` from
    that of ``layer`` and its saved pre-activations (``(n, F, E, ROW)`` surfaces), gate columns
    ``GC`` at a time as the forward's gate kernel."""
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    f, e, e_in = edge_tile(E, BLOCK_M)
    cg = tl.arange(0, GC)
    mask = e_in[:, None]
    u2 = (((u_layer * F + f) * E + e) * ROW)[:, None]
    o2 = (((out_layer * F + f) * E + e) * ROW)[:, None]
    z_rows = ((layer * F + f) * E + e) * ROW
    z2 = z_rows[:, None]
    gw_base = gw_ptr + (layer * F + f) * (CF * G)
    unused = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, R):                     # the scalar columns: u + silu(s)
        cols = (k * GC + cg)[None, :]
        s_k = tl.load(z_ptr + z2 + cols, mask=mask, other=0.0)
        tl.store(out_ptr + o2 + cols, tl.load(u_ptr + u2 + cols, mask=mask, other=0.0) + silu(s_k), mask=mask)
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        sg = gate_sigmoids(z_ptr + z_rows, mask, unused, unused, gw_base, gw_base, 1.0, gcol,
                           G, GC, R, BLOCK_M, False)
        for row in tl.static_range(3):           # m = 0, m = -1, m = +1 of the degree
            if row == 0:
                cols = (CF + gcol)[None, :]
            else:
                cols = (M0 + (row - 1) * G + gcol)[None, :]
            z_j = tl.load(z_ptr + z2 + cols, mask=mask, other=0.0)
            u_j = tl.load(u_ptr + u2 + cols, mask=mask, other=0.0)
            tl.store(out_ptr + o2 + cols, u_j + z_j * sg, mask=mask)
