"""A general compensated product ``out[b] = A[b] @ B[b]`` (float32 in and out): level 3's split
(``compensated``) on any strided ``(M, K) @ (K, N)``, for products outside the stack
(``mixstack.deepmd.rest_products``).

``B`` arrives split (``hi``, ``lo`` in fp16, per-column power-of-two scales ``up``: small, split
once per call); ``A`` is split in registers tile by tile after a first pass over each row's K
tiles finds its largest magnitude, so ``A`` is read twice and never written in another form.
Head and tail products keep separate accumulators, as in the stack's kernels.
"""

import triton
import triton.language as tl

from .compensated import compensated_step, pow2_scales, split_result


@triton.jit
def compensated_product_kernel(a_ptr, bhi_ptr, blo_ptr, bup_ptr, out_ptr, M, N,
                               stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                               stride_ob, stride_om, stride_on, K: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program axes: row tile, column tile, batch.  ``bhi`` / ``blo`` strided like ``B``; ``bup``
    ``(batch, N)`` contiguous."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    a_rows = a_ptr + pid_b * stride_ab + rm.to(tl.int64)[:, None] * stride_am
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        k_mask = (k0 + rk) < K
        a = tl.load(a_rows + (k0 + rk)[None, :] * stride_ak, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
    down, up = pow2_scales(amax)
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    b_cols = pid_b * stride_bb + rn[None, :] * stride_bn
    for k0 in tl.range(0, K, BLOCK_K):
        k_mask = (k0 + rk) < K
        a = tl.load(a_rows + (k0 + rk)[None, :] * stride_ak, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b_offs = b_cols + (k0 + rk)[:, None] * stride_bk
        b_mask = k_mask[:, None] & n_mask[None, :]
        w_hi = tl.load(bhi_ptr + b_offs, mask=b_mask, other=0.0)
        w_lo = tl.load(blo_ptr + b_offs, mask=b_mask, other=0.0)
        head, tail = compensated_step(a, down, w_hi, w_lo, head, tail)
    b_up = tl.load(bup_ptr + pid_b * N + rn, mask=n_mask, other=1.0)
    out = split_result(head, tail, up) * b_up[None, :]
    tl.store(out_ptr + pid_b * stride_ob + rm.to(tl.int64)[:, None] * stride_om + rn[None, :] * stride_on, out,
             mask=m_mask[:, None] & n_mask[None, :])
