"""The alpha gradient: ``grad_alpha[e, f] = sum_c g[e, f, c] * y[e, f, c]``.

``y = out / alpha``: the forward's result is saved instead of a second,
unscaled surface, so alpha must be non-zero where its gradient is wanted
(true of the softmax weights the stack is fed).  One program reduces whole
rows in a fixed column order: no atomics, the same bits on every run.
"""

import triton
import triton.language as tl


@triton.jit
def alpha_grad_kernel(
    g_ptr, out_ptr, alpha_ptr, grad_alpha_ptr, n_rows,
    ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    r_mask = r < n_rows
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for c0 in tl.range(0, ROW, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = r_mask[:, None] & (c < ROW)[None, :]
        offs = r[:, None] * ROW + c[None, :]
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        y = tl.load(out_ptr + offs, mask=mask, other=0.0)
        acc += g * y
    alpha = tl.load(alpha_ptr + r, mask=r_mask, other=1.0)
    tl.store(grad_alpha_ptr + r, tl.sum(acc, axis=1) / alpha, mask=r_mask)
