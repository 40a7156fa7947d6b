"""Sum rotated-back edge rows at their atoms, one atom per program, in a fixed order: no atomics.

Edges are grouped by atom through CSR offsets ``ptr (N + 1,)``: atom ``a`` owns the positions
``ptr[a] .. ptr[a + 1] - 1`` of the edge order, which is the edge index itself (rotate-out:
edges sorted by destination) or ``order[j]`` (``INDIRECT``; rotate-in's backward: edges sorted
by source).  For every degree ``l`` the program walks its edges in that order, a block of
``BLOCK_E`` at a time (``BLOCK_E`` fixed per layout, ``tuning.configs.conv_config``: it fixes the
order of the sum), and forms

    out[a, l^2 + n, c] = sum_e ew[e] * sum_k W[e, k, l^2 + n] * v_k[e, l, c]
    v_k[e, l, c]      = sum_f v[e, f, sub(k, l), c]        (f = 0 .. F-1, in order)

with ``v`` read through its edge and focus strides: rotate-out's forward reads the stack's
result ``(E, F, ROW)`` and sums the focus streams; rotate-in's backward reads ``grot (E, ROW)``
with ``F = 1``.  ``STORE_VSUM`` also writes the focus sum ``v_k`` (before ``ew``) as ``(E, ROW)``,
what rotate-out's backward reads.  An atom without edges gets zeros.
"""

import triton
import triton.language as tl

from .rotation import back_rotate_acc


@triton.jit
def segment_rotate_back_kernel(v_ptr, w_ptr, ew_ptr, order_ptr, ptr_ptr, out_ptr, vsum_ptr,
                               F, v_se, v_sf,
                               LMAX: tl.constexpr, C: tl.constexpr, CP: tl.constexpr, NP: tl.constexpr,
                               INDIRECT: tl.constexpr, HAS_EW: tl.constexpr, STORE_VSUM: tl.constexpr,
                               BLOCK_E: tl.constexpr):
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    ROW: tl.constexpr = (3 * LMAX + 1) * C
    a = tl.program_id(0).to(tl.int64)
    start = tl.load(ptr_ptr + a).to(tl.int64)
    end = tl.load(ptr_ptr + a + 1).to(tl.int64)
    c = tl.arange(0, CP)
    c_mask = c < C
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
            mask = e_mask[:, None] & c_mask[None, :]
            vn = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            v0 = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            vp = tl.zeros((BLOCK_E, CP), dtype=tl.float32)
            for f in range(F):
                v_at = v_ptr + (e * v_se + f * v_sf)[:, None] + c[None, :]
                v0 += tl.load(v_at + l * C, mask=mask, other=0.0)
                if l > 0:
                    vn += tl.load(v_at + (LMAX + l) * C, mask=mask, other=0.0)
                    vp += tl.load(v_at + (2 * LMAX + l) * C, mask=mask, other=0.0)
            if STORE_VSUM:
                s_at = vsum_ptr + (e * ROW)[:, None] + c[None, :]
                tl.store(s_at + l * C, v0, mask=mask)
                if l > 0:
                    tl.store(s_at + (LMAX + l) * C, vn, mask=mask)
                    tl.store(s_at + (2 * LMAX + l) * C, vp, mask=mask)
            if HAS_EW:
                ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
                vn = vn * ew
                v0 = v0 * ew
                vp = vp * ew
            acc = back_rotate_acc(acc, w_ptr, e * (3 * S), e_mask, vn, v0, vp, l, S, NP)
        out_mask = (npos < 2 * l + 1)[:, None] & c_mask[None, :]
        tl.store(out_ptr + (a * S + l * l + npos)[:, None] * C + c[None, :], acc, mask=out_mask)
