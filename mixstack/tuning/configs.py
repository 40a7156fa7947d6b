"""Launch configs of the stack's kernels: the level-1 defaults and the per-kernel
rules that pick a config from the layout.

One place for every launch config that is not a tuned table entry (tables live
in ``mixstack.tuning``; tuned configs override the GEMM and fused configs here
at level >= 2).  Each constant says in a line why it is what it is and names the section of
BENCHMARKS.md that holds the measurement behind it.
"""

from __future__ import annotations

from ..core import config
from ..core.layout import StackLayout, next_power_of_2

# Level-1 launch configs: conservative, spill-free on every supported shape.  The GEMM's is the
# best of six on the whole stack, with a 32-wide K tile (``block_k``) rather than a 64-wide one
# (BENCHMARKS.md, "Level 1, step by step"; "One block GEMM: modes, launch configs, pipelining").
GEMM_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
ALPHA_GRAD_CONFIG = {"BLOCK_R": 32, "BLOCK_C": 64, "num_warps": 4}
RESIDUAL_CONFIG = {"BLOCK_R": 16, "BLOCK_C": 128, "num_warps": 4}     # the BLAS products' residual pass (not tuned)
# The weight gradients' recompute of the layer inputs (``kernels.wgrad.layer_input_kernel``): 64
# rows x 4 warps, spill-free where the forward gate's config spills (BENCHMARKS.md, "The training
# kernels' launch configs").
LAYER_INPUT_CONFIG = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 1}


def block_k(layout: StackLayout) -> int:
    """The default K tile: it divides Cf, so K runs over whole subtiles in
    degree order and the loop needs no mask."""
    return 32 if layout.focus_dim % 32 == 0 else 16


def gemm_block_k(layout: StackLayout, cfg: dict) -> int:
    """The K tile of a GEMM launch: always ``block_k``.  It fixes the order of the K sum
    (the degree order of ``kernels.degree_order``, which the compensated loop walks too), so a launch
    config that asks for another one is refused rather than allowed to change results."""
    exact = block_k(layout)
    if cfg.get("BLOCK_K", exact) != exact:
        raise ValueError(f"the GEMM's K tile is fixed at {exact} for Cf = {layout.focus_dim} (it sets "
                         f"the order of the K sum); a launch config asked for BLOCK_K = {cfg['BLOCK_K']}")
    return exact


def default_gemm_config(layout: StackLayout) -> dict:
    """The level-1 GEMM launch config for this layout."""
    return dict(GEMM_CONFIG, BLOCK_K=block_k(layout))


def fused_supported(layout: StackLayout) -> bool:
    """The fused backward's regime: Cf a power of two whose subtile fits one
    register tile of the gate (16, 32 or 64)."""
    return layout.focus_dim in (16, 32, 64)


# The widest chunk of gate columns the gate kernels form at once (``gate_chunk``).
GATE_CHUNK_MAX = 32


def gate_chunk(layout: StackLayout) -> int:
    """How many gate columns (and K columns of ``s``) the gate kernels take per product
    (``kernels.gate.gate_sigmoids``; the fused backward takes the same, so relay and fused
    run the same products): the largest power of two that divides ``Cf``, at most
    ``GATE_CHUNK_MAX``.  Chunks tile ``Cf`` exactly (no padded lanes, as a power-of-two
    register tile of a 48- or 96-wide subtile had) and keep each FMA dot's operands to
    ``GC`` columns: whole ``Cf``-wide products made ptxas fall back to 32 registers at Cf 80-128
    (BENCHMARKS.md, "The register collapse over the whole grid")."""
    cf = layout.focus_dim
    return min(cf & -cf, GATE_CHUNK_MAX)


def gate_config(layout: StackLayout, backward: bool = False) -> dict:
    """Launch config of the gate kernel (forward/recompute) or its backward: 32 rows x 4 warps,
    the backward 64 rows at Cf 33-64, the best of a rows x warps sweep (BENCHMARKS.md, "Level 1,
    step by step").  With the products in ``gate_chunk`` columns every launch of the grid
    compiles without ptxas's register fallback (``tests/test_compiler_grid.py``), so the configs
    hold at every lmax; widths above 64 take Cf 32's (BENCHMARKS.md, "The register collapse over
    the whole grid").
    """
    cp = next_power_of_2(layout.focus_dim)
    rows = 64 if backward and cp == 64 else 32
    return {"BLOCK_M": rows, "num_warps": 4, "num_stages": 1}


def pointwise_recomputes_gate(layout: StackLayout, compensated: bool = False) -> bool:
    """Whether the relay's pointwise kernel forms the gate sigmoids itself (in registers,
    from ``s`` and ``gw``) instead of a gate launch writing a sigmoid surface ``(F, E, G)``
    for it to read.  Both give the same bits (one helper, ``gate.gate_sigmoids``).  Folded at
    exact levels where Cf <= 32 (as fast, one surface fewer), never at level 3 or where the
    folded kernel spills (BENCHMARKS.md, "The relay's sigmoid surface at exact levels")."""
    return not compensated and next_power_of_2(layout.focus_dim) <= 32


def pointwise_config(layout: StackLayout) -> dict:
    """Launch config of the relay's pointwise kernel: ``gate_config``'s backward rows, at every
    level, level 3's split gate products included (BENCHMARKS.md, "The gate's products on
    tensor cores")."""
    return gate_config(layout, backward=True)


# Persistent programs of the fused backward per SM: each owns a scratch of BLOCK_M x segment
# floats (~25 MB in all at S1 with 64 rows), L2-resident (BENCHMARKS.md, "Second schedule: `gz`
# staged through a per-program scratch").
FUSED_PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 3      # few programs under the interpreter: the persistent loop is exercised


def conv_config(layout: StackLayout) -> dict:
    """Launch configs of the convolution kernels (``kernels.rotate_in``, ``rotate_out``,
    ``segment_sum``): ``edge_block`` edges per program of the edge-parallel kernels,
    ``segment_block`` edges per step of the per-atom segment sums, and their warps.

    Fixed per layout, at every level, never tuned: the segment sums add a block of edges with
    one ``tl.sum`` whose association follows the block's shape and the warps, so these settle
    the order of the sums (as ``block_k`` does for the GEMMs), and levels 1-3 give the same bits.
    Sizes keep every live ``(BLOCK_E, CP)`` tile at 4 floats a thread (edge kernels) and the
    segment step's ``(BLOCK_E, NP, CP)`` product at about 32 (``NP`` the padded rows of the
    widest degree).  Rotate-in with a linear radial layer (``linear_*``) makes the weights with a
    ``tl.dot`` a row, forward and again in the backward (16 edges, channels padded to 16 at
    least; three TF32 products, ``kernels.rotate_in``), with two warps a program at C <= 32
    (faster than four: the backward kernel is latency-bound) and ``wide // 8`` (at least 4)
    above (BENCHMARKS.md, "CUDA graphs and rotate-in's launch").

    Rotate-in with a degree mix (``mix_block`` edges a program; ``NB0`` / ``NB1`` the padded
    degrees of its m = 0 and |m| = 1 blocks, at least 2) holds three ``(BLOCK_E, NB, CP)``
    accumulators (the backward: the three blocks of the mixed rows' gradient): sized, like the
    segment step, for about 16 floats a thread each at 4 warps.  Edges are independent there,
    so this block changes no result.
    """
    cp = next_power_of_2(layout.focus_dim)
    np_ = next_power_of_2(2 * layout.lmax + 1)
    nb0, nb1 = max(2, next_power_of_2(layout.lmax + 1)), max(2, next_power_of_2(layout.lmax))
    wide = max(16, cp)
    return {"edge_block": max(4, min(64, 512 // cp)),
            "segment_block": max(2, min(32, 4096 // (np_ * cp))),
            "CP": cp, "NP": np_, "num_warps": 4,
            "linear_block": 16, "linear_warps": 2 if wide <= 32 else max(4, wide // 8),
            "mix_block": max(2, min(64, 2048 // (nb0 * cp))), "NB0": nb0, "NB1": nb1}


# Weight gradients (``kernels.wgrad``).  The chunk of edges each program sums and the edges per
# K step set the order of the sum, so they are constants, never tuned (a tuned config changes
# BLOCK_M / BLOCK_N / warps / stages only): level 2 keeps level 1's bits.  A chunk of 2048 edges
# keeps thousands of programs busy at S1 with partial sums added in chunk order by
# ``chunk_sum_kernel`` (BENCHMARKS.md, "The training kernels' launch configs").
WGRAD_CHUNK = 2048
WGRAD_BLOCK_K = 32
WGRAD_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
GATE_WGRAD_CHUNK = 512
CHUNK_SUM_BLOCK = 1024
# Under the interpreter every program is a Python loop over numpy tiles: fewer, larger ones.
# (Output tiles and the chunk sum's block change no result: each output element's sum runs
# over the same edges in the same order whatever the tile.)
INTERPRETER_WGRAD_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 1}
INTERPRETER_CHUNK_SUM_BLOCK = 16384


def default_wgrad_config(layout: StackLayout) -> dict:
    """The level-1 launch config of the block-weight reductions (``WGRAD_CONFIG``: the forward
    GEMM's tile, the same reasoning about registers; K runs over edges, ``WGRAD_BLOCK_K``)."""
    return dict(INTERPRETER_WGRAD_CONFIG if config.triton_interpret() else WGRAD_CONFIG)


def chunk_sum_block() -> int:
    """Elements per program of the reductions' chunk sum."""
    return INTERPRETER_CHUNK_SUM_BLOCK if config.triton_interpret() else CHUNK_SUM_BLOCK


def training_pointwise_config(layout: StackLayout) -> dict:
    """Launch config of the double backward's tangent kernel and of the gate weight-gradient
    kernel (``BLOCK_M`` is also the gate reduction's K step, so it depends on the layout only).
    They hold about twice the relay pointwise kernel's tiles (the tangent rows beside the primal
    ones), so 16 rows, with 8 warps above Cf 32: spill-free for sm_90 up to Cf 64 (BENCHMARKS.md,
    "The training kernels' launch configs")."""
    if next_power_of_2(layout.focus_dim) <= 32:
        return {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_M": 16, "num_warps": 8, "num_stages": 1}
