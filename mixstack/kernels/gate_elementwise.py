"""The gate's elementwise work where its two small products run on the BLAS (``stack.blas``).

``gate_from_logits_kernel`` is ``gate.gate_kernel`` with the logits ``s @ gw`` already in the
sigmoid surface ``(F, E, G)`` (a BLAS product wrote them): it turns them into the sigmoids in
place and writes the m = 0 columns of the next layer input, ``u + [silu(s) | z0[:, Cf:] * sg]``.  ``gate_cotangent_kernel`` is ``gate.gate_backward_kernel``
without the logit contraction: from the logits in the surface (the relay's recompute: one BLAS
product, the sigmoids formed here as the forward formed them) it writes ``gz`` (its scalar columns
``silu'(s) * h_s`` only) and the logit gradients ``gl`` over the logits it read; a BLAS product
then adds ``gl @ gw^T`` to the scalar columns.  The pointwise math is the helpers every gate kernel calls
(``activations``), walked ``GC`` gate columns at a time in degree order as there.
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, sigmoid, silu, silu_grad
from .rows import degree_cols, edge_tile, load_degree_cols, row_width


@triton.jit
def gate_rows(layer, E, F, LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's edges and row offsets (program axes: edge tile, focus): ``(f, e, e_in,
    rows, z_rows, sg_rows)`` in a focus-major ``(F, E, ROW)`` surface, in layer ``layer`` of the
    saved ``z`` and in the ``(F, E, G)`` sigmoid surface, each ``(BLOCK_M, 1)``."""
    ROW: tl.constexpr = row_width(LMAX, CF)
    f, e, e_in = edge_tile(E, BLOCK_M)
    rows = ((f * E + e) * ROW)[:, None]
    z_rows = (((layer * F + f) * E + e) * ROW)[:, None]
    sg_rows = ((f * E + e) * (LMAX * CF))[:, None]
    return f, e, e_in, rows, z_rows, sg_rows


@triton.jit(do_not_specialize=["layer"])
def gate_from_logits_kernel(
    z_ptr, u_ptr, u_next_ptr, sg_ptr, layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, GC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    R: tl.constexpr = CF // GC
    f, e, e_in, rows, z_rows, sg_rows = gate_rows(layer, E, F, LMAX, CF, BLOCK_M)
    cg = tl.arange(0, GC)
    mask = e_in[:, None]
    for k in tl.range(0, R):                     # the scalar columns: u + silu(s)
        cols = (k * GC + cg)[None, :]
        s_k = tl.load(z_ptr + z_rows + cols, mask=mask, other=0.0)
        v = tl.load(u_ptr + rows + cols, mask=mask, other=0.0) + silu(s_k)
        tl.store(u_next_ptr + rows + cols, v, mask=mask)
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = (t * GC + cg)[None, :]
        sg = sigmoid(tl.load(sg_ptr + sg_rows + gcol, mask=mask, other=0.0))
        tl.store(sg_ptr + sg_rows + gcol, sg, mask=mask)
        cols = CF + gcol                         # the m = 0 columns of the same degree
        z_j = tl.load(z_ptr + z_rows + cols, mask=mask, other=0.0)
        v = tl.load(u_ptr + rows + cols, mask=mask, other=0.0) + z_j * sg
        tl.store(u_next_ptr + rows + cols, v, mask=mask)


@triton.jit(do_not_specialize=["layer"])
def gate_cotangent_kernel(
    h_ptr, z_ptr, sg_ptr, gz_ptr, layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, GC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    R: tl.constexpr = CF // GC
    f, e, e_in, rows, z_rows, sg_rows = gate_rows(layer, E, F, LMAX, CF, BLOCK_M)
    cg = tl.arange(0, GC)
    mask = e_in[:, None]
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        col_m0, col_neg, col_pos = degree_cols(gcol, LMAX, CF)
        sg = sigmoid(tl.load(sg_ptr + sg_rows + gcol[None, :], mask=mask, other=0.0))
        h_m0, h_neg, h_pos = load_degree_cols(h_ptr, rows, col_m0, col_neg, col_pos, mask)
        z_m0, z_neg, z_pos = load_degree_cols(z_ptr, z_rows, col_m0, col_neg, col_pos, mask)
        tl.store(gz_ptr + rows + col_m0, h_m0 * sg, mask=mask)
        tl.store(gz_ptr + rows + col_neg, h_neg * sg, mask=mask)
        tl.store(gz_ptr + rows + col_pos, h_pos * sg, mask=mask)
        gl = gate_logit_grad(gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos), sg)
        tl.store(sg_ptr + sg_rows + gcol[None, :], gl, mask=mask)
    for k in tl.range(0, R):                     # the scalar columns, before the BLAS adds gl @ gw^T
        cols = (k * GC + cg)[None, :]
        h_s = tl.load(h_ptr + rows + cols, mask=mask, other=0.0)
        s = tl.load(z_ptr + z_rows + cols, mask=mask, other=0.0)
        tl.store(gz_ptr + rows + cols, silu_grad(h_s, s), mask=mask)
