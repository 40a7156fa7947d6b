"""The order of the stack GEMMs' K loop, once: every K loop of the stack calls it.

K runs over ``Cf``-wide subtiles in *degree order* (``BLOCK_K`` divides
``Cf``): block 0 takes degrees 1..lmax and then the scalar subtile; block 1
takes m = -1 and m = +1 of degree 1, then of degree 2, and so on.  That is
the order in which a fused backward can produce each ``gz`` subtile with one
gate sigmoid per degree, so the relay and the fused kernels sum in the same
order and agree bit for bit (``gemm.degree_order_dot``); the compensated
GEMM (``compensated.compensated_dot``) walks the same order.
"""

import triton
import triton.language as tl


@triton.jit
def degree_order_k(t, second, LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_K: tl.constexpr):
    """The first K column of K tile ``t`` of a block (``second``: the |m| = 1 block)."""
    R: tl.constexpr = CF // BLOCK_K          # K tiles per Cf-wide subtile
    q = t // R                               # subtile, taken in degree order (module doc)
    sub = tl.where(second, (q % 2) * LMAX + q // 2, (q + 1) % (LMAX + 1))
    return sub * CF + (t % R) * BLOCK_K
