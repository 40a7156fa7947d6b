"""The rotations of an SO(2) convolution, once: into the edge frame, its Wigner gradient, and back.

Node features are ``(N, S, C)`` with ``S = (lmax+1)^2`` real-harmonic coefficients (degree
``l`` at rows ``l^2 .. l^2 + 2l``) of ``C`` channels.  The packed Wigner rows ``W (E, 3, S)``
hold, per edge, the rows ``m = -1, 0, +1`` (``k = 0, 1, 2``) of every degree's real Wigner
matrix ``D^l``: ``W[e, k, l^2 + n] = D^l[m = k - 1, n]``.  Degree 0 has only the row ``k = 1``
(``D^0``, normally 1); its other two rows are never read.

Three helpers, each the only copy of its math, shared by every kernel of the convolution:

- ``rotate_degree``: ``r_k[e, c] = sum_n W[e, k, l^2 + n] * X[row_e, l^2 + n, c]`` for one
  degree ``L`` and the three rows ``k``, ``X`` read at gathered rows (the rotation into the
  edge frame: rotate-in's forward, its recompute in the backward, and rotate-out's backward,
  which rotates the destination atoms' gradients into the edge frame);
- ``wigner_grad_degree``: ``dW[e, k, l^2 + n] = sum_c g_k[e, c] * X[row_e, l^2 + n, c]``,
  the Wigner rows' gradient of that rotation (a sum over the channels, stored per edge);
- ``back_rotate_acc``: ``acc[n, c] += sum_e sum_k W[e, k, l^2 + n] * v_k[e, c]`` over a block
  of edges (the rotation back, ``D^T``, summed over the edges of one atom: rotate-out's
  forward and rotate-in's node-feature gradient).

Sums over ``n`` run in ascending order; the sum over a block of edges is one ``tl.sum`` whose
shape is fixed per layout (``tuning.configs.conv_config``), so results do not depend on anything
a run can change.  Edge offsets are int64.
"""

import triton
import triton.language as tl


@triton.jit
def rotate_degree(x_ptr, x_rows, w_ptr, w_rows, c, mask, e_mask, L: tl.constexpr, C: tl.constexpr,
                  S: tl.constexpr):
    """``(r_-1, r_0, r_+1)``, each ``(BLOCK_E, CP)``: degree ``L`` of the rows ``x_rows`` (int64
    element offsets of the gathered atoms) rotated by the Wigner rows at ``w_rows`` (int64 offsets
    ``e * 3 * S``).  At ``L = 0`` the two |m| = 1 results are zero."""
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
