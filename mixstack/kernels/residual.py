"""The residual epilogue of a block product that ran on the BLAS (``stack.blas``): one pass over
whole rows, ``val = p + res``, stored as ``y`` (``STORE_Y``), times the row's alpha (``SCALE``),
stored as the result.

The products ``p`` are already in the surface they end in: ``y`` with ``STORE_Y``, else the
result, read and rewritten in place (each element read before it is written, by the same
program); so no surface reaches the kernel twice (a compiler tracing it would treat two pointers
to one surface as two tensors).  Rows are ``r = e * F + f``; every surface is read or written
through its own E and F strides (edge-major or focus-major; the residual's F stride may be 0),
columns contiguous.
"""

import triton
import triton.language as tl


@triton.jit
def residual_epilogue_kernel(
    res_ptr, y_ptr, out_ptr, alpha_ptr, n_rows, F,
    r_se, r_sf, y_se, y_sf, o_se, o_sf,
    ROW: tl.constexpr, STORE_Y: tl.constexpr, SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    r_mask = r < n_rows
    e, f = r // F, r % F
    r_rows = (e * r_se + f * r_sf)[:, None]
    y_rows = (e * y_se + f * y_sf)[:, None]
    o_rows = (e * o_se + f * o_sf)[:, None]
    if SCALE:
        alpha = tl.load(alpha_ptr + r, mask=r_mask, other=0.0)[:, None]      # alpha (E, F), contiguous
    for c0 in tl.range(0, ROW, BLOCK_C):
        c = (c0 + tl.arange(0, BLOCK_C))[None, :]
        mask = r_mask[:, None] & (c < ROW)
        if STORE_Y:
            p = tl.load(y_ptr + y_rows + c, mask=mask, other=0.0)
        else:
            p = tl.load(out_ptr + o_rows + c, mask=mask, other=0.0)
        val = p + tl.load(res_ptr + r_rows + c, mask=mask, other=0.0)
        if STORE_Y:
            tl.store(y_ptr + y_rows + c, val, mask=mask)
        if SCALE:
            val = val * alpha
        tl.store(out_ptr + o_rows + c, val, mask=mask)
