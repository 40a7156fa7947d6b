"""Sum rotated-back edge rows at their atoms, one atom per program, in a fixed order: no atomics.

Edges are grouped by atom through CSR offsets ``ptr (N + 1,)``: atom ``a`` owns the positions
``ptr[a] .. ptr[a + 1] - 1`` of the edge order, which is the edge index itself (rotate-out with
edges sorted by destination) or ``order[j]`` (``INDIRECT``: rotate-out's destination order
``conv.layout.EdgeOrder``, rotate-in's backward's source order).  For every degree ``l`` the
program walks its edges in that order, a block of ``BLOCK_E`` at a time (``BLOCK_E`` fixed per
layout, ``tuning.configs.conv_config``: it fixes the order of the sum), and forms

    out[a, l^2 + n, q] = ds[l^2 + n] * sum_e sum_k W[e, k, l^2 + n] * ew[e, q] * v_k[e, l, q]
    v_k[e, l, q]      = sum_f v[e, f, sub(k, l), c]        (f = 0 .. NF-1, in order)

with ``v`` read through its edge and focus strides: rotate-out's forward reads the stack's
result ``(E, F, ROW)`` and sums the focus streams (``CW = C``), or keeps them apart, each in its
channel block of the output (``CW = F * C``, ``NF = 1``: lane ``q`` is channel ``c`` of stream
``q // C``, ``kernels.rotation.lanes``); rotate-in's backward reads ``grot (E, ROW)`` with
``NF = 1``.  ``ew`` (``EW``): none, one per edge, or one per edge, stream and head
(``kernels.rotation.edge_weights``); ``ds`` (``HAS_DS``): a factor per output row, applied in
the store.  ``STORE_VSUM`` also writes the focus sum ``v_k`` (before ``ew``) as ``(E, ROW)``,
what rotate-out's backward reads.  An atom without edges gets zeros.
"""

import triton
import triton.language as tl

from .rotation import back_rotate_acc, edge_weights, lanes, store_subtiles, sum_streams


@triton.jit
def segment_rotate_back_kernel(v_ptr, w_ptr, ew_ptr, ds_ptr, order_ptr, ptr_ptr, out_ptr, vsum_ptr,
                               NF, v_se, v_sf,
                               LMAX: tl.constexpr, C: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr,
                               NP: tl.constexpr, INDIRECT: tl.constexpr, EW: tl.constexpr, HEADS: tl.constexpr,
                               NG: tl.constexpr, HAS_DS: tl.constexpr, STORE_VSUM: tl.constexpr,
                               BLOCK_E: tl.constexpr):
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    a = tl.program_id(0).to(tl.int64)
    start = tl.load(ptr_ptr + a).to(tl.int64)
    end = tl.load(ptr_ptr + a + 1).to(tl.int64)
    lane, stream, chan, lane_mask = lanes(C, CW, CP)
    npos = tl.arange(0, NP)
    for l in tl.static_range(LMAX + 1):
        acc = tl.zeros((NP, CP), dtype=tl.float32)
        for j0 in range(start, end, BLOCK_E):
            j = j0 + tl.arange(0, BLOCK_E).to(tl.int64)
            e_mask = j < end
            if INDIRECT:
                e = tl.load(order_ptr + j, mask=e_mask, other=0).to(tl.int64)
            else:
                e = j
            mask = e_mask[:, None] & lane_mask[None, :]
            v_at = v_ptr + (e * v_se)[:, None] + (stream * v_sf + chan)[None, :]
            vn, v0, vp = sum_streams(v_at, v_sf, NF, l, mask, LMAX, C)
            if STORE_VSUM:
                store_subtiles(vsum_ptr + (e * ROW)[:, None] + lane[None, :], l, vn, v0, vp, mask, LMAX, C)
            if EW > 0:
                ew = edge_weights(ew_ptr, e, e_mask, stream, chan, mask, EW, HEADS, NG, C)
                vn = vn * ew
                v0 = v0 * ew
                vp = vp * ew
            acc = back_rotate_acc(acc, w_ptr, e * (3 * S), e_mask, vn, v0, vp, l, S, NP)
        if HAS_DS:
            acc = acc * tl.load(ds_ptr + l * l + npos, mask=npos < 2 * l + 1, other=0.0)[:, None]
        out_mask = (npos < 2 * l + 1)[:, None] & lane_mask[None, :]
        tl.store(out_ptr + (a * S + l * l + npos)[:, None] * CW + lane[None, :], acc, mask=out_mask)
