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

Register tiles are ``CP = next_pow2(Cf)`` wide with column masks, so any Cf
that is a multiple of 16 runs; padded lanes load zeros and are never stored.
The loop over degrees is a runtime loop: unrolled (``static_range``) it kept
every degree's tiles live and spilled 116-224 registers at Cf = 64 (H200).
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, sigmoid, silu, silu_grad
from .compensated import row_amax, split_rows, split_tile_dot


@triton.jit
def gate_operands(s, mask, gwup_ptr, COMPENSATED: tl.constexpr):
    """What ``gate_sigmoids`` takes besides ``gw``: at level 3 the split rows of ``s`` and
    ``gw``'s scale ``(s_hi, s_lo, s_up, w_up)``; exact, placeholders (``s`` itself)."""
    if COMPENSATED:
        s_hi, s_lo, s_up = split_rows(s, mask)
        w_up = tl.load(gwup_ptr)
    else:
        s_hi, s_lo, s_up, w_up = s, s, s, 1.0
    return s_hi, s_lo, s_up, w_up


@triton.jit
def gate_sigmoids(s, s_hi, s_lo, s_up, gw_base, gwlo_base, w_up, j, c, w_mask,
                  G: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr, BLOCK_M: tl.constexpr,
                  COMPENSATED: tl.constexpr):
    """Degree ``j``'s gate sigmoids ``sigmoid(s @ gw[:, j*Cf:(j+1)*Cf])``, one register tile:
    the forward gate, the relay's recompute and the fused backward all call this, so the
    sigmoids have the same bits wherever they are formed (at level 3, from split products)."""
    w_offs = c[:, None] * G + (j * CF + c)[None, :]
    if COMPENSATED:
        gw_hi = tl.load(gw_base + w_offs, mask=w_mask, other=0.0)
        gw_lo = tl.load(gwlo_base + w_offs, mask=w_mask, other=0.0)
        logits = split_tile_dot(s_hi, s_lo, s_up, gw_hi, gw_lo, w_up, BLOCK_M, CP)
    else:
        gw_j = tl.load(gw_base + w_offs, mask=w_mask, other=0.0)
        logits = tl.dot(s, gw_j, input_precision="ieee")
    return sigmoid(logits)


@triton.jit(do_not_specialize=["layer"])
def gate_kernel(
    z_ptr, gw_ptr, u_ptr, u_next_ptr, sg_ptr, amax_ptr, gwlo_ptr, gwup_ptr,
    layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr,
    WRITE_U: tl.constexpr, WRITE_AMAX: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_M: tl.constexpr,
):
    M0: tl.constexpr = (LMAX + 1) * CF
    ROW: tl.constexpr = M0 + 2 * LMAX * CF
    G: tl.constexpr = LMAX * CF
    pid = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    e = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    c = tl.arange(0, CP)
    c_mask = c < CF
    mask = (e < E)[:, None] & c_mask[None, :]
    rows = (f * E + e) * ROW
    z_rows = ((layer * F + f) * E + e) * ROW     # int64 before the multiply by E
    sg_rows = (f * E + e) * G

    s = tl.load(z_ptr + z_rows[:, None] + c[None, :], mask=mask, other=0.0)
    if WRITE_U:
        u_s = tl.load(u_ptr + rows[:, None] + c[None, :], mask=mask, other=0.0)
        v = u_s + silu(s)
        tl.store(u_next_ptr + rows[:, None] + c[None, :], v, mask=mask)
        if WRITE_AMAX:
            amax = row_amax(v, mask)
    gw_base = gw_ptr + (layer * F + f) * (CF * G)
    gwlo_base = gwlo_ptr + (layer * F + f) * (CF * G)
    w_mask = c_mask[:, None] & c_mask[None, :]
    s_hi, s_lo, s_up, w_up = gate_operands(s, mask, gwup_ptr + layer * F + f, COMPENSATED)
    for j in tl.range(0, LMAX):
        sg = gate_sigmoids(s, s_hi, s_lo, s_up, gw_base, gwlo_base, w_up, j, c, w_mask,
                           G, CF, CP, BLOCK_M, COMPENSATED)
        tl.store(sg_ptr + sg_rows[:, None] + (j * CF + c)[None, :], sg, mask=mask)
        if WRITE_U:
            cols = (j + 1) * CF + c
            z_j = tl.load(z_ptr + z_rows[:, None] + cols[None, :], mask=mask, other=0.0)
            u_j = tl.load(u_ptr + rows[:, None] + cols[None, :], mask=mask, other=0.0)
            v = u_j + z_j * sg
            tl.store(u_next_ptr + rows[:, None] + cols[None, :], v, mask=mask)
            if WRITE_AMAX:
                amax = tl.maximum(amax, row_amax(v, mask))
    if WRITE_AMAX:
        tl.store(amax_ptr + (f * E + e) * 2, amax, mask=e < E)


@triton.jit(do_not_specialize=["layer"])
def gate_backward_kernel(
    h_ptr, z_ptr, sg_ptr, gw_ptr, gz_ptr, amax_ptr, gwlo_ptr, gwup_ptr,
    layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr,
    WRITE_AMAX: tl.constexpr, RECOMPUTE_SG: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_M: tl.constexpr,
):
    M0: tl.constexpr = (LMAX + 1) * CF
    ROW: tl.constexpr = M0 + 2 * LMAX * CF
    G: tl.constexpr = LMAX * CF
    pid = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    e = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    c = tl.arange(0, CP)
    c_mask = c < CF
    mask = (e < E)[:, None] & c_mask[None, :]
    rows = ((f * E + e) * ROW)[:, None]
    z_rows = (((layer * F + f) * E + e) * ROW)[:, None]
    sg_rows = ((f * E + e) * G)[:, None]
    gw_base = gw_ptr + (layer * F + f) * (CF * G)
    gwlo_base = gwlo_ptr + (layer * F + f) * (CF * G)
    w_mask = c_mask[:, None] & c_mask[None, :]

    s = tl.load(z_ptr + z_rows + c[None, :], mask=mask, other=0.0)
    contraction = tl.zeros((BLOCK_M, CP), dtype=tl.float32)
    if RECOMPUTE_SG:
        s_hi, s_lo, s_up, w_up = gate_operands(s, mask, gwup_ptr + layer * F + f, COMPENSATED)
    elif COMPENSATED:
        w_up = tl.load(gwup_ptr + layer * F + f)
    amax0 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    amax1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for j in tl.range(0, LMAX):
        col_m0 = ((j + 1) * CF + c)[None, :]
        col_neg = (M0 + j * CF + c)[None, :]
        col_pos = (M0 + G + j * CF + c)[None, :]
        if RECOMPUTE_SG:
            sg = gate_sigmoids(s, s_hi, s_lo, s_up, gw_base, gwlo_base, w_up, j, c, w_mask,
                               G, CF, CP, BLOCK_M, COMPENSATED)
        else:
            sg = tl.load(sg_ptr + sg_rows + (j * CF + c)[None, :], mask=mask, other=0.0)
        h_m0 = tl.load(h_ptr + rows + col_m0, mask=mask, other=0.0)
        h_neg = tl.load(h_ptr + rows + col_neg, mask=mask, other=0.0)
        h_pos = tl.load(h_ptr + rows + col_pos, mask=mask, other=0.0)
        z_m0 = tl.load(z_ptr + z_rows + col_m0, mask=mask, other=0.0)
        z_neg = tl.load(z_ptr + z_rows + col_neg, mask=mask, other=0.0)
        z_pos = tl.load(z_ptr + z_rows + col_pos, mask=mask, other=0.0)
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
        wt_offs = c[None, :] * G + (j * CF + c)[:, None]
        if COMPENSATED:
            gl_hi, gl_lo, gl_up = split_rows(gl, mask)
            gwt_hi = tl.load(gw_base + wt_offs, mask=w_mask, other=0.0)
            gwt_lo = tl.load(gwlo_base + wt_offs, mask=w_mask, other=0.0)
            contraction += split_tile_dot(gl_hi, gl_lo, gl_up, gwt_hi, gwt_lo, w_up, BLOCK_M, CP)
        else:
            gw_t = tl.load(gw_base + wt_offs, mask=w_mask, other=0.0)
            contraction = tl.dot(gl, gw_t, contraction, input_precision="ieee")
    h_s = tl.load(h_ptr + rows + c[None, :], mask=mask, other=0.0)
    g_s = silu_grad(h_s, s) + contraction
    tl.store(gz_ptr + rows + c[None, :], g_s, mask=mask)
    if WRITE_AMAX:
        amax_rows = (f * E + e) * 2
        tl.store(amax_ptr + amax_rows, tl.maximum(amax0, row_amax(g_s, mask)), mask=e < E)
        tl.store(amax_ptr + amax_rows + 1, amax1, mask=e < E)
