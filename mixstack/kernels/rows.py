"""The stack's row layout inside the kernels, once: the widths of a row's blocks, a program's
edge tile, and the columns of one gate group (its degree's m = 0, m = -1 and m = +1 columns)."""

import triton
import triton.language as tl


@triton.constexpr_function
def m0_width(lmax, cf):
    """Columns of the m = 0 block: degrees 0..lmax."""
    return (lmax + 1) * cf


@triton.constexpr_function
def row_width(lmax, cf):
    """Columns of a row: the m = 0 block, then the m = -1 and m = +1 stripes of degrees 1..lmax."""
    return (3 * lmax + 1) * cf


@triton.jit
def edge_tile(E, BLOCK_M: tl.constexpr):
    """This program's focus stream and edges (program axes: edge tile, focus), int64:
    ``(f, e, e < E)``."""
    f = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    return f, e, e < E


@triton.jit
def degree_cols(gcol, LMAX: tl.constexpr, CF: tl.constexpr):
    """The columns of the gate group ``gcol`` as ``(1, GC)`` offsets: its degree's m = 0
    columns, then its m = -1 and m = +1 ones."""
    M0: tl.constexpr = m0_width(LMAX, CF)
    return (CF + gcol)[None, :], (M0 + gcol)[None, :], (M0 + LMAX * CF + gcol)[None, :]


@triton.jit
def load_degree_cols(ptr, rows, col_m0, col_neg, col_pos, mask):
    """The three tiles of a gate group (``degree_cols``) at the row offsets ``rows`` ``(BLOCK_M, 1)``."""
    x_m0 = tl.load(ptr + rows + col_m0, mask=mask, other=0.0)
    x_neg = tl.load(ptr + rows + col_neg, mask=mask, other=0.0)
    x_pos = tl.load(ptr + rows + col_pos, mask=mask, other=0.0)
    return x_m0, x_neg, x_pos
