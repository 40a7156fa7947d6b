"""The exact levels' products on the vendor BLAS (``tuning.products``): the block GEMM with its
epilogue, and the gate's two small products.

``block_products`` does what ``gemm.block_gemm`` does for an exact launch, with each block's
product one batched BLAS call over the focus streams written straight into its surface's
columns (``z``, the target of a whole-row launch, or the relay's running gradient through
``beta = 1``), then the epilogue's gate (an elementwise pass) or residual and alpha (one pass of
``kernels.residual``).  The gate's logits ``s @ gw`` (``gate_logits``) and the logit contraction
``gl @ gw^T`` (``add_logit_contraction``) are BLAS products around the elementwise gate kernels
of ``kernels.gate_elementwise``.  The summation order is the BLAS's, fixed by the shape on one
device: the same bits at levels 1 and 2, which take this route at the same keys.  Plain Python
over tensor metadata, like the Triton launchers.

The weight of each block product reaches cuBLAS in the layout ``TRANSPOSED_BLOCKS`` names
(``b_operand``): cuBLAS picks its kernel by the operands' layout as well as their shapes, and on
sm_90 a product whose weight is a transposed view (its "tn" form) took the warp-tiled ``xmma``
kernel where the plain form took the SIMT one, ~13% slower, at the |m| = 1 blocks 640-896 wide;
the m = 0 blocks ran no faster transposed (BENCHMARKS.md, "Exact products on cuBLAS: the
weights' layout").  ``route_weights`` lays a call's weights out once, so no product copies them.
"""

from __future__ import annotations

import contextlib

import torch
import triton
from torch.library import wrap_triton

from ..kernels.residual import residual_epilogue_kernel
from ..tuning.configs import RESIDUAL_CONFIG
from ..tuning.products import exact_products

TRANSPOSED_BLOCKS = frozenset({1})      # blocks whose weight reaches the BLAS as a transposed view


def _laid_out(w: torch.Tensor, block: int) -> torch.Tensor:
    """``w (..., K, N)`` in block ``block``'s layout: a transposed view of a contiguous ``(..., N, K)``
    where ``block`` is in ``TRANSPOSED_BLOCKS``, else contiguous (a copy only where ``w`` is not so)."""
    if block in TRANSPOSED_BLOCKS:
        return w if w.mT.is_contiguous() else w.mT.contiguous().mT
    return w if w.is_contiguous() else w.contiguous()


def b_operand(w: torch.Tensor, block: int) -> torch.Tensor:
    """``w (F, K, N)`` as block ``block``'s product reads it: the same values in the block's layout
    (``_laid_out``; weights from ``route_weights`` are in it already, so no product copies them)."""
    return _laid_out(w, block)


@contextlib.contextmanager
def transposed_blocks(blocks):
    """Inside: the blocks whose weights reach the BLAS as transposed views are ``blocks`` (a probe
    timing the layouts against each other); read when a call lays its weights out."""
    global TRANSPOSED_BLOCKS
    previous, TRANSPOSED_BLOCKS = TRANSPOSED_BLOCKS, frozenset(blocks)
    try:
        yield
    finally:
        TRANSPOSED_BLOCKS = previous


def route_weights(w0: torch.Tensor, w1: torch.Tensor, *, transposed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The block weights ``(layers, F, K, K)`` laid out once for a call's products (``b_operand``'s
    layouts): as they are (``transposed`` False, the forward) or each ``W^T`` (the backward)."""
    if transposed:
        w0, w1 = w0.mT, w1.mT
    return _laid_out(w0, 0), _laid_out(w1, 1)


def _focus_major(t: torch.Tensor, edge_major: bool) -> torch.Tensor:
    """``t`` as an ``(F, E, ROW)`` view (an edge-major ``(E, F, ROW)`` surface transposed)."""
    return t.transpose(0, 1) if edge_major else t


def _gated(t: torch.Tensor, gate_width: int) -> torch.Tensor:
    """The |m| = 1 block's columns ``(F, E, 2G)`` as ``(F, E, 2, G)``: both halves gated by ``sg``."""
    return t.unflatten(-1, (2, gate_width))


def _columns(layout, block: int) -> slice:
    """The columns of block ``block`` in a row: the m = 0 block, then the |m| = 1 block."""
    return slice(0, layout.m0) if block == 0 else slice(layout.m0, layout.row)


def block_products(a, weights, epilogue) -> None:
    """``gemm.block_gemm``'s effect (its ``Operand``, ``BlockWeights`` and ``Epilogue``) for exact
    weights (no split) with the products on the BLAS.  A launch over whole rows that adds a
    residual (the identity layer both ways, the tangents' last layer) writes its products into
    ``y`` (else ``out``), then one pass adds the residual, stores ``y`` and scales ``out`` by alpha
    where it applies (``alpha_on_a`` scales the result rather than the operand: the same value, the
    BLAS's rounding); any other launch runs per block (``_block``)."""
    if weights.split is not None or a.amax is not None or epilogue.amax_out is not None:
        raise ValueError("the BLAS block products are exact: no split weights or row maxima")
    if epilogue.alpha_on_a and (epilogue.z is not None or epilogue.y is not None or epilogue.sg is not None):
        raise ValueError("alpha on the operand goes with a residual and a result only")
    lay = weights.layout
    rows = _focus_major(a.rows, a.edge_major)
    res = None if epilogue.res is None else _focus_major(epilogue.res, a.edge_major)
    out = None if epilogue.out is None else _focus_major(epilogue.out, epilogue.out_edge_major)
    y = None if epilogue.y is None else _focus_major(epilogue.y, epilogue.out_edge_major)
    in_place = epilogue.res is not None and epilogue.res is epilogue.out and not epilogue.out_edge_major \
        and not a.edge_major and y is None
    scaled = epilogue.alpha is not None and (epilogue.alpha_on_a or epilogue.alpha_on_out)
    if epilogue.sg is not None and 0 in weights.blocks:
        raise ValueError("the block GEMM's gate applies to the |m| = 1 block alone")
    if res is not None and out is not None and epilogue.z is None and not in_place and weights.blocks == (0, 1):
        target = y if y is not None else out              # whole rows: the products, then one residual pass
        with exact_products():
            for block in (0, 1):
                cols = _columns(lay, block)
                w = b_operand((weights.w0 if block == 0 else weights.w1)[weights.layer], block)
                torch.bmm(rows[..., cols], w, out=target[..., cols])
        _residual(res, y, out, epilogue.alpha if scaled else None, unused=weights.w0)
        return
    if y is not None or scaled:
        raise ValueError("y and alpha go with a whole-row launch that adds a residual")
    with exact_products():
        for block in weights.blocks:
            cols = _columns(lay, block)
            w = b_operand((weights.w0 if block == 0 else weights.w1)[weights.layer], block)
            _block(rows[..., cols], w, None if epilogue.z is None else epilogue.z[weights.layer][..., cols],
                   None if res is None else res[..., cols], epilogue.sg if block == 1 else None,
                   None if out is None else out[..., cols], in_place, lay.gate_width)


def _residual(res, y, out, alpha, *, unused) -> None:
    """With the products in ``y`` (where given) or else in ``out``: ``y += res``, ``out = (p + res)
    [* alpha]``, one pass over whole rows (``kernels.residual``), every surface an ``(F, E, ROW)``
    view read through its strides.  ``unused`` (a weight, never an activation surface) fills the
    pointers a launch does not use, so that no surface reaches a compiler as two arguments."""
    cfg = RESIDUAL_CONFIG
    n_focus, n_edges, row = out.shape
    n_rows = n_edges * n_focus

    def strides(t):
        return (t.stride(1), t.stride(0)) if t is not None else (0, 0)     # along E, along F
    wrap_triton(residual_epilogue_kernel)[(triton.cdiv(n_rows, cfg["BLOCK_R"]),)](
        res, unused if y is None else y, out, unused if alpha is None else alpha, n_rows, n_focus,
        *strides(res), *strides(y), *strides(out),
        ROW=row, STORE_Y=y is not None, SCALE=alpha is not None,
        BLOCK_R=cfg["BLOCK_R"], BLOCK_C=cfg["BLOCK_C"], num_warps=cfg["num_warps"],
    )


def _block(a, w, z, res, sg, target, in_place: bool, gate_width: int) -> None:
    """One block of a launch that does not cover whole rows with a residual: ``z = a @ w`` (where
    ``z`` is given) and then ``target = res + (a @ w) * [sg | sg]`` (the forward's |m| = 1 block),
    or ``target += a @ w`` (the relay, in place), or ``target = a @ w``."""
    if z is not None:
        torch.bmm(a, w, out=z)
        if target is None:
            return
        if sg is None or res is None:
            raise ValueError("a block product that stores z writes a gated residual or nothing more")
        torch.addcmul(_gated(res, gate_width), _gated(z, gate_width), sg.unsqueeze(2), out=_gated(target, gate_width))
    elif sg is not None or target is None:
        raise ValueError("a block product without z needs a surface to write and no gate")
    elif in_place:
        target.baddbmm_(a, w)
    elif res is None:
        torch.bmm(a, w, out=target)
    else:
        raise ValueError("a residual beside another surface needs a whole-row launch")


def gate_logits(z: torch.Tensor, gw: torch.Tensor, layer: int, logits: torch.Tensor, focus_dim: int) -> None:
    """``logits (F, E, G) = s @ gw[layer]``, ``s = z[layer][..., :Cf]``: the gate's products of
    one gated layer, which ``kernels.gate_elementwise`` turns into sigmoids."""
    with exact_products():
        torch.bmm(z[layer][..., :focus_dim], gw[layer], out=logits)


def add_logit_contraction(gz: torch.Tensor, gl: torch.Tensor, gw: torch.Tensor, layer: int, focus_dim: int) -> None:
    """``gz[..., :Cf] += gl @ gw[layer]^T``: the gate-logit contraction that
    ``gate_elementwise.gate_cotangent_kernel`` leaves out, from the logit gradients ``gl (F, E, G)``
    it wrote."""
    with exact_products():
        gz[..., :focus_dim].baddbmm_(gl, gw[layer].transpose(-1, -2))
