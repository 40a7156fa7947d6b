"""Launch configs of the stack's kernels: the level-1 defaults and the per-kernel
rules that pick a config from the layout.

One place for every launch config that is not a tuned table entry (tables live
in ``mixstack.tuning``; tuned configs override the GEMM and fused configs here
at level >= 2).  Each constant carries the measurement that chose it.
"""

from __future__ import annotations

from ..core import config
from ..core.layout import StackLayout, next_power_of_2

# Level-1 launch configs: conservative, spill-free on every supported shape.
# (64, 64, 32, 4 warps, 3 stages) with a pipelined K loop ran an ieee block
# GEMM of this shape at ~42 TFLOP/s on an H200 (BENCHMARKS.md, Floors and ceilings), and
# beat (64,128,4,3), (128,64,8,3), (64,64,4,4), (128,128,8,2), (32,64,4,3) on
# the whole S1/S2 stack (H200, 2026-11-30).  The K tile is 32 wide (16 where
# Cf is not a multiple of 32): at S4 (Cf = 64) a 64-wide K tile with 8 warps
# took 35.6 ms for fwd+bwd against 30.3 ms (H200, 2026-11-30).
GEMM_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
ALPHA_GRAD_CONFIG = {"BLOCK_R": 32, "BLOCK_C": 64, "num_warps": 4}
# The weight gradients' recompute of the layer inputs (``kernels.wgrad.layer_input_kernel``):
# the forward gate's 32 rows x 4 warps spilled 16 bytes at Cf 64 lmax 3 (72 registers, a
# ptxas quirk); 64 rows x 4 warps compiled spill-free at every key tried (sm_90, offline
# ``compiler_report``: Cf 32-128, lmax 1-6, 48-128 registers).
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
    ``GC`` columns: with whole ``Cf``-wide products, Cf 80-128 compiled to ptxas's
    register fallback at lmax 1 (and the level-3 forward gate at every lmax), see
    ``gate_config``."""
    cf = layout.focus_dim
    return min(cf & -cf, GATE_CHUNK_MAX)


def gate_config(layout: StackLayout, backward: bool = False) -> dict:
    """Launch config of the gate kernel (forward/recompute) or its backward.

    Measured on an H200 (2026-11-30; S1, S2, S4; BLOCK_M/warps in {16, 32, 64,
    128} x {4, 8}): the forward gate is flat within 5% across configs, 32 rows
    x 4 warps among the best everywhere; the pointwise backward is best at 32
    rows x 4 warps for Cf = 32 (0.91 ms at S1 against 1.31 for 32 x 8) and 64
    rows x 4 warps for Cf = 64 (1.24 ms at S4 against 1.62-1.82).  Unrolling the
    degree loop spilled 116-224 registers at Cf = 64.

    The gate kernels form their products ``gate_chunk`` columns at a time.  Before that
    (whole ``Cf``-wide products) ptxas gave up on registers at Cf 48-64 with lmax <= 2
    under these configs (32 registers and a 3.6-9.6 KB stack; the H200 sweep saw the
    relay at Cf 64, F 2, lmax 1 take 33.4 ms against 12.5 at lmax 2) and at Cf 80-128
    under every config tried (lmax 1; the level-3 forward gate at every lmax), and the
    Cf-64 pointwise kernel spilled 392 bytes at 64 x 4.  With chunks, every launch of
    every (Cf, lmax) compiles for sm_90 without the fallback and with at most a few
    bytes spilled (``tests/test_compiler_grid.py``), so the measured configs hold at
    every lmax; widths above 64, whose chunks are 16 or 32 columns like Cf 32's tiles,
    take Cf 32's config (not yet timed).
    """
    cp = next_power_of_2(layout.focus_dim)
    rows = 64 if backward and cp == 64 else 32
    return {"BLOCK_M": rows, "num_warps": 4, "num_stages": 1}


def pointwise_recomputes_gate(layout: StackLayout, compensated: bool = False) -> bool:
    """Whether the relay's pointwise kernel forms the gate sigmoids itself (in registers,
    from ``s`` and ``gw``) instead of a gate launch writing a sigmoid surface ``(F, E, G)``
    for it to read.  Both give the same bits (one helper, ``gate.gate_sigmoids``).

    Measured on an H200 in the whole backward, both ways in one run
    (``scripts/probe_relay_policy.py``, 2026-12-01), ms: exact, S1 9.59 folded against
    9.63, S3 20.20 against 20.42, S4 **18.84** against 16.29 (the folded kernel spills
    at Cf 64); level 3, S1 **6.93** against 6.72, S3 **13.47** against 13.16, S4 8.75
    against 8.72.  So: folded exact where Cf <= 32 (as fast, one surface fewer), never
    at level 3.  (One layer alone, ``probe_backward.py`` had the level-3 fold 0.2 ms a
    layer ahead: alone, each launch meets a cold L2; in the stack the gate launch's
    sigmoids are still in L2 when the pointwise kernel reads them.)"""
    return not compensated and next_power_of_2(layout.focus_dim) <= 32


def pointwise_config(layout: StackLayout) -> dict:
    """Launch config of the relay's pointwise kernel: ``gate_config``'s backward rows,
    at every level.

    What level 3's split fp16 gate products bought in the backward, per gated layer on
    an H200 (``probe_backward.py``, 2026-12-01; ms, exact -> split): the gate launch
    0.385 -> 0.388 at the S1 key, 0.598 -> 0.471 at lmax 6, 0.504 -> 0.361 at Cf 64; the
    pointwise kernel 0.844 -> 0.774, 1.199 -> 1.061, 1.002 -> 0.797.  With the sigmoids
    folded in (not shipped, see ``pointwise_recomputes_gate``) the split products
    wanted 64 rows at Cf <= 32 and 32 rows at Cf 64 (0.94 and 0.96 ms, against 1.30
    and 1.51 on the rows here)."""
    return gate_config(layout, backward=True)


# Persistent programs of the fused backward per SM: each owns a scratch of
# BLOCK_M x segment floats (~25 MB in all at S1 with 64 rows), L2-resident.
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
    least; three TF32 products, ``kernels.rotate_in``).  At C <= 32 two warps a program: at the
    bench model's frame (C 32, lmax 3, 409,688 edges, H200) forward + backward ran 4.88 ms a
    block against 5.19 with four warps (the backward kernel is latency-bound at 19% occupancy
    either way; BENCHMARKS.md, "CUDA graphs and rotate-in's launch"); its backward then spills
    0-32 bytes on the sm_90 compile at lmax 1-6.  Wider C keep ``wide // 8`` warps (at least
    4): spill-free at C 64 (241 registers at lmax 3), 24 bytes at C 128.

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
# BLOCK_M / BLOCK_N / warps / stages only): level 2 keeps level 1's bits.  2048 edges per
# chunk keep ~3800 programs busy at S1 (147 chunks x 13 output tiles x 2 focus streams) with a
# partial-sum buffer of 126 MB, added in chunk order by ``chunk_sum_kernel``; not yet timed on
# a GPU against other chunk sizes.
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
    ones).  Compiled offline for sm_90 (Triton 3.7, ``compiler_report``; not yet timed on a GPU):
    at Cf 32, 32 rows x 4 warps took 229 / 255 registers (two programs per SM), 16 x 4 takes
    128 / 168 without spills; at Cf 64, 16 x 4 spilled ~300 bytes, 16 x 8 takes 162-251 registers
    without spills at lmax 1-6; at Cf 128 every config tried spills (like the relay's kernels)."""
    if next_power_of_2(layout.focus_dim) <= 32:
        return {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_M": 16, "num_warps": 8, "num_stages": 1}
