"""The alpha gradient: ``grad_alpha[e, f] = sum_c g[e, f, c] * y[e, f, c]``.

``y`` is the unscaled result the forward saved (contiguous); ``g`` is read
through its strides along E and F (``g_se``, ``g_sf``; F's is 0 when the
caller summed the focus streams, and no copy of that broadcast is made).  (Recovering it as
``out / alpha`` would save that surface but turn a zero alpha into a NaN
gradient.)  One program reduces whole rows in a fixed column order: no
atomics, the same bits on every run.

With ``WRITE_AMAX`` (level 3) it also records, per row and GEMM block, the
largest magnitude of ``g * alpha``: the operand of the backward's first
compensated GEMM, which then skips its pre-pass (``compensated.row_amax``).
"""

import triton
import triton.language as tl

from .compensated import row_amax


@triton.jit
def alpha_grad_kernel(
    g_ptr, y_ptr, grad_alpha_ptr, alpha_ptr, amax_ptr, n_rows, F, g_se, g_sf,
    ROW: tl.constexpr, M0: tl.constexpr, WRITE_AMAX: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    r_mask = r < n_rows
    g_rows = (r // F) * g_se + (r % F) * g_sf
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    if WRITE_AMAX:
        alpha = tl.load(alpha_ptr + r, mask=r_mask, other=0.0)
        amax0 = tl.zeros((BLOCK_R,), dtype=tl.float32)
        amax1 = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in tl.range(0, ROW, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = r_mask[:, None] & (c < ROW)[None, :]
        g = tl.load(g_ptr + g_rows[:, None] + c[None, :], mask=mask, other=0.0)
        y = tl.load(y_ptr + r[:, None] * ROW + c[None, :], mask=mask, other=0.0)
        acc += g * y
        if WRITE_AMAX:
            a = g * alpha[:, None]
            amax0 = tl.maximum(amax0, row_amax(a, mask & (c < M0)[None, :]))
            amax1 = tl.maximum(amax1, row_amax(a, mask & (c >= M0)[None, :]))
    tl.store(grad_alpha_ptr + r, tl.sum(acc, axis=1), mask=r_mask)
    if WRITE_AMAX:      # rows r = e * F + f; the maxima are focus-major, (F, E, 2)
        n_edges = n_rows // F
        amax_rows = ((r % F) * n_edges + r // F) * 2
        tl.store(amax_ptr + amax_rows, amax0, mask=r_mask)
        tl.store(amax_ptr + amax_rows + 1, amax1, mask=r_mask)
