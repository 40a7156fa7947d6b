"""Level 3: the stack GEMMs as compensated fp16 tensor-core products.

Each fp32 operand ``x`` is split into a head and a tail of fp16,
``x_hi = fp16(x)`` and ``x_lo = fp16((x - x_hi) * 2^11)``, and

    a @ w  ~=  a_hi @ w_hi  +  2^-11 * (a_hi @ w_lo + a_lo @ w_hi)

with fp32 accumulation; the tail-tail product (2^-22 relative) is dropped.
The head product and the two tail products keep separate accumulators: one
shared accumulator doubles the error (BENCHMARKS.md, Floors and ceilings).

Why fp16 with scaling and not bf16x3 or 3xTF32: two bf16 halves hold 16 mantissa bits, too
few for the 2e-6 contract on this GEMM, and Triton's ``tf32x3`` ran well below the fp16 split
at the same error, the more so with the weights split once outside (BENCHMARKS.md, "Floors
and ceilings").  fp16's price is its range (2^-14 .. 65504), which the scaling below takes
care of.

Range: every split operand is first brought into [1, 2) by an exact power of
two, undone on the result (exact again):

- the weights per ``(layer, focus)`` matrix, once per call
  (``split_weights_kernel``: the split runs in Triton so that no compiler
  can fold ``x - fp16(x)`` to zero, as Inductor does to the same math in
  ATen ops);
- the activations per row of the GEMM and per block: the largest magnitude of
  the row's block, recorded by a kernel that wrote or read the operand whole
  (the forward gate kernel for the m = 0 columns of a layer input, the |m| = 1
  GEMM's epilogue for the rest, the alpha-gradient kernel for the alpha-scaled
  incoming gradient, the pointwise backward for ``gz``; ``row_amax``), or,
  where none did (the stack's input; the incoming gradient without alpha),
  found by a first pass over the row's K tiles in this kernel.  Both give the same maximum of the same values, hence
  the same bits; the pre-pass cost 20-30% of this GEMM's time on the H200
  (``scripts/probe_compensated.py``, BENCHMARKS.md).  A row of 1e-6 or 1e4 values
  therefore loses nothing; values far below their row's largest fall into
  fp16's subnormals, where their error stays below 2^-35 of that largest
  value.  NaN and Inf propagate (an Inf row becomes NaN).
"""

import triton
import triton.language as tl

from .degree_order import degree_order_k

TAIL_SCALE = tl.constexpr(2048.0)     # 2^11: one fp16 mantissa beyond the head


@triton.jit
def pow2_scales(amax):
    """``(2^-e, 2^e)`` with ``e = floor(log2(amax))`` clamped to [-126, 126]: multiplying by
    the first brings ``amax`` into [1, 2); both are exact powers of two."""
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -126), 126)
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)
    return down, up


@triton.jit
def split_fp16(x):
    """Head and 2^11-scaled tail of ``x`` (|x| < 2) in fp16."""
    hi = x.to(tl.float16)
    lo = ((x - hi.to(tl.float32)) * TAIL_SCALE).to(tl.float16)
    return hi, lo


@triton.jit
def row_amax(x, mask):
    """Each row's largest magnitude over the masked elements of the tile ``x``: what a
    kernel that writes an operand of the compensated GEMM records for it."""
    return tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)


@triton.jit
def compensated_dot(a_ptr, a_rows, col0, e_mask, whi_ptr, wlo_ptr, w_up, kdim, n, n_mask, second, alpha,
                    amax, LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALPHA_ON_A: tl.constexpr,
                    AMAX_GIVEN: tl.constexpr):
    """``A[rows, col0 : col0 + kdim] @ W[:, n]`` for one block from split operands.

    ``whi_ptr`` / ``wlo_ptr``: the block's fp16 weight head and tail (row-major,
    ``kdim x kdim``, scaled by ``1 / w_up``).  K in the degree order of ``degree_order``.
    ``amax`` (``AMAX_GIVEN``): each row's largest magnitude in the block, as its
    writer recorded it; otherwise a first pass over the row's K tiles finds it.
    """
    rk = tl.arange(0, BLOCK_K)
    n_k = kdim // BLOCK_K
    if not AMAX_GIVEN:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for t in tl.range(0, n_k):
            k = degree_order_k(t, second, LMAX, CF, BLOCK_K)
            a = tl.load(a_ptr + a_rows[:, None] + (col0 + k + rk)[None, :], mask=e_mask[:, None], other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(scale_rows(a, alpha, ALPHA_ON_A)), axis=1))
    down, up = pow2_scales(amax)
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(0, n_k):
        k = degree_order_k(t, second, LMAX, CF, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] + (col0 + k + rk)[None, :], mask=e_mask[:, None], other=0.0)
        a = scale_rows(a, alpha, ALPHA_ON_A)
        w_offs = (k + rk)[:, None] * kdim + n[None, :]
        w_hi = tl.load(whi_ptr + w_offs, mask=n_mask[None, :], other=0.0)
        w_lo = tl.load(wlo_ptr + w_offs, mask=n_mask[None, :], other=0.0)
        head, tail = compensated_step(a, down, w_hi, w_lo, head, tail)
    return split_result(head, tail, up * w_up)


@triton.jit
def scale_rows(a, alpha, ON: tl.constexpr):
    """``a`` with each row scaled by its edge's ``alpha`` where ``ON`` (the alpha fold of the
    backward's first GEMM), as it is."""
    if ON:
        a = a * alpha[:, None]
    return a


@triton.jit
def compensated_step(a, down, w_hi, w_lo, head, tail):
    """One K tile of the compensated GEMM: ``a``'s rows scaled into [1, 2) by ``down``, split,
    and the three products of ``split_products``: the step every compensated K loop takes."""
    a_hi, a_lo = split_fp16(a * down[:, None])
    return split_products(a_hi, a_lo, w_hi, w_lo, head, tail)


@triton.jit
def split_products(a_hi, a_lo, w_hi, w_lo, head, tail):
    """One K tile of the three products, into separate fp32 accumulators:
    ``head += a_hi @ w_hi``, ``tail += a_hi @ w_lo + a_lo @ w_hi`` (tail-tail dropped)."""
    head = tl.dot(a_hi, w_hi, head)
    tail = tl.dot(a_hi, w_lo, tail)
    tail = tl.dot(a_lo, w_hi, tail)
    return head, tail


@triton.jit
def split_result(head, tail, row_up):
    """The product from its accumulators, each row's scales (``row_up``: activation scale
    times weight scale, powers of two) undone exactly."""
    return (head + tail * (1.0 / TAIL_SCALE)) * row_up[:, None]


@triton.jit
def split_rows(a, mask):
    """Level-3 operand from a register tile holding its rows' whole K extent (the gate's
    ``s`` and ``gl``): each row scaled into [1, 2) by its own largest magnitude, found in
    the tile itself (no pre-pass, no recorded maxima), then split.  ``(a_hi, a_lo, up)``."""
    down, up = pow2_scales(row_amax(a, mask))
    a_hi, a_lo = split_fp16(a * down[:, None])
    return a_hi, a_lo, up


@triton.jit
def split_tile_dot(a_hi, a_lo, a_up, w_hi, w_lo, w_up, BLOCK_M: tl.constexpr, N: tl.constexpr):
    """``a @ W`` for one K tile from ``split_rows`` and a split weight tile (scaled by
    ``1 / w_up``): the gate's logits and its logit contraction at level 3."""
    head = tl.zeros((BLOCK_M, N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, N), dtype=tl.float32)
    head, tail = split_products(a_hi, a_lo, w_hi, w_lo, head, tail)
    return split_result(head, tail, a_up * w_up)


@triton.jit
def split_weights_kernel(w_ptr, hi_ptr, lo_ptr, up_ptr, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """One program per ``SIZE``-element matrix: its scale ``2^e`` into ``up_ptr`` and the
    fp16 head and tail of ``W * 2^-e``."""
    pid = tl.program_id(0).to(tl.int64)
    base = pid * SIZE
    offs = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in tl.range(0, SIZE, BLOCK):
        m = start + offs < SIZE
        amax = tl.maximum(amax, tl.abs(tl.load(w_ptr + base + start + offs, mask=m, other=0.0)))
    down, up = pow2_scales(tl.max(amax, axis=0))
    tl.store(up_ptr + pid, up)
    for start in tl.range(0, SIZE, BLOCK):
        m = start + offs < SIZE
        hi, lo = split_fp16(tl.load(w_ptr + base + start + offs, mask=m, other=0.0) * down)
        tl.store(hi_ptr + base + start + offs, hi, mask=m)
        tl.store(lo_ptr + base + start + offs, lo, mask=m)
