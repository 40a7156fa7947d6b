"""The alpha gradient: ``grad_alpha[e, f] = sum_c g[e, f, c] * y[e, f, c]``.

``y`` is the unscaled result the forward saved (contiguous); ``g`` is read
through its strides along E and F (``g_se``, ``g_sf``; F's is 0 when the
caller summed the focus streams, and no copy of that broadcast is made).  (Recovering it as
``out / alpha`` would save that surface but turn a zero alpha into a NaN
gradient.)  One program reduces whole rows in a fixed column order: no
atomics, the same bits on every run.
"""

import triton
import triton.language as tl


@triton.jit
def alpha_grad_kernel(
    g_ptr, y_ptr, grad_alpha_ptr, n_rows, F, g_se, g_sf,
    ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    r_mask = r < n_rows
    g_rows = (r // F) * g_se + (r % F) * g_sf
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for c0 in tl.range(0, ROW, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = r_mask[:, None] & (c < ROW)[None, :]
        g = tl.load(g_ptr + g_rows[:, None] + c[None, :], mask=mask, other=0.0)
        y = tl.load(y_ptr + r[:, None] * ROW + c[None, :], mask=mask, other=0.0)
        acc += g * y
    tl.store(grad_alpha_ptr + r, tl.sum(acc, axis=1), mask=r_mask)
