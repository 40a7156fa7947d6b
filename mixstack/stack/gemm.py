"""The block GEMM's launchers: ``block_gemm(a, weights, epilogue, config)``.

Every GEMM of the stack is one row of ``a`` times ``blockdiag(W0, W1)`` of one layer, followed
by an epilogue.  Three small values say what a call does, and the kernel's constexpr flags are
read off them, never spelled at the call site:

- ``Operand``: the A rows, focus-major ``(F, E, ROW)`` or edge-major ``(E, F, ROW)`` (read
  through its strides; its F stride may be 0), with level 3's recorded row maxima;
- ``BlockWeights``: the layer's weights (transposed in the backward), which blocks run, and
  at level 3 the split heads, tails and scales;
- ``Epilogue``: what happens to the product (store ``z``, gate, residual, store ``y``, alpha,
  store the result, record its row maxima for the next compensated GEMM).

Exact weights at a key whose products run on the BLAS (``tuning.products``) run
``blas.block_products`` whatever the config.  A level-3 config with ``TMA_FIELD`` set runs
``tma_block_gemm`` (``kernels.gemm_tma``), one launch per block, where ``tma_fits``; everything
else runs ``kernels.gemm.block_gemm_kernel``.
Plain Python over tensor metadata, so it runs eagerly and inside a traced ``triton_op``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from torch.library import wrap_triton

from ..core.layout import StackLayout
from ..kernels.gemm import block_gemm_kernel
from ..kernels.gemm_tma import fold_tile_amax_kernel, tma_block_gemm_kernel
from ..tuning.configs import INTERPRETER_PROGRAMS, default_gemm_config, gemm_block_k
from ..tuning.products import on_blas
from .blas import block_products

TMA_FIELD = "TMA"                   # a level-3 GEMM config with this set runs the TMA kernel
PERSISTENT_FIELD = "persistent"     # ... and with this set too, its persistent form
SPECIALISED_FIELD = "specialised"   # ... with its loop's warps specialised (the Hopper pass)
FOLD_BLOCK = 256


@dataclass(frozen=True)
class Operand:
    """The A rows of a block GEMM: ``rows`` focus-major ``(F, E, ROW)``, or with ``edge_major``
    ``(E, F, ROW)`` read through its E and F strides; ``amax`` (level 3) the rows' per-block
    maxima ``(F, E, 2)`` as their writer recorded them (``None``: the kernel finds them)."""

    rows: torch.Tensor
    edge_major: bool = False
    amax: torch.Tensor | None = None

    @property
    def edges(self):
        return self.rows.shape[0] if self.edge_major else self.rows.shape[1]

    @property
    def focus(self):
        return self.rows.shape[1] if self.edge_major else self.rows.shape[0]


@dataclass(frozen=True)
class BlockWeights:
    """Layer ``layer`` of the stacked block weights ``w0 (n, F, m0, m0)``, ``w1 (n, F, m1, m1)``,
    the ``blocks`` a launch runs (``(0,)``, ``(1,)`` or ``(0, 1)``); ``split`` (level 3):
    ``launchers.split_weights(w0, w1)``, the compensated products' heads, tails and scales."""

    w0: torch.Tensor
    w1: torch.Tensor
    layer: int
    layout: StackLayout
    blocks: tuple[int, ...] = (0, 1)
    split: tuple | None = None

    def pointers(self) -> tuple:
        """``(w0, w0_lo, w1, w1_lo, up)`` as the kernels take them (``w0`` fills unused ones)."""
        if self.split is not None:
            w0_hi, w0_lo, w1_hi, w1_lo, up = self.split
            return w0_hi, w0_lo, w1_hi, w1_lo, up
        return self.w0, self.w0, self.w1, self.w0, self.w0


@dataclass(frozen=True)
class Epilogue:
    """What a block GEMM does with its product ``P``: ``z`` stores ``P`` (the gated layers'
    pre-activations, at the weights' layer), ``sg`` multiplies the gate sigmoids in, ``res``
    adds a residual (the A layout's rows; scaled by alpha with ``alpha_on_a``), ``y`` stores the
    unscaled result, ``alpha_on_out`` scales by ``alpha``, ``out`` stores the result
    (edge-major with ``out_edge_major``), ``amax_out`` (zeroed) records its rows' maxima for the
    next compensated GEMM.  ``alpha_on_a`` also scales the A rows before the products."""

    out: torch.Tensor | None = None
    res: torch.Tensor | None = None
    z: torch.Tensor | None = None
    y: torch.Tensor | None = None
    sg: torch.Tensor | None = None
    alpha: torch.Tensor | None = None
    alpha_on_a: bool = False
    alpha_on_out: bool = False
    out_edge_major: bool = False
    amax_out: torch.Tensor | None = None

    def flags(self) -> dict:
        """The kernel's epilogue constexprs."""
        return dict(ALPHA_ON_A=self.alpha_on_a, STORE_Z=self.z is not None, GATE=self.sg is not None,
                    RESIDUAL=self.res is not None, ALPHA_ON_OUT=self.alpha_on_out,
                    OUT_EDGE_MAJOR=self.out_edge_major, STORE_OUT=self.out is not None,
                    STORE_Y=self.y is not None, AMAX_OUT=self.amax_out is not None)

    def surfaces(self, unused: torch.Tensor) -> tuple:
        """``(res, out, z, y, sg, alpha)``, ``unused`` where a flag is off.  A weight tensor, never
        an activation surface, fills them, so that no surface reaches a compiler as several
        aliased arguments (BENCHMARKS.md, "Compiled frames")."""
        return tuple(unused if t is None else t for t in (self.res, self.out, self.z, self.y, self.sg, self.alpha))


def block_gemm(a: Operand, weights: BlockWeights, epilogue: Epilogue, config: dict | None = None) -> None:
    """Launch the block GEMM of ``a`` and ``weights`` with ``epilogue``; ``config`` a launch
    config (``None``: the level-1 default), a level-3 one with ``TMA_FIELD`` set runs
    ``tma_block_gemm`` where it can; exact weights at a BLAS key run ``blas.block_products``."""
    if weights.split is None and on_blas(weights.layout, a.rows):
        block_products(a, weights, epilogue)
        return
    cfg = config or default_gemm_config(weights.layout)
    if weights.split is not None and cfg.get(TMA_FIELD) and tma_fits(a):
        for block in weights.blocks:          # one launch per block: its K trip count is then a constant
            tma_block_gemm(a, replace(weights, blocks=(block,)), epilogue, cfg)
        return
    w0, w0lo, w1, w1lo, wup = weights.pointers()
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(a.edges, bm) * _n_tiles(weights, bn), a.focus)
    wrap_triton(block_gemm_kernel)[grid](
        a.rows, w0, w1, *epilogue.surfaces(w0), w0lo, w1lo, wup,
        w0 if a.amax is None else a.amax, w0 if epilogue.amax_out is None else epilogue.amax_out,
        *_common_args(a, weights), **_operand_args(a, weights, cfg), **epilogue.flags(),
        BOTH_BLOCKS=len(weights.blocks) == 2, COMPENSATED=weights.split is not None,
    )


def tma_block_gemm(a: Operand, weights: BlockWeights, epilogue: Epilogue, config: dict) -> None:
    """Level 3's block GEMM on TMA loads (``kernels.gemm_tma``), one block: tiled, or with
    ``PERSISTENT_FIELD`` one program per SM; the row maxima it records are stored per N tile
    and folded by a second launch (no atomics in a warp-specialised kernel)."""
    if len(weights.blocks) != 1 or weights.split is None:
        raise ValueError("the TMA block GEMM runs one block of split (level-3) weights per launch")
    ensure_allocator()
    block = weights.blocks[0]
    w0_hi, w0_lo, w1_hi, w1_lo, wup = weights.split
    n_tiles = _n_tiles(weights, config["BLOCK_N"])
    grid = (triton.cdiv(a.edges, config["BLOCK_M"]) * n_tiles, a.focus)
    persistent = bool(config.get(PERSISTENT_FIELD))
    if persistent:                    # one program per SM, shared among the focus streams
        grid = (torch.sym_max(1, torch.sym_min(grid[0], persistent_programs(a.rows, grid[0] * a.focus, 1) // a.focus)),
                a.focus)
    tiles = None if epilogue.amax_out is None else epilogue.amax_out.new_empty((a.focus, a.edges, n_tiles))
    wrap_triton(tma_block_gemm_kernel)[grid](
        a.rows, w1_hi if block else w0_hi, w1_lo if block else w0_lo, wup,
        w0_hi if a.amax is None else a.amax, w0_hi if tiles is None else tiles, *epilogue.surfaces(w0_hi),
        *_common_args(a, weights), **_operand_args(a, weights, config), **epilogue.flags(),
        PERSISTENT=persistent, SPECIALISE=bool(config.get(SPECIALISED_FIELD, True)),
    )
    if tiles is not None:
        rows = a.focus * a.edges
        wrap_triton(fold_tile_amax_kernel)[(triton.cdiv(rows, FOLD_BLOCK),)](
            tiles, epilogue.amax_out, rows, NT=n_tiles, SLOT=weights.blocks[0], BLOCK=FOLD_BLOCK)


def _n_tiles(weights: BlockWeights, block_n: int) -> int:
    widths = {0: weights.layout.m0, 1: weights.layout.m1}
    return sum(triton.cdiv(widths[b], block_n) for b in weights.blocks)


def _common_args(a: Operand, weights: BlockWeights) -> tuple:
    """The runtime arguments after the pointers: layer, E, F and the edge-major strides."""
    return (weights.layer, a.edges, a.focus, a.rows.stride(0) if a.edge_major else 0,
            a.rows.stride(1) if a.edge_major else 0)


def _operand_args(a: Operand, weights: BlockWeights, cfg: dict) -> dict:
    """The layout, operand, block and tile constexprs and the launch options."""
    lay = weights.layout
    return dict(LMAX=lay.lmax, CF=lay.focus_dim, FIRST_BLOCK=weights.blocks[0], A_EDGE_MAJOR=a.edge_major,
                AMAX_IN=a.amax is not None, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                BLOCK_K=gemm_block_k(lay, cfg), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def tma_fits(a: Operand) -> bool:
    """Whether a TMA descriptor can read ``a``'s rows: a 16-byte aligned start and row stride
    (the whole surfaces the stack allocates always are; a caller's offset view may not be)."""
    t = a.rows
    row_stride = t.stride(0) if a.edge_major else t.shape[-1]
    return t.storage_offset() % 4 == 0 and row_stride % 4 == 0 and (not a.edge_major or t.stride(1) % 4 == 0)


def persistent_programs(t, n_tiles: int, per_sm: int) -> int:
    """Programs of a persistent launch over ``n_tiles`` tiles: ``per_sm`` on each SM of ``t``'s
    GPU, a few under the interpreter (so that the tile loop is exercised).  ``n_tiles`` may be
    symbolic (a trace with a dynamic edge count): ``sym_min`` keeps the cap in the traced graph,
    where Python's ``min`` would fix the branch of the trace's example size."""
    cap = torch.cuda.get_device_properties(t.device).multi_processor_count * per_sm if t.device.type == "cuda" \
        else INTERPRETER_PROGRAMS
    return torch.sym_max(1, torch.sym_min(n_tiles, cap))


def _scratch(size: int, alignment: int, stream):
    """Global scratch for the TMA kernel's device-side descriptors, from torch's allocator."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton an allocator for kernels' global scratch where none is set (its default
    raises at launch); one the caller set is kept."""
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)
