"""The rotations of an SO(2) convolution, once: into the edge frame, its Wigner gradient, back;
and the pieces every convolution kernel starts from (an edge tile, the channel lanes, a row's
three subtiles of one degree).

Node features are ``(N, S, CW)`` with ``S = (lmax+1)^2`` real-harmonic coefficients (degree
``l`` at rows ``l^2 .. l^2 + 2l``) of ``CW`` channels.  The packed Wigner rows ``W (E, 3, S)``
hold, per edge, the rows ``m = -1, 0, +1`` (``k = 0, 1, 2``) of every degree's real Wigner
matrix ``D^l``: ``W[e, k, l^2 + n] = D^l[m = k - 1, n]``.  Degree 0 has only the row ``k = 1``
(``D^0``, normally 1); its other two rows are never read.

A tile's channel lanes run over all ``CW`` channels of the node features; where those hold one
``C``-wide block per focus stream (``CW = F * C``), lane ``q`` is channel ``q % C`` of stream
``q // C`` (``lanes``), and a kernel reads and writes the stack's rows ``(.., ROW)`` (``ROW =
(3*lmax + 1) * C``, contract §1) of each lane's own stream.  With ``CW = C`` every lane is in
stream 0 and a kernel loops over the streams itself.

Three helpers hold the rotations, each the only copy of its math, shared by every kernel of the
convolution:

- ``rotate_degree``: ``r_k[e, q] = sum_n W[e, k, l^2 + n] * X[row_e, l^2 + n, q]`` for one
  degree ``L`` and the three rows ``k``, ``X`` read at gathered rows (the rotation into the
  edge frame: rotate-in's forward, its recompute in the backward, and rotate-out's backward,
  which rotates the destination atoms' gradients into the edge frame);
- ``wigner_grad_degree``: ``dW[e, k, l^2 + n] = sum_q g_k[e, q] * X[row_e, l^2 + n, q]``,
  the Wigner rows' gradient of that rotation (a sum over the lanes, stored per edge);
- ``back_rotate_acc``: ``acc[n, q] += sum_e sum_k W[e, k, l^2 + n] * v_k[e, q]`` over a block
  of edges (the rotation back, ``D^T``, summed over the edges of one atom: rotate-out's
  forward and rotate-in's node-feature gradient).

Sums over ``n`` run in ascending order; the sum over a block of edges is one ``tl.sum`` whose
shape is fixed per layout (``tuning.configs.conv_config``), so results do not depend on anything
a run can change.  Edge offsets are int64.
"""

import triton
import triton.language as tl


@triton.jit
def lanes(C: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr):
    """``(lane, stream, chan, lane_mask)``, each ``(CP,)``: lane ``q`` is channel ``chan = q % C``
    of stream ``q // C`` among ``CW`` channels (``CP`` the power of two above)."""
    lane = tl.arange(0, CP)
    if CW == C:                             # one stream: no division, a stream index the compiler sees is 0
        return lane, tl.zeros_like(lane), lane, lane < CW
    return lane, lane // C, lane % C, lane < CW


@triton.jit
def edge_tile(E, BLOCK_E: tl.constexpr, CW: tl.constexpr, CP: tl.constexpr, S: tl.constexpr):
    """This program's block of edges: ``(e, e_mask, mask, w_rows)``, ``w_rows`` the int64 element
    offsets of the edges' packed Wigner rows, ``mask`` ``(BLOCK_E, CP)`` over the edges and
    channels.  No pointer comes in: torch's mutation analysis would count a pointer argument of a
    call whose results address a store as written, and a compiled graph would copy it."""
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    mask = e_mask[:, None] & (tl.arange(0, CP) < CW)[None, :]
    return e, e_mask, mask, e * (3 * S)


@triton.jit
def node_rows(index_ptr, e, e_mask, CW: tl.constexpr, S: tl.constexpr):
    """The int64 element offsets of the node rows ``index[e]`` in ``(N, S, CW)`` features."""
    return tl.load(index_ptr + e, mask=e_mask, other=0).to(tl.int64) * (S * CW)


@triton.jit
def load_subtiles(at, L: tl.constexpr, mask, LMAX: tl.constexpr, C: tl.constexpr):
    """``(v_-1, v_0, v_+1)``: degree ``L``'s subtiles of the rows at ``at`` (a ``(BLOCK_E, CP)``
    pointer tile to each row's subtile 0; subtiles ``C`` apart); zeros for ``L = 0``'s |m| = 1."""
    v0 = tl.load(at + L * C, mask=mask, other=0.0)
    if L > 0:
        vn = tl.load(at + (LMAX + L) * C, mask=mask, other=0.0)
        vp = tl.load(at + (2 * LMAX + L) * C, mask=mask, other=0.0)
    else:
        vn = tl.zeros(v0.shape, dtype=tl.float32)
        vp = tl.zeros(v0.shape, dtype=tl.float32)
    return vn, v0, vp


@triton.jit
def store_subtiles(at, L: tl.constexpr, vn, v0, vp, mask, LMAX: tl.constexpr, C: tl.constexpr):
    """Store degree ``L``'s subtiles (as ``load_subtiles`` reads them; ``L = 0``: ``v_0`` only)."""
    tl.store(at + L * C, v0, mask=mask)
    if L > 0:
        tl.store(at + (LMAX + L) * C, vn, mask=mask)
        tl.store(at + (2 * LMAX + L) * C, vp, mask=mask)


@triton.jit
def sum_streams(at, stride, NF, L: tl.constexpr, mask, LMAX: tl.constexpr, C: tl.constexpr):
    """``load_subtiles`` of ``NF`` streams ``stride`` elements apart, summed in stream order."""
    vn = tl.zeros(mask.shape, dtype=tl.float32)
    v0 = tl.zeros(mask.shape, dtype=tl.float32)
    vp = tl.zeros(mask.shape, dtype=tl.float32)
    for f in range(NF):
        an, a0, ap = load_subtiles(at + f * stride, L, mask, LMAX, C)
        v0 += a0
        if L > 0:
            vn += an
            vp += ap
    return vn, v0, vp


@triton.jit
def rotate_degree(x_ptr, x_rows, w_ptr, w_rows, c, mask, e_mask, L: tl.constexpr, C: tl.constexpr,
                  S: tl.constexpr):
    """``(r_-1, r_0, r_+1)``, each ``(BLOCK_E, CP)``: degree ``L`` of the rows ``x_rows`` (int64
    element offsets of the gathered atoms, ``C`` channels) rotated by the Wigner rows at
    ``w_rows`` (int64 offsets ``e * 3 * S``).  At ``L = 0`` the two |m| = 1 results are zero."""
    r0 = tl.zeros(mask.shape, dtype=tl.float32)
    rn = tl.zeros(mask.shape, dtype=tl.float32)
    rp = tl.zeros(mask.shape, dtype=tl.float32)
    for n in tl.static_range(2 * L + 1):
        s = L * L + n
        xv = tl.load(x_ptr + x_rows[:, None] + s * C + c[None, :], mask=mask, other=0.0)
        w0 = tl.load(w_ptr + w_rows + S + s, mask=e_mask, other=0.0)
        r0 += w0[:, None] * xv
        if L > 0:
            wn = tl.load(w_ptr + w_rows + s, mask=e_mask, other=0.0)
            wp = tl.load(w_ptr + w_rows + 2 * S + s, mask=e_mask, other=0.0)
            rn += wn[:, None] * xv
            rp += wp[:, None] * xv
    return rn, r0, rp


@triton.jit
def wigner_grad_degree(x_ptr, x_rows, gw_ptr, w_rows, gn, g0, gp, c, mask, e_mask, L: tl.constexpr,
                       C: tl.constexpr, S: tl.constexpr):
    """Store ``dW[e, k, L^2 + n] = sum_c g_k[e, c] * X[x_rows_e, L^2 + n, c]`` for the three rows
    ``k`` (``gn``, ``g0``, ``gp``: ``(BLOCK_E, CP)``); degree 0's unread rows get zeros."""
    for n in tl.static_range(2 * L + 1):
        s = L * L + n
        xv = tl.load(x_ptr + x_rows[:, None] + s * C + c[None, :], mask=mask, other=0.0)
        tl.store(gw_ptr + w_rows + S + s, tl.sum(g0 * xv, axis=1), mask=e_mask)
        if L > 0:
            tl.store(gw_ptr + w_rows + s, tl.sum(gn * xv, axis=1), mask=e_mask)
            tl.store(gw_ptr + w_rows + 2 * S + s, tl.sum(gp * xv, axis=1), mask=e_mask)
        else:
            zero = tl.zeros(e_mask.shape, dtype=tl.float32)
            tl.store(gw_ptr + w_rows + s, zero, mask=e_mask)
            tl.store(gw_ptr + w_rows + 2 * S + s, zero, mask=e_mask)


@triton.jit
def back_rotate_acc(acc, w_ptr, w_rows, e_mask, vn, v0, vp, L: tl.constexpr, S: tl.constexpr,
                    NP: tl.constexpr):
    """``acc (NP, CP) + sum_e sum_k W[e, k, L^2 + n] * v_k[e, c]`` for ``n < 2L + 1`` (rows
    ``n >= 2L + 1`` of ``acc`` stay as they are): the rotation back of one block of edges,
    summed over the block."""
    npos = tl.arange(0, NP)
    wmask = e_mask[:, None] & (npos < 2 * L + 1)[None, :]
    w_at = w_ptr + w_rows[:, None] + L * L + npos[None, :]
    w0 = tl.load(w_at + S, mask=wmask, other=0.0)
    part = w0[:, :, None] * v0[:, None, :]
    if L > 0:
        wn = tl.load(w_at, mask=wmask, other=0.0)
        wp = tl.load(w_at + 2 * S, mask=wmask, other=0.0)
        part += wn[:, :, None] * vn[:, None, :]
        part += wp[:, :, None] * vp[:, None, :]
    return acc + tl.sum(part, axis=0)


@triton.jit
def edge_weights(ew_ptr, e, e_mask, stream, chan, mask, EW: tl.constexpr, HEADS: tl.constexpr,
                 NG: tl.constexpr, C: tl.constexpr):
    """The edge weights of a tile: ``EW = 1``, one per edge, ``(BLOCK_E, 1)``; ``EW = 2``, one per
    edge, stream and head (``(E, F, HEADS)`` contiguous, ``NG = F * HEADS``; head ``h`` of a
    stream covers its channels ``[h*C/HEADS, (h+1)*C/HEADS)``), ``(BLOCK_E, CP)``."""
    if EW == 1:
        ew = tl.load(ew_ptr + e, mask=e_mask, other=0.0)[:, None]
    else:
        group = stream * HEADS + chan // (C // HEADS)
        ew = tl.load(ew_ptr + (e * NG)[:, None] + group[None, :], mask=mask, other=0.0)
    return ew


@triton.jit
def store_edge_weight_grad(gew_ptr, e, e_mask, acc, stream, chan, EW: tl.constexpr, HEADS: tl.constexpr,
                           NG: tl.constexpr, C: tl.constexpr):
    """The gradient of ``edge_weights`` from the per-lane products ``acc (BLOCK_E, CP)``: summed
    over every lane (``EW = 1``) or over each stream and head's lanes (``EW = 2``)."""
    if EW == 1:
        tl.store(gew_ptr + e, tl.sum(acc, axis=1), mask=e_mask)
    else:
        group = stream * HEADS + chan // (C // HEADS)
        for g in tl.static_range(NG):
            tl.store(gew_ptr + e * NG + g, tl.sum(tl.where((group == g)[None, :], acc, 0.0), axis=1), mask=e_mask)
