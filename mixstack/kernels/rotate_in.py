"""Rotate-in: gather the source atoms' features, rotate them into each edge's frame, scale them
by the radial weights, mix their degrees, and write the stack's input ``u (F, E, ROW)``; and its
backward.

Per edge ``e`` (source atom ``src[e]``), focus stream ``f``, degree ``l`` and row ``k`` of the
packed Wigner rows (``kernels.rotation``), channel ``c`` of the stream read at lane ``q`` of
``x`` (``q = c`` when every stream reads all of ``x``; ``q = f*C + c`` when ``x`` holds one
channel block per stream, ``kernels.rotation.lanes``):

    rot_k[e, l, q] = sum_n W[e, k, l^2 + n] * x[src[e], l^2 + n, q]
    v[f, e, sub(k, l), c] = ew[e] * (rad[e, f, r(k, l), c] * rot_k[e, l, q]
                                     + [k = 1] * sw[e, f, l, c] * h[e, c])
    u = v, or with a degree mix, within each order block b (m = 0: degrees 0..lmax, kernel
        rows from 0; m = -1 and m = +1: degrees 1..lmax, one kernel for both, rows from
        (lmax+1)^2; n_b degrees):
    u[f, e, sub(b, o), c] = sum_i Wm[e, first(b) + i*n_b + o, q] * v[f, e, sub(b, i), c]
    Wm[e, k, q] = kernel[e, k, 0] (MIX 1) | kernel[e, k, q] (MIX 2) | sum_r kernel[e, k, r] basis[r, q] (MIX 3)

with ``sub(1, l) = l``, ``sub(0, l) = lmax + l``, ``sub(2, l) = 2*lmax + l`` (the stack's row
layout, docs/contract.md §1) and ``r(1, l) = l``, ``r(0, l) = r(2, l) = lmax + l`` (one radial
weight per degree scales m = -1 and m = +1 alike, which keeps the convolution equivariant), or
``r(k, l) = l`` with per-degree radial weights (``RAD_DEG``); without radial weights
(``HAS_RAD`` off) ``rad = 1``.  ``h (E, C)`` (optional) is an invariant edge scalar, added to the
m = 0 subtile of every degree with its own weights ``sw (E, F, lmax + 1, C)``; ``ew`` (optional)
scales the whole row.  ``rad`` and ``sw`` are read through their strides (views of a wider
radial network output need no copy).  The mix sums its degrees ``i`` in ascending order, and a
rank-``R`` weight its ranks ``r`` in ascending order.

With ``LINEAR`` the radial weights are not read but made per tile from a linear layer,
``rad[e, f, r, c] = sum_j hid[e, j] * lw[f, r, c, j] + lb[f, r, c]`` (``linear_row``, one
``tl.dot`` a row; the rows ``2*lmax + 1 + l`` are the edge scalar's weights ``sw``), so the
``(E, F, rows, C)`` weights are never read or kept; the backward makes them again the same way
and writes their gradient, all rows of it, for the launcher's one product with the layer's
weight (the hidden layer's gradient).

``rotate_in_grad_kernel`` is the edge-parallel part of the backward: the gradients of the
radial weights, the edge scalar and its weights, the edge weights, the degree mix's kernel and
the Wigner rows, and the gradient of the rotated features ``grot (E, 3*lmax + 1, CW)`` (in the
row's subtile order), from which ``segment_sum.segment_rotate_back_kernel`` forms the node
features' gradient over the edges grouped by source atom, in a fixed order.
"""

import triton
import triton.language as tl

from .rotation import edge_tile, lanes, node_rows, rotate_degree, store_subtiles, wigner_grad_degree

# The linear radial layer's products run on tensor cores as three TF32 products (a split of
# each float32 operand into a TF32 head and tail; the tail x tail product is dropped): about
# 2^-21 relative per product against float32's 2^-24.  Exact fp32 FMA products ("ieee") made
# the bench model's rotate-in several times slower than reading the weights whole
# (BENCHMARKS.md, "The glue on kernels").
RADIAL_PRECISION: tl.constexpr = tl.constexpr("tf32x3")


@triton.jit
def linear_row(hid, lw_ptr, lb_ptr, fs, r, chan, lane_mask, j, NRAD: tl.constexpr, C: tl.constexpr,
               H: tl.constexpr):
    """Row ``r`` of a linear layer's output for each lane's stream ``fs (CP,)``, ``(BLOCK_E, CP)``:
    ``hid (BLOCK_E, HP) @ lw[fs, r]^T + lb[fs, r]`` (``lw (F, NRAD, C, H)``, ``lb (F, NRAD, C)``
    contiguous), the products at ``RADIAL_PRECISION``, summed over ``j`` in the dot's fixed order."""
    base = (fs * NRAD + r) * C + chan
    wt = tl.load(lw_ptr + base[None, :] * H + j[:, None], mask=(j < H)[:, None] & lane_mask[None, :], other=0.0)
    b = tl.load(lb_ptr + base, mask=lane_mask, other=0.0)
    return tl.dot(hid, wt, input_precision=RADIAL_PRECISION) + b[None, :]


@triton.jit
def weight_row(at, stride, row, hid, lw_ptr, lb_ptr, fs, made_row, chan, lane_mask, j, mask, LINEAR: tl.constexpr,
               NRAD: tl.constexpr, C: tl.constexpr, H: tl.constexpr):
    """One row of weights, ``(BLOCK_E, CP)``: read at ``at + row * stride`` or, with ``LINEAR``,
    made by ``linear_row`` as the layer's row ``made_row``."""
    if LINEAR:
        return linear_row(hid, lw_ptr, lb_ptr, fs, made_row, chan, lane_mask, j, NRAD, C, H)
    return tl.load(at + row * stride, mask=mask, other=0.0)


@triton.jit
def m0_weights(rad_at, rad_sr, sw_at, sw_sl, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask,
               L: tl.constexpr, LMAX: tl.constexpr, C: tl.constexpr, H: tl.constexpr, NRAD: tl.constexpr,
               HAS_RAD: tl.constexpr, HAS_SCALAR: tl.constexpr, LINEAR: tl.constexpr):
    """``(a0, sw)``: degree ``L``'s radial weight of its m = 0 row and the edge scalar's weight;
    ``1.0`` / ``0.0`` where absent (then never used)."""
    a0 = 1.0
    sw = 0.0
    if HAS_RAD:
        a0 = weight_row(rad_at, rad_sr, L, hid, lw_ptr, lb_ptr, fs, L, chan, lane_mask, j, mask, LINEAR, NRAD, C, H)
    if HAS_SCALAR:
        sw = weight_row(sw_at, sw_sl, L, hid, lw_ptr, lb_ptr, fs, 2 * LMAX + 1 + L, chan, lane_mask, j, mask,
                        LINEAR, NRAD, C, H)
    return a0, sw


@triton.jit
def pair_weight(rad_at, rad_sr, a0, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask, L: tl.constexpr,
                LMAX: tl.constexpr, C: tl.constexpr, H: tl.constexpr, NRAD: tl.constexpr, HAS_RAD: tl.constexpr,
                RAD_DEG: tl.constexpr, LINEAR: tl.constexpr):
    """The radial weight of degree ``L``'s |m| = 1 pair (``L > 0``): row ``LMAX + L``, or ``a0``
    with per-degree weights (``RAD_DEG``); ``1.0`` without radial weights.  Made after the m = 0
    part where the backward needs it, so the two are not live together."""
    a1 = 1.0
    if HAS_RAD:
        if RAD_DEG:
            a1 = a0
        else:
            a1 = weight_row(rad_at, rad_sr, LMAX + L, hid, lw_ptr, lb_ptr, fs, LMAX + L, chan, lane_mask, j, mask,
                            LINEAR, NRAD, C, H)
    return a1


@triton.jit
def pre_m0(r0, a0, sw, h, HAS_RAD: tl.constexpr, HAS_SCALAR: tl.constexpr):
    """The m = 0 subtile before the edge weight: ``a0 * r0 (+ sw * h)``."""
    v0 = r0
    if HAS_RAD:
        v0 = a0 * r0
    if HAS_SCALAR:
        v0 += sw * h
    return v0


@triton.jit
def pre_pair(rn, rp, a1, HAS_RAD: tl.constexpr):
    """The |m| = 1 subtiles before the edge weight: ``a1 * r_-1``, ``a1 * r_+1``."""
    if HAS_RAD:
        return a1 * rn, a1 * rp
    return rn, rp


@triton.jit
def edge_inputs(ew_ptr, h_ptr, hid_ptr, e, e_mask, mask, lane, HAS_EW: tl.constexpr, HAS_SCALAR: tl.constexpr,
                LINEAR: tl.constexpr, C: tl.constexpr, H: tl.constexpr, HP: tl.constexpr):
    """``(ew (BLOCK_E, 1), h (BLOCK_E, CP), hid (BLOCK_E, HP), j)``: the edge weight, the edge scalar,
    the linear layer's input and its lanes; ``0`` where absent."""
    ew = 0.0
    h = 0.0
    hid = 0.0
    j = 0
    if HAS_EW:
        ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
    if HAS_SCALAR:
        h = tl.load(h_ptr + (e * C)[:, None] + lane[None, :], mask=mask, other=0.0)
    if LINEAR:
        j = tl.arange(0, HP)
        hid = tl.load(hid_ptr + (e * H)[:, None] + j[None, :], mask=e_mask[:, None] & (j < H)[None, :], other=0.0)
    return ew, h, hid, j


@triton.jit
def stack_rows(e, E, fs, chan, ROW: tl.constexpr):
    """``(BLOCK_E, CP)`` int64 offsets of subtile 0 of each lane's row in ``(F, E, ROW)``."""
    return (fs.to(tl.int64)[None, :] * E + e[:, None]) * ROW + chan[None, :]


@triton.jit
def block_at(ptr, base, mask, FIRST: tl.constexpr, N: tl.constexpr, NB: tl.constexpr, C: tl.constexpr):
    """``(pointers, mask)`` of the ``(BLOCK_E, NB, CP)`` tile of the subtiles ``FIRST .. FIRST+N-1``
    of the rows at ``base`` (an order block of the stack's row)."""
    o = tl.arange(0, NB)
    return ptr + base[:, None, :] + ((FIRST + o) * C)[None, :, None], mask[:, None, :] & (o < N)[None, :, None]


@triton.jit
def mix_weights(mk_ptr, mb_ptr, e, e_mask, lane, lane_mask, FIRST: tl.constexpr, N: tl.constexpr,
                NB: tl.constexpr, K: tl.constexpr, CW: tl.constexpr, MIX: tl.constexpr, R: tl.constexpr):
    """``Wm[e, FIRST + o, q]`` for ``o < N`` (one input degree's row of an order block's mix):
    ``(BLOCK_E, NB, CP)``, or ``(BLOCK_E, NB, 1)`` for one kernel for every lane (``MIX = 1``)."""
    o = tl.arange(0, NB)
    kmask = e_mask[:, None] & (o < N)[None, :]
    rows = e[:, None] * K + FIRST + o[None, :]
    if MIX == 1:
        w = tl.load(mk_ptr + rows, mask=kmask, other=0.0)[:, :, None]
    elif MIX == 2:
        w = tl.load(mk_ptr + rows[:, :, None] * CW + lane[None, None, :],
                    mask=kmask[:, :, None] & lane_mask[None, None, :], other=0.0)
    else:
        w = tl.zeros((e.shape[0], NB, lane.shape[0]), dtype=tl.float32)
        for r in tl.static_range(R):
            kr = tl.load(mk_ptr + rows * R + r, mask=kmask, other=0.0)
            br = tl.load(mb_ptr + r * CW + lane, mask=lane_mask, other=0.0)
            w += kr[:, :, None] * br[None, None, :]
    return w


@triton.jit
def store_mix_grad(mkg_ptr, mb_ptr, g, e, e_mask, lane, lane_mask, FIRST: tl.constexpr, N: tl.constexpr,
                   NB: tl.constexpr, K: tl.constexpr, CW: tl.constexpr, MIX: tl.constexpr, R: tl.constexpr):
    """Store the gradient of ``mix_weights``' kernel rows from ``g = dL/dWm (BLOCK_E, NB, CP)``:
    summed over the lanes (``MIX = 1``), as it is (``MIX = 2``), or against each basis row."""
    o = tl.arange(0, NB)
    kmask = e_mask[:, None] & (o < N)[None, :]
    rows = e[:, None] * K + FIRST + o[None, :]
    if MIX == 1:
        tl.store(mkg_ptr + rows, tl.sum(g, axis=2), mask=kmask)
    elif MIX == 2:
        tl.store(mkg_ptr + rows[:, :, None] * CW + lane[None, None, :], g,
                 mask=kmask[:, :, None] & lane_mask[None, None, :])
    else:
        for r in tl.static_range(R):
            br = tl.load(mb_ptr + r * CW + lane, mask=lane_mask, other=0.0)
            tl.store(mkg_ptr + rows * R + r, tl.sum(g * br[None, None, :], axis=2), mask=kmask)


@triton.jit
def rotate_in_kernel(x_ptr, w_ptr, rad_ptr, src_ptr, h_ptr, sw_ptr, ew_ptr, u_ptr, hid_ptr, lw_ptr, lb_ptr,
                     mk_ptr, mb_ptr, E, NF, rad_se, rad_sf, rad_sr, sw_se, sw_sf, sw_sl,
                     LMAX: tl.constexpr, C: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr,
                     HAS_RAD: tl.constexpr, RAD_DEG: tl.constexpr, HAS_SCALAR: tl.constexpr,
                     HAS_EW: tl.constexpr, BLOCK_E: tl.constexpr, LINEAR: tl.constexpr, H: tl.constexpr,
                     HP: tl.constexpr, MIX: tl.constexpr, MIX_R: tl.constexpr, NB0: tl.constexpr,
                     NB1: tl.constexpr):
    """``u (F, E, ROW)`` contiguous.  ``NF`` streams loop over a tile whose lanes are all in
    stream 0 (``CW = C``); ``NF = 1`` when the lanes carry the streams, as a mix needs."""
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    NRAD: tl.constexpr = 3 * LMAX + 2 if HAS_SCALAR else 2 * LMAX + 1
    N0: tl.constexpr = LMAX + 1
    K: tl.constexpr = N0 * N0 + LMAX * LMAX
    e, e_mask, mask, w_rows = edge_tile(E, BLOCK_E, CW, CP, S)
    x_rows = node_rows(src_ptr, e, e_mask, CW, S)
    lane, stream, chan, lane_mask = lanes(C, CW, CP)
    ew, h, hid, j = edge_inputs(ew_ptr, h_ptr, hid_ptr, e, e_mask, mask, lane, HAS_EW, HAS_SCALAR, LINEAR, C, H, HP)
    if MIX > 0:
        acc0 = tl.zeros((BLOCK_E, NB0, CP), dtype=tl.float32)
        accn = tl.zeros((BLOCK_E, NB1, CP), dtype=tl.float32)
        accp = tl.zeros((BLOCK_E, NB1, CP), dtype=tl.float32)
    for l in tl.static_range(LMAX + 1):
        rn, r0, rp = rotate_degree(x_ptr, x_rows, w_ptr, w_rows, lane, mask, e_mask, l, CW, S)
        for f in range(NF):
            fs = f + stream
            rad_at = rad_ptr + (e * rad_se)[:, None] + (fs * rad_sf + chan)[None, :]
            sw_at = sw_ptr + (e * sw_se)[:, None] + (fs * sw_sf + chan)[None, :]
            a0, sw = m0_weights(rad_at, rad_sr, sw_at, sw_sl, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask, l,
                                LMAX, C, H, NRAD, HAS_RAD, HAS_SCALAR, LINEAR)
            v0 = pre_m0(r0, a0, sw, h, HAS_RAD, HAS_SCALAR)
            vn = rn
            vp = rp
            if l > 0:
                a1 = pair_weight(rad_at, rad_sr, a0, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask, l, LMAX, C,
                                 H, NRAD, HAS_RAD, RAD_DEG, LINEAR)
                vn, vp = pre_pair(rn, rp, a1, HAS_RAD)
            if HAS_EW:
                v0 = v0 * ew
                vn = vn * ew
                vp = vp * ew
            if MIX > 0:
                acc0 += mix_weights(mk_ptr, mb_ptr, e, e_mask, lane, lane_mask, l * N0, N0, NB0, K, CW, MIX,
                                    MIX_R) * v0[:, None, :]
                if l > 0:
                    wm = mix_weights(mk_ptr, mb_ptr, e, e_mask, lane, lane_mask, N0 * N0 + (l - 1) * LMAX, LMAX,
                                     NB1, K, CW, MIX, MIX_R)
                    accn += wm * vn[:, None, :]
                    accp += wm * vp[:, None, :]
            else:
                store_subtiles(u_ptr + stack_rows(e, E, fs, chan, ROW), l, vn, v0, vp, mask, LMAX, C)
    if MIX > 0:
        base = stack_rows(e, E, stream, chan, ROW)
        at, m3 = block_at(u_ptr, base, mask, 0, N0, NB0, C)
        tl.store(at, acc0, mask=m3)
        at, m3 = block_at(u_ptr, base, mask, N0, LMAX, NB1, C)
        tl.store(at, accn, mask=m3)
        at, m3 = block_at(u_ptr, base, mask, N0 + LMAX, LMAX, NB1, C)
        tl.store(at, accp, mask=m3)


@triton.jit
def rotate_in_grad_kernel(gu_ptr, x_ptr, w_ptr, rad_ptr, src_ptr, h_ptr, sw_ptr, ew_ptr,
                          grad_rad_ptr, grad_h_ptr, grad_sw_ptr, grad_ew_ptr, grad_w_ptr, grot_ptr,
                          hid_ptr, lw_ptr, lb_ptr, mk_ptr, mb_ptr, grad_mk_ptr,
                          E, NF, rad_se, rad_sf, rad_sr, sw_se, sw_sf, sw_sl,
                          LMAX: tl.constexpr, C: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr,
                          HAS_RAD: tl.constexpr, RAD_DEG: tl.constexpr,
                          HAS_SCALAR: tl.constexpr, HAS_EW: tl.constexpr,
                          GRAD_RAD: tl.constexpr, GRAD_SCALAR: tl.constexpr, GRAD_EW: tl.constexpr,
                          GRAD_W: tl.constexpr, GRAD_X: tl.constexpr, BLOCK_E: tl.constexpr,
                          LINEAR: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
                          MIX: tl.constexpr, MIX_R: tl.constexpr, NB0: tl.constexpr, NB1: tl.constexpr,
                          GRAD_MIX: tl.constexpr):
    """``gu (F, E, ROW)`` contiguous.  Writes (each where its flag is set): ``grad_rad (E, F,
    rows, C)`` (``2*lmax + 1`` rows, or ``lmax + 1`` with ``RAD_DEG``); ``grad_h (E, C)`` and
    ``grad_sw (E, F, lmax + 1, C)``; ``grad_ew (E,)``; ``grad_w (E, 3, S)``; ``grot (E, 3*lmax + 1,
    CW)``; ``grad_mk`` (the mix's kernel, its shape); all contiguous.  With ``LINEAR``,
    ``GRAD_RAD`` writes the gradient of the layer's whole output ``(E, F, NRAD, C)`` (the
    scalar weights' rows included) and ``GRAD_SCALAR`` writes ``grad_h`` alone."""
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    NRAD: tl.constexpr = 3 * LMAX + 2 if HAS_SCALAR else 2 * LMAX + 1
    GR_ROWS: tl.constexpr = NRAD if LINEAR else (LMAX + 1 if RAD_DEG else 2 * LMAX + 1)
    N0: tl.constexpr = LMAX + 1
    K: tl.constexpr = N0 * N0 + LMAX * LMAX
    NS = NF * (CW // C)                     # the streams: looped over, or carried by the lanes
    e, e_mask, mask, w_rows = edge_tile(E, BLOCK_E, CW, CP, S)
    x_rows = node_rows(src_ptr, e, e_mask, CW, S)
    lane, stream, chan, lane_mask = lanes(C, CW, CP)
    ew, h, hid, j = edge_inputs(ew_ptr, h_ptr, hid_ptr, e, e_mask, mask, lane, HAS_EW, HAS_SCALAR, LINEAR, C, H, HP)
    ew_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    h_acc = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
    if MIX > 0:                             # the mixed rows' gradient, an order block at a time
        base = stack_rows(e, E, stream, chan, ROW)
        at, m3 = block_at(gu_ptr, base, mask, 0, N0, NB0, C)
        gm0 = tl.load(at, mask=m3, other=0.0)
        at, m3 = block_at(gu_ptr, base, mask, N0, LMAX, NB1, C)
        gmn = tl.load(at, mask=m3, other=0.0)
        at, m3 = block_at(gu_ptr, base, mask, N0 + LMAX, LMAX, NB1, C)
        gmp = tl.load(at, mask=m3, other=0.0)
    for l in tl.static_range(LMAX + 1):
        rn, r0, rp = rotate_degree(x_ptr, x_rows, w_ptr, w_rows, lane, mask, e_mask, l, CW, S)
        gn = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        g0 = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        gp = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
        for f in range(NF):
            fs = f + stream
            rows = stack_rows(e, E, fs, chan, ROW)
            if MIX > 0:                     # the gradient before the mix: Wm^T times the mixed one
                d0 = tl.sum(mix_weights(mk_ptr, mb_ptr, e, e_mask, lane, lane_mask, l * N0, N0, NB0, K, CW, MIX,
                                        MIX_R) * gm0, axis=1)
            else:
                d0 = tl.load(gu_ptr + rows + l * C, mask=mask, other=0.0)
            rad_at = rad_ptr + (e * rad_se)[:, None] + (fs * rad_sf + chan)[None, :]
            sw_at = sw_ptr + (e * sw_se)[:, None] + (fs * sw_sf + chan)[None, :]
            gr_at = grad_rad_ptr + ((e * NS)[:, None] + fs[None, :]) * (GR_ROWS * C) + chan[None, :]
            a0, sw = m0_weights(rad_at, rad_sr, sw_at, sw_sl, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask, l,
                                LMAX, C, H, NRAD, HAS_RAD, HAS_SCALAR, LINEAR)
            # the m = 0 subtile
            if GRAD_EW or GRAD_MIX:
                p0 = pre_m0(r0, a0, sw, h, HAS_RAD, HAS_SCALAR)
            if GRAD_EW:
                ew_acc += d0 * p0
            if GRAD_MIX:
                if HAS_EW:
                    p0 = p0 * ew
                store_mix_grad(grad_mk_ptr, mb_ptr, p0[:, None, :] * gm0, e, e_mask, lane, lane_mask, l * N0, N0,
                               NB0, K, CW, MIX, MIX_R)
            if HAS_EW:
                d0 = d0 * ew
            if HAS_RAD:
                g0 += d0 * a0
            else:
                g0 += d0
            if GRAD_SCALAR:
                h_acc += d0 * sw
                if not LINEAR:
                    tl.store(grad_sw_ptr + ((e * NS)[:, None] + fs[None, :]) * ((LMAX + 1) * C) + l * C
                             + chan[None, :], d0 * h, mask=mask)
            if GRAD_RAD:
                if LINEAR and HAS_SCALAR:
                    tl.store(gr_at + (2 * LMAX + 1 + l) * C, d0 * h, mask=mask)
                if l == 0 or not RAD_DEG:
                    tl.store(gr_at + l * C, d0 * r0, mask=mask)
            # the |m| = 1 pair
            if l > 0:
                if MIX > 0:
                    wm = mix_weights(mk_ptr, mb_ptr, e, e_mask, lane, lane_mask, N0 * N0 + (l - 1) * LMAX, LMAX,
                                     NB1, K, CW, MIX, MIX_R)
                    dn = tl.sum(wm * gmn, axis=1)
                    dp = tl.sum(wm * gmp, axis=1)
                else:
                    dn = tl.load(gu_ptr + rows + (LMAX + l) * C, mask=mask, other=0.0)
                    dp = tl.load(gu_ptr + rows + (2 * LMAX + l) * C, mask=mask, other=0.0)
                a1 = pair_weight(rad_at, rad_sr, a0, hid, lw_ptr, lb_ptr, fs, chan, lane_mask, j, mask, l, LMAX, C,
                                 H, NRAD, HAS_RAD, RAD_DEG, LINEAR)
                if GRAD_EW or GRAD_MIX:
                    pn, pp = pre_pair(rn, rp, a1, HAS_RAD)
                if GRAD_EW:
                    ew_acc += dn * pn + dp * pp
                if GRAD_MIX:
                    if HAS_EW:
                        pn = pn * ew
                        pp = pp * ew
                    store_mix_grad(grad_mk_ptr, mb_ptr, pn[:, None, :] * gmn + pp[:, None, :] * gmp, e, e_mask,
                                   lane, lane_mask, N0 * N0 + (l - 1) * LMAX, LMAX, NB1, K, CW, MIX, MIX_R)
                if HAS_EW:
                    dn = dn * ew
                    dp = dp * ew
                if GRAD_RAD:
                    if RAD_DEG:
                        tl.store(gr_at + l * C, d0 * r0 + (dn * rn + dp * rp), mask=mask)
                    else:
                        tl.store(gr_at + (LMAX + l) * C, dn * rn + dp * rp, mask=mask)
                if HAS_RAD:
                    gn += dn * a1
                    gp += dp * a1
                else:
                    gn += dn
                    gp += dp
        if GRAD_W:
            wigner_grad_degree(x_ptr, x_rows, grad_w_ptr, w_rows, gn, g0, gp, lane, mask, e_mask, l, CW, S)
        if GRAD_X:
            store_subtiles(grot_ptr + (e * (3 * LMAX + 1) * CW)[:, None] + lane[None, :], l, gn, g0, gp, mask,
                           LMAX, CW)
    if GRAD_SCALAR:
        tl.store(grad_h_ptr + (e * C)[:, None] + lane[None, :], h_acc, mask=mask)
    if GRAD_EW:
        tl.store(grad_ew_ptr + e, tl.sum(ew_acc, axis=1), mask=e_mask)
