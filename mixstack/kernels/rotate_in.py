"""Rotate-in: gather the source atoms' features, rotate them into each edge's frame, scale them
by the radial weights and write the stack's input ``u (F, E, ROW)``; and its backward.

Per edge ``e`` (source atom ``src[e]``), focus stream ``f``, degree ``l`` and row ``k`` of the
packed Wigner rows (``kernels.rotation``):

    rot_k[e, l, c] = sum_n W[e, k, l^2 + n] * x[src[e], l^2 + n, c]
    u[f, e, sub(k, l), c] = ew[e] * (rad[e, f, r(k, l), c] * rot_k[e, l, c]
                                     + [k = 1] * sw[e, f, l, c] * h[e, c])

with ``sub(1, l) = l``, ``sub(0, l) = lmax + l``, ``sub(2, l) = 2*lmax + l`` (the stack's row
layout, docs/contract.md §1) and ``r(1, l) = l``, ``r(0, l) = r(2, l) = lmax + l`` (one radial
weight per degree scales m = -1 and m = +1 alike, which keeps the convolution equivariant).
``h (E, C)`` (optional) is an invariant edge scalar, added to the m = 0 subtile of every degree
with its own weights ``sw (E, F, lmax + 1, C)``; ``ew`` (optional) scales the whole row.
``rad`` and ``sw`` are read through their strides (views of a wider radial network output need
no copy).

With ``LINEAR`` the radial weights are not read but made per tile from a linear layer,
``rad[e, f, r, c] = sum_j hid[e, j] * lw[f, r, c, j] + lb[f, r, c]`` (``linear_row``, one
``tl.dot`` a row; the rows ``2*lmax + 1 + l`` are the edge scalar's weights ``sw``), so the
``(E, F, rows, C)`` weights are never read or kept; the backward makes them again the same way
and writes their gradient, all rows of it, for the launcher's one product with the layer's
weight (the hidden layer's gradient).

``rotate_in_grad_kernel`` is the edge-parallel part of the backward: the gradients of the
radial weights, the edge scalar and its weights, the edge weights and the Wigner rows, and the gradient of the
rotated features ``grot (E, 3*lmax + 1, C)`` (in the row's subtile order), from which
``segment_sum.segment_rotate_back_kernel`` forms the node features' gradient over the
edges grouped by source atom, in a fixed order.
"""

import triton
import triton.language as tl

from .rotation import rotate_degree, wigner_grad_degree

# The linear radial layer's products run on tensor cores as three TF32 products (a split of
# each float32 operand into a TF32 head and tail; the tail x tail product is dropped): about
# 2^-21 relative per product against float32's 2^-24.  With exact fp32 FMA products ("ieee")
# the bench model's rotate-in took 9.8 ms forward and 18.4 ms backward on the H200, against
# 1.3 and 2.8 ms reading the weights whole.
RADIAL_PRECISION: tl.constexpr = tl.constexpr("tf32x3")


@triton.jit
def linear_row(hid, lw_ptr, lb_ptr, f, r, c, j, NRAD: tl.constexpr, C: tl.constexpr, H: tl.constexpr):
    """Row ``r`` of focus ``f`` of a linear layer's output, ``(BLOCK_E, CP)``: ``hid (BLOCK_E,
    HP) @ lw[f, r]^T + lb[f, r]`` (``lw (F, NRAD, C, H)``, ``lb (F, NRAD, C)`` contiguous), the
    products at ``RADIAL_PRECISION``, summed over ``j`` in the dot's fixed order."""
    base = (f * NRAD + r) * C
    wt = tl.load(lw_ptr + (base + c[None, :]) * H + j[:, None], mask=(j < H)[:, None] & (c < C)[None, :],
                 other=0.0)
    b = tl.load(lb_ptr + base + c, mask=c < C, other=0.0)
    return tl.dot(hid, wt, input_precision=RADIAL_PRECISION) + b[None, :]


@triton.jit
def weight_row(at, stride, row, hid, lw_ptr, lb_ptr, f, made_row, c, j, mask, LINEAR: tl.constexpr,
               NRAD: tl.constexpr, C: tl.constexpr, H: tl.constexpr):
    """One row of weights, ``(BLOCK_E, CP)``: read at ``at + row * stride`` or, with ``LINEAR``,
    made by ``linear_row`` as the layer's row ``made_row``."""
    if LINEAR:
        return linear_row(hid, lw_ptr, lb_ptr, f, made_row, c, j, NRAD, C, H)
    return tl.load(at + row * stride, mask=mask, other=0.0)


@triton.jit
def rotate_in_kernel(x_ptr, w_ptr, rad_ptr, src_ptr, h_ptr, sw_ptr, ew_ptr, u_ptr, hid_ptr, lw_ptr, lb_ptr,
                     E, F, rad_se, rad_sf, rad_sr, sw_se, sw_sf, sw_sl,
                     LMAX: tl.constexpr, C: tl.constexpr, CP: tl.constexpr,
                     HAS_SCALAR: tl.constexpr, HAS_EW: tl.constexpr, BLOCK_E: tl.constexpr,
                     LINEAR: tl.constexpr, H: tl.constexpr, HP: tl.constexpr):
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    NRAD: tl.constexpr = 3 * LMAX + 2 if HAS_SCALAR else 2 * LMAX + 1
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    c = tl.arange(0, CP)
    mask = e_mask[:, None] & (c < C)[None, :]
    x_rows = tl.load(src_ptr + e, mask=e_mask, other=0).to(tl.int64) * (S * C)
    w_rows = e * (3 * S)
    if HAS_EW:
        ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
    if HAS_SCALAR:
        h = tl.load(h_ptr + (e * C)[:, None] + c[None, :], mask=mask, other=0.0)
    if LINEAR:
        j = tl.arange(0, HP)
        hid = tl.load(hid_ptr + (e * H)[:, None] + j[None, :], mask=e_mask[:, None] & (j < H)[None, :], other=0.0)
    else:                                   # unread: weight_row loads the weights instead
        j = 0
        hid = 0.0
    for l in tl.static_range(LMAX + 1):
        rn, r0, rp = rotate_degree(x_ptr, x_rows, w_ptr, w_rows, c, mask, e_mask, l, C, S)
        for f in range(F):
            rad_at = rad_ptr + (e * rad_se + f * rad_sf)[:, None] + c[None, :]
            u_at = u_ptr + (((e * 0 + f) * E + e) * ROW)[:, None] + c[None, :]     # int64 before * E
            v0 = weight_row(rad_at, rad_sr, l, hid, lw_ptr, lb_ptr, f, l, c, j, mask, LINEAR, NRAD, C, H) * r0
            if HAS_SCALAR:
                sw_at = sw_ptr + (e * sw_se + f * sw_sf)[:, None] + c[None, :]
                sw = weight_row(sw_at, sw_sl, l, hid, lw_ptr, lb_ptr, f, 2 * LMAX + 1 + l, c, j, mask, LINEAR,
                                NRAD, C, H)
                v0 += sw * h
            if HAS_EW:
                v0 = v0 * ew
            tl.store(u_at + l * C, v0, mask=mask)
            if l > 0:
                a1 = weight_row(rad_at, rad_sr, LMAX + l, hid, lw_ptr, lb_ptr, f, LMAX + l, c, j, mask, LINEAR,
                                NRAD, C, H)
                vn = a1 * rn
                vp = a1 * rp
                if HAS_EW:
                    vn = vn * ew
                    vp = vp * ew
                tl.store(u_at + (LMAX + l) * C, vn, mask=mask)
                tl.store(u_at + (2 * LMAX + l) * C, vp, mask=mask)


@triton.jit
def rotate_in_grad_kernel(gu_ptr, x_ptr, w_ptr, rad_ptr, src_ptr, h_ptr, sw_ptr, ew_ptr,
                          grad_rad_ptr, grad_h_ptr, grad_sw_ptr, grad_ew_ptr, grad_w_ptr, grot_ptr,
                          hid_ptr, lw_ptr, lb_ptr,
                          E, F, rad_se, rad_sf, rad_sr, sw_se, sw_sf, sw_sl,
                          LMAX: tl.constexpr, C: tl.constexpr, CP: tl.constexpr,
                          HAS_SCALAR: tl.constexpr, HAS_EW: tl.constexpr,
                          GRAD_RAD: tl.constexpr, GRAD_SCALAR: tl.constexpr, GRAD_EW: tl.constexpr,
                          GRAD_W: tl.constexpr, GRAD_X: tl.constexpr, BLOCK_E: tl.constexpr,
                          LINEAR: tl.constexpr, H: tl.constexpr, HP: tl.constexpr):
    """``gu (F, E, ROW)`` contiguous.  Writes (each where its flag is set): ``grad_rad (E, F,
    2*lmax + 1, C)``; ``grad_h (E, C)`` and ``grad_sw (E, F, lmax + 1, C)``; ``grad_ew (E,)``;
    ``grad_w (E, 3, S)``; ``grot (E, 3*lmax + 1, C)``; all contiguous.  With ``LINEAR``,
    ``GRAD_RAD`` writes the gradient of the layer's whole output ``(E, F, NRAD, C)`` (the
    scalar weights' rows included) and ``GRAD_SCALAR`` writes ``grad_h`` alone."""
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    NR: tl.constexpr = 2 * LMAX + 1
    NRAD: tl.constexpr = 3 * LMAX + 2 if HAS_SCALAR else 2 * LMAX + 1
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    c = tl.arange(0, CP)
    mask = e_mask[:, None] & (c < C)[None, :]
    x_rows = tl.load(src_ptr + e, mask=e_mask, other=0).to(tl.int64) * (S * C)
    w_rows = e * (3 * S)
    if HAS_EW:
        ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
    if HAS_SCALAR:
        h = tl.load(h_ptr + (e * C)[:, None] + c[None, :], mask=mask, other=0.0)
    ew_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    h_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    if LINEAR:
        j = tl.arange(0, HP)
        hid = tl.load(hid_ptr + (e * H)[:, None] + j[None, :], mask=e_mask[:, None] & (j < H)[None, :], other=0.0)
    else:                                   # unread: weight_row loads the weights instead
        j = 0
        hid = 0.0
    GR_ROWS: tl.constexpr = NRAD if LINEAR else NR
    for l in tl.static_range(LMAX + 1):
        rn, r0, rp = rotate_degree(x_ptr, x_rows, w_ptr, w_rows, c, mask, e_mask, l, C, S)
        gn = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        g0 = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        gp = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        for f in range(F):
            rad_at = rad_ptr + (e * rad_se + f * rad_sf)[:, None] + c[None, :]
            gu_at = gu_ptr + (((e * 0 + f) * E + e) * ROW)[:, None] + c[None, :]
            gr_at = grad_rad_ptr + ((e * F + f) * (GR_ROWS * C))[:, None] + c[None, :]
            d0 = tl.load(gu_at + l * C, mask=mask, other=0.0)
            a0 = weight_row(rad_at, rad_sr, l, hid, lw_ptr, lb_ptr, f, l, c, j, mask, LINEAR, NRAD, C, H)
            if HAS_SCALAR:
                sw_at = sw_ptr + (e * sw_se + f * sw_sf)[:, None] + c[None, :]
                sw = weight_row(sw_at, sw_sl, l, hid, lw_ptr, lb_ptr, f, 2 * LMAX + 1 + l, c, j, mask, LINEAR,
                                NRAD, C, H)
            if GRAD_EW:
                pre = a0 * r0
                if HAS_SCALAR:
                    pre += sw * h
                ew_acc += d0 * pre
            if HAS_EW:
                d0 = d0 * ew
            g0 += d0 * a0
            if GRAD_SCALAR:
                h_acc += d0 * sw
                if not LINEAR:
                    tl.store(grad_sw_ptr + ((e * F + f) * ((LMAX + 1) * C))[:, None] + l * C + c[None, :], d0 * h,
                             mask=mask)
            if GRAD_RAD:
                tl.store(gr_at + l * C, d0 * r0, mask=mask)
                if LINEAR and HAS_SCALAR:
                    tl.store(gr_at + (2 * LMAX + 1 + l) * C, d0 * h, mask=mask)
            if l > 0:
                dn = tl.load(gu_at + (LMAX + l) * C, mask=mask, other=0.0)
                dp = tl.load(gu_at + (2 * LMAX + l) * C, mask=mask, other=0.0)
                a1 = weight_row(rad_at, rad_sr, LMAX + l, hid, lw_ptr, lb_ptr, f, LMAX + l, c, j, mask, LINEAR,
                                NRAD, C, H)
                if GRAD_EW:
                    ew_acc += dn * (a1 * rn) + dp * (a1 * rp)
                if HAS_EW:
                    dn = dn * ew
                    dp = dp * ew
                gn += dn * a1
                gp += dp * a1
                if GRAD_RAD:
                    tl.store(gr_at + (LMAX + l) * C, dn * rn + dp * rp, mask=mask)
        if GRAD_W:
            wigner_grad_degree(x_ptr, x_rows, grad_w_ptr, w_rows, gn, g0, gp, c, mask, e_mask, l, C, S)
        if GRAD_X:
            grot_at = grot_ptr + (e * ROW)[:, None] + c[None, :]
            tl.store(grot_at + l * C, g0, mask=mask)
            if l > 0:
                tl.store(grot_at + (LMAX + l) * C, gn, mask=mask)
                tl.store(grot_at + (2 * LMAX + l) * C, gp, mask=mask)
    if GRAD_SCALAR:
        tl.store(grad_h_ptr + (e * C)[:, None] + c[None, :], h_acc, mask=mask)
    if GRAD_EW:
        tl.store(grad_ew_ptr + e, tl.sum(ew_acc, axis=1), mask=e_mask)
