"""Rotate-out's backward: the destination atoms' gradients rotated into each edge's frame.

Rotate-out's forward (``segment_sum.segment_rotate_back_kernel``) is

    out[i, l^2 + n, c] = sum_{e: dst[e] = i} ew[e] * sum_k W[e, k, l^2 + n] * ys_k[e, l, c]

with ``ys`` the stack's result summed over the focus streams.  Its backward is a gather, one
edge per row, no sums across edges:

    grad_ys[e, sub(k, l), c] = ew[e] * g_k[e, l, c],   g_k = sum_n W[e, k, l^2 + n] * ga[dst[e], l^2 + n, c]
    grad_W[e, k, l^2 + n]    = ew[e] * sum_c ys_k[e, l, c] * ga[dst[e], l^2 + n, c]
    grad_ew[e]               = sum_{k, l, c} ys_k[e, l, c] * g_k[e, l, c]

(``kernels.rotation`` holds the two rotations).  ``ys`` is read through its edge and focus
strides and summed over its ``F`` streams (the saved focus sum has ``F = 1``; the stack's
result, kept for a double backward, has ``F`` streams).  ``grad_ys (E, ROW)`` is the same for
every focus stream; the caller hands it on as a stride-0 broadcast.
"""

import triton
import triton.language as tl

from .rotation import rotate_degree, wigner_grad_degree


@triton.jit
def rotate_out_grad_kernel(ga_ptr, w_ptr, dst_ptr, ew_ptr, ys_ptr, grad_ys_ptr, grad_w_ptr, grad_ew_ptr,
                           E, F, ys_se, ys_sf,
                           LMAX: tl.constexpr, C: tl.constexpr, CP: tl.constexpr, HAS_EW: tl.constexpr,
                           GRAD_YS: tl.constexpr, GRAD_W: tl.constexpr, GRAD_EW: tl.constexpr,
                           BLOCK_E: tl.constexpr):
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    c = tl.arange(0, CP)
    mask = e_mask[:, None] & (c < C)[None, :]
    ga_rows = tl.load(dst_ptr + e, mask=e_mask, other=0).to(tl.int64) * (S * C)
    w_rows = e * (3 * S)
    if HAS_EW:
        ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
    ew_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    for l in tl.static_range(LMAX + 1):
        gn, g0, gp = rotate_degree(ga_ptr, ga_rows, w_ptr, w_rows, c, mask, e_mask, l, C, S)
        if GRAD_YS:
            out_at = grad_ys_ptr + (e * ROW)[:, None] + c[None, :]
            if HAS_EW:
                tl.store(out_at + l * C, g0 * ew, mask=mask)
                if l > 0:
                    tl.store(out_at + (LMAX + l) * C, gn * ew, mask=mask)
                    tl.store(out_at + (2 * LMAX + l) * C, gp * ew, mask=mask)
            else:
                tl.store(out_at + l * C, g0, mask=mask)
                if l > 0:
                    tl.store(out_at + (LMAX + l) * C, gn, mask=mask)
                    tl.store(out_at + (2 * LMAX + l) * C, gp, mask=mask)
        if GRAD_W or GRAD_EW:
            yn = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            y0 = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            yp = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            for f in range(F):
                ys_at = ys_ptr + (e * ys_se + f * ys_sf)[:, None] + c[None, :]
                y0 += tl.load(ys_at + l * C, mask=mask, other=0.0)
                if l > 0:
                    yn += tl.load(ys_at + (LMAX + l) * C, mask=mask, other=0.0)
                    yp += tl.load(ys_at + (2 * LMAX + l) * C, mask=mask, other=0.0)
            if GRAD_EW:
                ew_acc += g0 * y0 + gn * yn + gp * yp
            if GRAD_W:
                if HAS_EW:
                    yn = yn * ew
                    y0 = y0 * ew
                    yp = yp * ew
                wigner_grad_degree(ga_ptr, ga_rows, grad_w_ptr, w_rows, yn, y0, yp, c, mask, e_mask, l, C, S)
    if GRAD_EW:
        tl.store(grad_ew_ptr + e, tl.sum(ew_acc, axis=1), mask=e_mask)
