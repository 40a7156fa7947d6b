"""The fused backward of one gated layer: gate recompute, ``gz`` and ``h += gz @ W^T`` in one walk.

The relay (``gate.gate_kernel`` recompute, ``gate.gate_backward_kernel``, then
``gemm.block_gemm_kernel``) writes a sigmoid surface ``(F, E, G)`` and a ``gz``
surface ``(F, E, ROW)`` and reads both straight back.  Here each program owns a
tile of edge rows and the *whole* output segment of those rows, produces every
``Cf``-wide ``gz`` subtile in registers in the GEMM's K order (degree order,
see ``gemm``) and updates ``h`` in place: it reads all the columns of its rows
before it writes any, and no other program touches those rows, so no surface
is needed at all.

Two launches per layer over disjoint columns: the m = 0 segment (which carries
the SiLU chain and the gate-logit contraction and needs the |m| = 1 rows of
``h``, so it runs first) and the |m| = 1 segment, so the light segment does
not inherit the heavy one's registers.  A segment is ``(lmax + 1) * Cf`` or
``2 * lmax * Cf`` wide, not a power of two: its accumulator is split into up
to three power-of-two chunks ``N_A + N_B + N_C`` with no padding.

Bitwise equal to the relay: the same ``activations`` helpers in the same
operator sequence, the same ``tl.dot`` tiles (one ``Cf`` subtile of K) in the
same K order.  Regime: ``Cf`` in {16, 32, 64} (the K tile).
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, sigmoid, silu_grad


@triton.jit
def _chunk_dot(gz, wt_ptr, krow, M: tl.constexpr, OFF: tl.constexpr, N: tl.constexpr, CF: tl.constexpr, acc):
    """``acc += gz @ W^T[krow : krow + Cf, OFF : OFF + N]`` for one output chunk."""
    kk = tl.arange(0, CF)
    nn = OFF + tl.arange(0, N)
    w = tl.load(wt_ptr + (krow + kk)[:, None] * M + nn[None, :])
    return tl.dot(gz, w, acc, input_precision="ieee")


@triton.jit
def _chunk_store(h_ptr, rows, col0, OFF: tl.constexpr, N: tl.constexpr, e_mask, acc):
    """``h[rows, col0 + OFF : col0 + OFF + N] += acc`` (read, add, write: the relay's epilogue)."""
    cols = col0 + OFF + tl.arange(0, N)
    ptrs = h_ptr + rows[:, None] + cols[None, :]
    res = tl.load(ptrs, mask=e_mask[:, None], other=0.0)
    tl.store(ptrs, res + acc, mask=e_mask[:, None])


@triton.jit(do_not_specialize=["layer"])
def fused_backward_kernel(
    h_ptr, z_ptr, gw_ptr, w0t_ptr, w1t_ptr,
    layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, SEGMENT: tl.constexpr,
    N_A: tl.constexpr, N_B: tl.constexpr, N_C: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    M0: tl.constexpr = (LMAX + 1) * CF
    M1: tl.constexpr = 2 * LMAX * CF
    ROW: tl.constexpr = M0 + M1
    G: tl.constexpr = LMAX * CF
    pid = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64)
    e = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    e_mask = e < E
    c = tl.arange(0, CF)
    mask = e_mask[:, None]
    rows = (f * E + e) * ROW
    r2 = rows[:, None]
    z_r2 = ((((layer * F + f) * E + e) * ROW))[:, None]
    gw_base = gw_ptr + (layer * F + f) * (CF * G)
    if SEGMENT == 0:
        wt_ptr = w0t_ptr + (layer * F + f) * (M0 * M0)
    else:
        wt_ptr = w1t_ptr + (layer * F + f) * (M1 * M1)

    s = tl.load(z_ptr + z_r2 + c[None, :], mask=mask, other=0.0)
    acc_a = tl.zeros((BLOCK_M, N_A), dtype=tl.float32)
    if N_B > 0:
        acc_b = tl.zeros((BLOCK_M, N_B), dtype=tl.float32)
    if N_C > 0:
        acc_c = tl.zeros((BLOCK_M, N_C), dtype=tl.float32)
    if SEGMENT == 0:
        contraction = tl.zeros((BLOCK_M, CF), dtype=tl.float32)

    for j in tl.range(0, LMAX):
        gw_j = tl.load(gw_base + c[:, None] * G + (j * CF + c)[None, :])
        sg = sigmoid(tl.dot(s, gw_j, input_precision="ieee"))
        col_neg = (M0 + j * CF + c)[None, :]
        col_pos = (M0 + G + j * CF + c)[None, :]
        h_neg = tl.load(h_ptr + r2 + col_neg, mask=mask, other=0.0)
        h_pos = tl.load(h_ptr + r2 + col_pos, mask=mask, other=0.0)
        if SEGMENT == 0:
            col_m0 = ((j + 1) * CF + c)[None, :]
            h_m0 = tl.load(h_ptr + r2 + col_m0, mask=mask, other=0.0)
            z_m0 = tl.load(z_ptr + z_r2 + col_m0, mask=mask, other=0.0)
            z_neg = tl.load(z_ptr + z_r2 + col_neg, mask=mask, other=0.0)
            z_pos = tl.load(z_ptr + z_r2 + col_pos, mask=mask, other=0.0)
            gl = gate_logit_grad(gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos), sg)
            gw_t = tl.load(gw_base + c[None, :] * G + (j * CF + c)[:, None])
            contraction = tl.dot(gl, gw_t, contraction, input_precision="ieee")
            # K tile (j + 1): the m = 0 row of degree j + 1.
            gz = h_m0 * sg
            krow = (j + 1) * CF
            acc_a = _chunk_dot(gz, wt_ptr, krow, M0, 0, N_A, CF, acc_a)
            if N_B > 0:
                acc_b = _chunk_dot(gz, wt_ptr, krow, M0, N_A, N_B, CF, acc_b)
            if N_C > 0:
                acc_c = _chunk_dot(gz, wt_ptr, krow, M0, N_A + N_B, N_C, CF, acc_c)
        else:
            # K tiles 2j and 2j + 1: m = -1 then m = +1 of degree j + 1, one gate.
            gz = h_neg * sg
            krow = j * CF
            acc_a = _chunk_dot(gz, wt_ptr, krow, M1, 0, N_A, CF, acc_a)
            if N_B > 0:
                acc_b = _chunk_dot(gz, wt_ptr, krow, M1, N_A, N_B, CF, acc_b)
            if N_C > 0:
                acc_c = _chunk_dot(gz, wt_ptr, krow, M1, N_A + N_B, N_C, CF, acc_c)
            gz = h_pos * sg
            krow = G + j * CF
            acc_a = _chunk_dot(gz, wt_ptr, krow, M1, 0, N_A, CF, acc_a)
            if N_B > 0:
                acc_b = _chunk_dot(gz, wt_ptr, krow, M1, N_A, N_B, CF, acc_b)
            if N_C > 0:
                acc_c = _chunk_dot(gz, wt_ptr, krow, M1, N_A + N_B, N_C, CF, acc_c)

    if SEGMENT == 0:
        # Last K tile: the scalar subtile, once the gate-logit contraction is complete.
        h_s = tl.load(h_ptr + r2 + c[None, :], mask=mask, other=0.0)
        gz = silu_grad(h_s, s) + contraction
        acc_a = _chunk_dot(gz, wt_ptr, 0, M0, 0, N_A, CF, acc_a)
        if N_B > 0:
            acc_b = _chunk_dot(gz, wt_ptr, 0, M0, N_A, N_B, CF, acc_b)
        if N_C > 0:
            acc_c = _chunk_dot(gz, wt_ptr, 0, M0, N_A + N_B, N_C, CF, acc_c)
        col0 = 0
    else:
        col0 = M0
    _chunk_store(h_ptr, rows, col0, 0, N_A, e_mask, acc_a)
    if N_B > 0:
        _chunk_store(h_ptr, rows, col0, N_A, N_B, e_mask, acc_b)
    if N_C > 0:
        _chunk_store(h_ptr, rows, col0, N_A + N_B, N_C, e_mask, acc_c)
