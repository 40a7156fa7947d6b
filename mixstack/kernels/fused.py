"""The fused backward of one gated layer: gate recompute, ``gz`` and ``h += gz @ W^T`` in one kernel.

The relay (``gate.gate_kernel`` recompute, ``gate.gate_backward_kernel``, then
``gemm.block_gemm_kernel``) writes a sigmoid surface ``(F, E, G)`` and a ``gz``
surface ``(F, E, ROW)`` to device memory and reads both straight back.  Here a
persistent program takes edge tiles one after another; for each it

1. recomputes the gate sigmoids and forms every ``gz`` subtile of one output
   segment in registers, parking them in the program's own small scratch
   (``BLOCK_M x segment`` floats per program, a few MB in all: it stays in L2),
2. after a barrier, runs the relay's GEMM K loop (``gemm.degree_order_dot``)
   over that scratch, ``BLOCK_N`` output columns at a time, and adds the
   result into ``h`` in place.

A program owns its rows: it has read everything it needs of them before it
writes any, so ``h`` updates in place with no surface at all.

Two launches per layer over disjoint columns: the m = 0 segment (which carries
the SiLU chain and the gate-logit contraction, and reads the |m| = 1 rows of
``h``, so it runs first) and the |m| = 1 segment.

``COMPENSATED`` (level 3): the GEMM phase runs the split fp16 products of
``compensated.compensated_dot`` over the scratch, with ``w0t_ptr``/``w1t_ptr``
the fp16 heads of the split transposed weights, ``w0lo_ptr``/``w1lo_ptr``
their tails and ``wup_ptr`` their scales; each row's largest ``gz``
magnitude, which that needs, comes from the gate phase's registers, so
neither a pre-pass nor a recorded surface is needed.  Held to the float64
contract like every level-3 kernel.

Bitwise equal to the relay: the same ``activations`` helpers in the same
operator sequence for ``gz``, and the same K loop over the same ``gz`` values.
An earlier form kept the whole segment's accumulator in registers instead of
the scratch: bitwise equal too, but slower than the relay, with spills (BENCHMARKS.md,
"The fused backward").
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, silu_grad
from .compensated import compensated_dot, row_amax
from .gate import gate_sigmoids
from .gemm import degree_order_dot
from .rows import degree_cols, m0_width, row_width


@triton.jit(do_not_specialize=["layer"])
def fused_backward_kernel(
    h_ptr, z_ptr, gw_ptr, w0t_ptr, w1t_ptr, scratch_ptr, w0lo_ptr, w1lo_ptr, wup_ptr,
    layer, E, F, n_tiles,
    LMAX: tl.constexpr, CF: tl.constexpr, SEGMENT: tl.constexpr, COMPENSATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GC: tl.constexpr,
):
    M0: tl.constexpr = m0_width(LMAX, CF)
    ROW: tl.constexpr = row_width(LMAX, CF)
    M1: tl.constexpr = ROW - M0
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    if SEGMENT == 0:
        SEG: tl.constexpr = M0
        COL0: tl.constexpr = 0
    else:
        SEG: tl.constexpr = M1
        COL0: tl.constexpr = M0
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    rows_per_focus = tl.cdiv(E, BLOCK_M)
    c = tl.arange(0, CF)
    cg = tl.arange(0, GC)
    r = tl.arange(0, BLOCK_M).to(tl.int64)
    s_rows = (pid.to(tl.int64) * BLOCK_M + r) * SEG       # this program's scratch rows
    s2 = s_rows[:, None]
    second = (pid * 0 + SEGMENT) == 1

    for tile in range(pid, n_tiles, n_programs):
        f = (tile // rows_per_focus).to(tl.int64)
        e = (tile % rows_per_focus).to(tl.int64) * BLOCK_M + r
        e_mask = e < E
        mask = e_mask[:, None]
        rows = (f * E + e) * ROW
        r2 = rows[:, None]
        z_rows = ((layer * F + f) * E + e) * ROW
        z_r2 = z_rows[:, None]
        zs_rows = z_ptr + z_rows                          # the rows of s, for the gate's products
        gw_base = gw_ptr + (layer * F + f) * (CF * G)

        # Phase 1: the segment's gz subtiles, into the scratch (natural column order).
        if SEGMENT == 0:
            contraction = tl.zeros((BLOCK_M, CF), dtype=tl.float32)
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)      # level 3: the segment's row maxima of gz
        for t in tl.range(0, LMAX * R):                    # gate columns, GC at a time, as the relay
            gcol = t * GC + cg
            sg = gate_sigmoids(zs_rows, mask, amax, amax, gw_base, gw_base, 1.0, gcol, G, GC, R, BLOCK_M, False)
            col_m0, col_neg, col_pos = degree_cols(gcol, LMAX, CF)
            h_neg = tl.load(h_ptr + r2 + col_neg, mask=mask, other=0.0)
            h_pos = tl.load(h_ptr + r2 + col_pos, mask=mask, other=0.0)
            if SEGMENT == 0:
                h_m0 = tl.load(h_ptr + r2 + col_m0, mask=mask, other=0.0)
                z_m0 = tl.load(z_ptr + z_r2 + col_m0, mask=mask, other=0.0)
                z_neg = tl.load(z_ptr + z_r2 + col_neg, mask=mask, other=0.0)
                z_pos = tl.load(z_ptr + z_r2 + col_pos, mask=mask, other=0.0)
                gl = gate_logit_grad(gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos), sg)
                gw_t = tl.load(gw_base + c[None, :] * G + gcol[:, None])
                contraction = tl.dot(gl, gw_t, contraction, input_precision="ieee")
                g_m0 = h_m0 * sg
                tl.store(scratch_ptr + s2 + col_m0, g_m0)
                if COMPENSATED:
                    amax = tl.maximum(amax, row_amax(g_m0, mask))
            else:
                g_neg = h_neg * sg
                g_pos = h_pos * sg
                tl.store(scratch_ptr + s2 + gcol[None, :], g_neg)
                tl.store(scratch_ptr + s2 + (G + gcol)[None, :], g_pos)
                if COMPENSATED:
                    amax = tl.maximum(amax, tl.maximum(row_amax(g_neg, mask), row_amax(g_pos, mask)))
        if SEGMENT == 0:
            h_s = tl.load(h_ptr + r2 + c[None, :], mask=mask, other=0.0)
            s = tl.load(z_ptr + z_r2 + c[None, :], mask=mask, other=0.0)
            g_s = silu_grad(h_s, s) + contraction
            tl.store(scratch_ptr + s2 + c[None, :], g_s)
            if COMPENSATED:
                amax = tl.maximum(amax, row_amax(g_s, mask))
        tl.debug_barrier()      # the scratch is written by some threads and read by others

        # Phase 2: h[rows, segment] += gz @ W^T, the relay's K loop over the scratch.
        if SEGMENT == 0:
            wt_ptr = w0t_ptr + (layer * F + f) * (M0 * M0)
            wlo_ptr = w0lo_ptr + (layer * F + f) * (M0 * M0)
        else:
            wt_ptr = w1t_ptr + (layer * F + f) * (M1 * M1)
            wlo_ptr = w1lo_ptr + (layer * F + f) * (M1 * M1)
        if COMPENSATED:
            w_up = tl.load(wup_ptr + (layer * F + f) * 2 + SEGMENT)
        for n0 in tl.range(0, SEG, BLOCK_N, num_stages=1):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < SEG
            if COMPENSATED:
                acc = compensated_dot(scratch_ptr, s_rows, 0, e_mask, wt_ptr, wlo_ptr, w_up, SEG, n, n_mask,
                                      second, e_mask, amax, LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, False, True)
            else:
                acc = degree_order_dot(scratch_ptr, s_rows, 0, e_mask, wt_ptr, SEG, n, n_mask, second,
                                       e_mask, LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, False)
            ptrs = h_ptr + r2 + (COL0 + n)[None, :]
            out_mask = mask & n_mask[None, :]
            res = tl.load(ptrs, mask=out_mask, other=0.0)
            tl.store(ptrs, res + acc, mask=out_mask)
        tl.debug_barrier()      # the next tile overwrites the scratch
