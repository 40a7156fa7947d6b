"""Rotate-out's backward: the destination atoms' gradients rotated into each edge's frame.

Rotate-out's forward (``segment_sum.segment_rotate_back_kernel``) is

    out[i, l^2 + n, q] = sum_{e: dst[e] = i} sum_k W[e, k, l^2 + n] * ew[e, q] * ys_k[e, l, q]

with ``ys`` the stack's result summed over the focus streams (``CW = C``) or each stream in its
channel block (``CW = F * C``, lanes as in ``kernels.rotation.lanes``).  Its backward is a gather,
one edge per row, no sums across edges:

    grad_ys[e, sub(k, l), q] = ew[e, q] * g_k[e, l, q],   g_k = sum_n W[e, k, l^2 + n] * ga[dst[e], l^2 + n, q]
    grad_W[e, k, l^2 + n]    = sum_q ew[e, q] * ys_k[e, l, q] * ga[dst[e], l^2 + n, q]
    grad_ew[e (, f, h)]      = sum_{k, l, q (of stream f, head h)} ys_k[e, l, q] * g_k[e, l, q]

(``kernels.rotation`` holds the two rotations; the launcher folds a per-row output factor into
``ga``).  ``ys`` is read through its edge and focus strides and summed over ``NF`` streams (the
saved focus sum has ``NF = 1``; the stack's result, kept for a double backward, has ``F``; kept
apart, ``NF = 1`` and the lanes carry the streams).  ``grad_ys`` is written through its edge and
focus strides: ``(E, ROW)``, the same for every focus stream (the caller hands it on as a
stride-0 broadcast), or ``(E, F, ROW)`` with the streams kept apart.
"""

import triton
import triton.language as tl

from .rotation import (
    edge_tile,
    edge_weights,
    lanes,
    node_rows,
    rotate_degree,
    store_edge_weight_grad,
    store_subtiles,
    sum_streams,
    wigner_grad_degree,
)


@triton.jit
def rotate_out_grad_kernel(ga_ptr, w_ptr, dst_ptr, ew_ptr, ys_ptr, grad_ys_ptr, grad_w_ptr, grad_ew_ptr,
                           E, NF, ys_se, ys_sf, gy_se, gy_sf,
                           LMAX: tl.constexpr, C: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr,
                           EW: tl.constexpr, HEADS: tl.constexpr, NG: tl.constexpr,
                           GRAD_YS: tl.constexpr, GRAD_W: tl.constexpr, GRAD_EW: tl.constexpr,
                           BLOCK_E: tl.constexpr):
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    e, e_mask, mask, w_rows = edge_tile(E, BLOCK_E, CW, CP, S)
    ga_rows = node_rows(dst_ptr, e, e_mask, CW, S)
    lane, stream, chan, lane_mask = lanes(C, CW, CP)
    if EW > 0:
        ew = edge_weights(ew_ptr, e, e_mask, stream, chan, mask, EW, HEADS, NG, C)
    ew_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    for l in tl.static_range(LMAX + 1):
        gn, g0, gp = rotate_degree(ga_ptr, ga_rows, w_ptr, w_rows, lane, mask, e_mask, l, CW, S)
        if GRAD_YS:
            out_at = grad_ys_ptr + (e * gy_se)[:, None] + (stream * gy_sf + chan)[None, :]
            if EW > 0:
                store_subtiles(out_at, l, gn * ew, g0 * ew, gp * ew, mask, LMAX, C)
            else:
                store_subtiles(out_at, l, gn, g0, gp, mask, LMAX, C)
        if GRAD_W or GRAD_EW:
            ys_at = ys_ptr + (e * ys_se)[:, None] + (stream * ys_sf + chan)[None, :]
            yn, y0, yp = sum_streams(ys_at, ys_sf, NF, l, mask, LMAX, C)
            if GRAD_EW:
                ew_acc += g0 * y0 + gn * yn + gp * yp
            if GRAD_W:
                if EW > 0:
                    yn = yn * ew
                    y0 = y0 * ew
                    yp = yp * ew
                wigner_grad_degree(ga_ptr, ga_rows, grad_w_ptr, w_rows, yn, y0, yp, lane, mask, e_mask, l, CW, S)
    if GRAD_EW:
        store_edge_weight_grad(grad_ew_ptr, e, e_mask, ew_acc, stream, chan, EW, HEADS, NG, C)
