"""The gate of a gated layer, forwards and backwards (one program per edge tile and focus).

``gate_kernel`` computes the gate sigmoids ``sigmoid(s @ gw)`` of a layer from
its saved scalar pre-activations ``s = z[:, :Cf]`` and writes the sigmoid
surface ``(F, E, G)``; in the forward (``WRITE_U``) it also writes the m = 0
columns of the next layer input, ``u + [silu(s) | z0[:, Cf:] * sg]``.  The
backward relay calls it again to recompute the sigmoids instead of saving them.

With ``COMPENSATED`` (level 3) the gate's two small products, the logits
``s @ gw`` and the logit contraction ``gl @ gw^T``, run as split fp16 tensor-core
products like the stack's GEMMs (``compensated.split_tile_dot``; ``gw_ptr`` is
then ``gw``'s fp16 head, ``gwlo_ptr`` its tail and ``gwup_ptr`` its per-matrix
scales).  The launchers use them in the backward only (``launch.pointwise_config``
says what they bought there; the forward gate kernel got slower with them).

With ``RECOMPUTE_SG`` the pointwise backward forms the sigmoids itself from ``s``
and ``gw`` (no gate launch, no sigmoid surface, ``launch.pointwise_recomputes_gate``);
``gate_sigmoids`` is the one place they are formed, so they have the same bits
wherever they are.

With ``WRITE_AMAX`` (level 3) each kernel also records, per row, the largest
magnitude of what it wrote to each GEMM block's columns (``(F, E, 2)``: the
m = 0 block, the |m| = 1 block) for the compensated GEMM that reads it next
(``compensated.row_amax``); the forward gate kernel writes only m = 0 columns.

``gate_backward_kernel`` is the relay's pointwise step: from the upstream
gradient ``h``, the saved ``z`` and the sigmoid surface it writes ``gz``, the
cotangent of the layer's pre-activations, with the gate-logit contraction
``gl @ gw^T`` folded into the scalar columns.

The kernels walk the gate columns ``GC`` at a time (``GC`` = ``tuning.configs.gate_chunk``:
the largest power of two dividing Cf, at most 32), in degree order, and form each chunk's
logits over ``s`` in ``GC``-wide K chunks, so every register tile is ``BLOCK_M x GC`` and
needs no column mask; only the logit contraction's accumulator and the scalar columns'
last step are ``CP = next_pow2(Cf)`` wide, with masks.  Whole ``Cf``-wide products made
ptxas give up on registers at Cf 80-128 with lmax 1 (32 registers, 3.0-4.7 KB of stack,
every config tried) and in the level-3 forward gate at Cf 80-128 at every lmax (offline
sm_90 report, ``tests/test_compiler_grid.py``).  The loops are runtime loops: unrolled
(``static_range``) the degree loop kept every degree's tiles live and spilled 116-224
registers at Cf = 64 (H200).
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, sigmoid, silu, silu_grad
from .compensated import (
    pow2_scales,
    row_amax,
    split_fp16,
    split_products,
    split_result,
    split_rows,
    split_tile_dot,
)
from .rows import degree_cols, edge_tile, load_degree_cols, row_width


@triton.jit
def gate_row_scales(s_rows, mask, GC: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr):
    """Level 3: the power-of-two scales ``(down, up)`` that bring each row of ``s`` (the
    scalar columns, read through the row pointers ``s_rows`` in ``R`` chunks of ``GC``)
    into [1, 2): ``compensated.pow2_scales`` of the row's largest magnitude."""
    cg = tl.arange(0, GC)
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, R):
        s_k = tl.load(s_rows[:, None] + (k * GC + cg)[None, :], mask=mask, other=0.0)
        amax = tl.maximum(amax, row_amax(s_k, mask))
    return pow2_scales(amax)


@triton.jit
def gate_sigmoids(s_rows, mask, s_down, s_up, gw_base, gwlo_base, w_up, gcol,
                  G: tl.constexpr, GC: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr,
                  COMPENSATED: tl.constexpr):
    """The gate sigmoids of the ``GC`` gate columns ``gcol``: ``sigmoid(s @ gw[:, gcol])``.

    ``s`` (the scalar columns of ``z``, ``Cf = R * GC`` wide) is read through the row
    pointers ``s_rows`` in ``R`` chunks of ``GC`` columns, and the product runs over
    them in order with one accumulator (exact: one ``tl.dot`` per chunk; level 3: the
    split products of ``compensated.split_products``, the rows scaled by ``s_down`` /
    ``s_up`` from ``gate_row_scales`` and ``gw`` split once per call).  Chunks keep
    each product's operands to ``GC`` columns: a whole ``Cf``-wide FMA dot needs
    ``Cf x (rows + columns per thread)`` registers for its operands, and at Cf 80-128
    with lmax <= 2 ptxas gave up on that (32 registers, 3.4-4.6 KB of stack; offline
    sm_90 report).  The forward gate, the relay's recompute and the fused backward all
    call this, so the sigmoids have the same bits wherever they are formed."""
    cg = tl.arange(0, GC)
    acc = tl.zeros((BLOCK_M, GC), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, GC), dtype=tl.float32)
    for k in tl.range(0, R):
        kc = k * GC + cg
        s_k = tl.load(s_rows[:, None] + kc[None, :], mask=mask, other=0.0)
        w_offs = kc[:, None] * G + gcol[None, :]
        if COMPENSATED:
            s_hi, s_lo = split_fp16(s_k * s_down[:, None])
            gw_hi = tl.load(gw_base + w_offs)
            gw_lo = tl.load(gwlo_base + w_offs)
            acc, tail = split_products(s_hi, s_lo, gw_hi, gw_lo, acc, tail)
        else:
            acc = tl.dot(s_k, tl.load(gw_base + w_offs), acc, input_precision="ieee")
    if COMPENSATED:
        acc = split_result(acc, tail, s_up * w_up)
    return sigmoid(acc)


@triton.jit
def gate_operands(z_ptr, gw_ptr, gwlo_ptr, gwup_ptr, layer, E, F, LMAX: tl.constexpr, CF: tl.constexpr,
                  GC: tl.constexpr, BLOCK_M: tl.constexpr, COMPENSATED: tl.constexpr, SCALES: tl.constexpr):
    """What a gate kernel starts from (program axes: edge tile, focus): ``(f, e, e_in, rows,
    z_rows, gw_base, gwlo_base, w_up, s_down, s_up)``, this program's edges, their offsets in a
    focus-major ``(F, E, ROW)`` surface and in layer ``layer`` of the saved ``z``, the layer's
    gate weights (level 3: split head, tail and scale) and, with ``SCALES`` at level 3, the
    rows' scales of ``s`` (``gate_row_scales``); placeholders where unused."""
    ROW: tl.constexpr = row_width(LMAX, CF)
    f, e, e_in = edge_tile(E, BLOCK_M)
    z_rows = ((layer * F + f) * E + e) * ROW     # int64 before the multiply by E
    w_offset = (layer * F + f) * (CF * LMAX * CF)
    s_down = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s_up = s_down
    w_up = 1.0
    if COMPENSATED:
        w_up = tl.load(gwup_ptr + layer * F + f)
        if SCALES:
            s_down, s_up = gate_row_scales(z_ptr + z_rows, e_in[:, None], GC, CF // GC, BLOCK_M)
    return f, e, e_in, (f * E + e) * ROW, z_rows, gw_ptr + w_offset, gwlo_ptr + w_offset, w_up, s_down, s_up


@triton.jit(do_not_specialize=["layer"])
def gate_kernel(
    z_ptr, gw_ptr, u_ptr, u_next_ptr, sg_ptr, amax_ptr, gwlo_ptr, gwup_ptr,
    layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, GC: tl.constexpr,
    WRITE_U: tl.constexpr, WRITE_AMAX: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_M: tl.constexpr,
):
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    f, e, e_in, row_offs, z_rows, gw_base, gwlo_base, w_up, s_down, s_up = gate_operands(
        z_ptr, gw_ptr, gwlo_ptr, gwup_ptr, layer, E, F, LMAX, CF, GC, BLOCK_M, COMPENSATED, True)
    cg = tl.arange(0, GC)
    mask = e_in[:, None]                         # chunks never cross Cf: rows are the only mask
    rows = row_offs[:, None]
    sg_rows = ((f * E + e) * G)[:, None]
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if WRITE_U:
        for k in tl.range(0, R):                 # the scalar columns: u + silu(s)
            cols = (k * GC + cg)[None, :]
            s_k = tl.load(z_ptr + z_rows[:, None] + cols, mask=mask, other=0.0)
            v = tl.load(u_ptr + rows + cols, mask=mask, other=0.0) + silu(s_k)
            tl.store(u_next_ptr + rows + cols, v, mask=mask)
            if WRITE_AMAX:
                amax = tl.maximum(amax, row_amax(v, mask))
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        sg = gate_sigmoids(z_ptr + z_rows, mask, s_down, s_up, gw_base, gwlo_base, w_up, gcol,
                           G, GC, R, BLOCK_M, COMPENSATED)
        tl.store(sg_ptr + sg_rows + gcol[None, :], sg, mask=mask)
        if WRITE_U:
            cols = (CF + gcol)[None, :]          # the m = 0 columns of the same degree
            z_j = tl.load(z_ptr + z_rows[:, None] + cols, mask=mask, other=0.0)
            v = tl.load(u_ptr + rows + cols, mask=mask, other=0.0) + z_j * sg
            tl.store(u_next_ptr + rows + cols, v, mask=mask)
            if WRITE_AMAX:
                amax = tl.maximum(amax, row_amax(v, mask))
    if WRITE_AMAX:
        tl.store(amax_ptr + (f * E + e) * 2, amax, mask=e_in)


@triton.jit(do_not_specialize=["layer"])
def gate_backward_kernel(
    h_ptr, z_ptr, sg_ptr, gw_ptr, gz_ptr, amax_ptr, gwlo_ptr, gwup_ptr,
    layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr, GC: tl.constexpr,
    WRITE_AMAX: tl.constexpr, RECOMPUTE_SG: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_M: tl.constexpr,
):
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    f, e, e_in, row_offs, z_rows, gw_base, gwlo_base, w_up, s_down, s_up = gate_operands(
        z_ptr, gw_ptr, gwlo_ptr, gwup_ptr, layer, E, F, LMAX, CF, GC, BLOCK_M, COMPENSATED, RECOMPUTE_SG)
    cg = tl.arange(0, GC)
    c = tl.arange(0, CP)
    c_mask = c < CF
    mask = e_in[:, None]
    rows = row_offs[:, None]
    z2 = z_rows[:, None]
    sg_rows = ((f * E + e) * G)[:, None]
    contraction = tl.zeros((BLOCK_M, CP), dtype=tl.float32)
    amax0 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    amax1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        col_m0, col_neg, col_pos = degree_cols(gcol, LMAX, CF)
        if RECOMPUTE_SG:
            sg = gate_sigmoids(z_ptr + z_rows, mask, s_down, s_up, gw_base, gwlo_base, w_up, gcol,
                               G, GC, R, BLOCK_M, COMPENSATED)
        else:
            sg = tl.load(sg_ptr + sg_rows + gcol[None, :], mask=mask, other=0.0)
        h_m0, h_neg, h_pos = load_degree_cols(h_ptr, rows, col_m0, col_neg, col_pos, mask)
        z_m0, z_neg, z_pos = load_degree_cols(z_ptr, z2, col_m0, col_neg, col_pos, mask)
        g_m0 = h_m0 * sg
        g_neg = h_neg * sg
        g_pos = h_pos * sg
        tl.store(gz_ptr + rows + col_m0, g_m0, mask=mask)
        tl.store(gz_ptr + rows + col_neg, g_neg, mask=mask)
        tl.store(gz_ptr + rows + col_pos, g_pos, mask=mask)
        if WRITE_AMAX:
            amax0 = tl.maximum(amax0, row_amax(g_m0, mask))
            amax1 = tl.maximum(amax1, tl.maximum(row_amax(g_neg, mask), row_amax(g_pos, mask)))
        gl = gate_logit_grad(gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos), sg)
        wt_offs = c[None, :] * G + gcol[:, None]              # gw^T rows gcol, all Cf columns
        if COMPENSATED:
            gl_hi, gl_lo, gl_up = split_rows(gl, mask)
            gwt_hi = tl.load(gw_base + wt_offs, mask=c_mask[None, :], other=0.0)
            gwt_lo = tl.load(gwlo_base + wt_offs, mask=c_mask[None, :], other=0.0)
            contraction += split_tile_dot(gl_hi, gl_lo, gl_up, gwt_hi, gwt_lo, w_up, BLOCK_M, CP)
        else:
            gw_t = tl.load(gw_base + wt_offs, mask=c_mask[None, :], other=0.0)
            contraction = tl.dot(gl, gw_t, contraction, input_precision="ieee")
    full = mask & c_mask[None, :]
    h_s = tl.load(h_ptr + rows + c[None, :], mask=full, other=0.0)
    s = tl.load(z_ptr + z2 + c[None, :], mask=full, other=0.0)
    g_s = silu_grad(h_s, s) + contraction
    tl.store(gz_ptr + rows + c[None, :], g_s, mask=full)
    if WRITE_AMAX:
        amax_rows = (f * E + e) * 2
        tl.store(amax_ptr + amax_rows, tl.maximum(amax0, row_amax(g_s, full)), mask=e_in)
        tl.store(amax_ptr + amax_rows + 1, amax1, mask=e_in)
