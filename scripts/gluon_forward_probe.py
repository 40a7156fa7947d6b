"""Design B's forward (BENCHMARKS.md, "Fewer bytes than the relay"): level 3's whole stack forward as
one persistent Gluon kernel that reads each row tile once, keeps it on chip across the layers and
writes only what the backward and the caller read (``z``, ``y``, the result).

    for each gated layer k:  z = [u_0 @ W0_k | u_1 @ W1_k]   (compensated products, both blocks)
                             sg = sigmoid(s @ gw_k),  s = z[:, :Cf]
                             u <- u + [silu(s) | z_0[:, Cf:] * sg | z_1 * [sg | sg]]
    identity layer:          y = u + [u_0 @ W0 | u_1 @ W1];  result = alpha * y

(``mixstack.stack.reference.forward_state``'s math; the products compensated as level 3's: each row's
block scaled into [1, 2) by the power of two of its largest magnitude, split into fp16 head and
2^11-scaled tail, three MMAs into two fp32 accumulators, each weight matrix split once and scaled by its
own power of two; the gate's logits exact fp32 products, one fused multiply-add a K step.)

* ``gluon_forward``: one program an SM striding over ``BLOCK_M``-row tiles of one focus stream.  A
  tile's rows are loaded once into an fp32 shared buffer (``BLOCK_M x ROW``).  Per layer: each row's
  two block maxima over that buffer and the split into fp16 head and tail tiles; then block 0's and
  block 1's N tiles, each the K loop's three warpgroup MMAs (in flight across K steps) and an
  epilogue through a staging tile: ``z`` stored, the gate's sigmoids formed from block 0's first N
  tile (fused multiply-adds over ``Cf``, a ``Cf``-wide group at a time, into a shared sigmoid buffer), and the
  next layer's input written back over the row buffer ``Cf`` columns at a time; the identity layer's
  epilogue stores ``y`` and ``alpha * y`` edge-major.  A one-warp loader partition streams every
  (tile, layer, block, N tile, K tile)'s weight head and tail through ``STAGES`` slots.
* the twin: the same arithmetic in Triton, layer by layer (both blocks' products at the kernel's tiles,
  then an epilogue kernel): the bits the GPU run holds the Gluon kernel to, and what the interpreter
  checks against float64.

    python3 scripts/gluon_forward_probe.py --offline [--arch 90]   # compile for sm_90, no GPU
    TRITON_INTERPRET=1 python3 scripts/gluon_forward_probe.py --cpu   # the twin against float64
    python3 scripts/gluon_forward_probe.py [--edges 300003] [--out DIR]   # a Hopper GPU: bits, rates
    python3 scripts/gluon_forward_probe.py --racecheck   # one small launch a config, for compute-sanitizer

On the GPU, beside it: a diagnostic form without the global stores (timed only: what the MMA partition's
own stores cost) and level 3's forward as it ships (``launchers.stack_forward`` with the key's tuned
compensated config, or the level-1 default where none is shipped) on the same inputs, its error
against float64 and its time.  Shapes: S1's key by default (Cf 32, lmax 3, F 2, 4 layers); ``Cf`` must
be a power of two that divides ``BLOCK_N``, and ``BLOCK_N`` must divide both blocks; with the row tile and its
split in shared memory, only S1's and S3's row (320 floats) fits an SM (``fits``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gluon_gemm_probe as single  # noqa: E402  (the split scales, the compile report, the timing loop)

from mixstack.kernels.activations import sigmoid, silu  # noqa: E402
from mixstack.kernels.compensated import compensated_step, pow2_scales, split_result  # noqa: E402

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps): at S1 the fp32 row tile (80 KB) and its split (80 KB),
# the sigmoids (24 KB), the staging tile (16 KB) and the gate's scalar columns (8 KB) leave room for a
# ring of two 32-deep or four 16-deep slots
CONFIGS = ((64, 64, 32, 2, 4), (64, 64, 16, 4, 4))
SMEM_LIMIT = 227 * 1024
_sync = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


def widths(lmax: int, cf: int) -> tuple[int, int, int, int]:
    """``(m0, m1, row, gate width)`` of a row (``mixstack.core.layout.StackLayout``'s)."""
    return (lmax + 1) * cf, 2 * lmax * cf, (3 * lmax + 1) * cf, lmax * cf


def smem_bytes(cfg, lmax: int, cf: int) -> int:
    """Shared memory the kernel allocates at config ``cfg``: the row tile, its split, the sigmoids, the
    staging tile, the gate's scalar columns transposed and the weight ring (barriers aside)."""
    bm, bn, bk, stages, _ = cfg
    _, _, row, g = widths(lmax, cf)
    return bm * row * 4 + 2 * bm * row * 2 + bm * g * 4 + bm * bn * 4 + bm * cf * 4 + stages * 2 * bk * bn * 2


def fits(cfg, lmax: int, cf: int) -> bool:
    """Whether config ``cfg`` tiles the layout (``Cf`` a power of two dividing ``BLOCK_N``, which divides
    both blocks) and fits an SM's shared memory."""
    bm, bn, bk, _, _ = cfg
    m0, m1, _, _ = widths(lmax, cf)
    return (cf & (cf - 1) == 0 and bn % cf == 0 and m0 % bn == 0 and m1 % bn == 0 and bn % bk == 0
            and smem_bytes(cfg, lmax, cf) <= SMEM_LIMIT)


# ------------------------------------------------------------------------------- Gluon kernel

@gluon.jit
def _stream_block(whi_desc, wlo_desc, whi_s, wlo_s, ready, empty, row0, c, K: gl.constexpr, BLOCK_N: gl.constexpr,
                  BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """One block's weight tiles for every (N tile, K tile), in the consumer's order; returns the ring position."""
    nbytes: gl.constexpr = whi_desc.block_type.nbytes + wlo_desc.block_type.nbytes
    for j in range(K // BLOCK_N):
        for t in range(K // BLOCK_K):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)     # a fresh slot passes at once
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(whi_desc, [row0 + t * BLOCK_K, j * BLOCK_N], ready.index(s), whi_s.index(s))
            tma.async_copy_global_to_shared(wlo_desc, [row0 + t * BLOCK_K, j * BLOCK_N], ready.index(s), wlo_s.index(s))
            c += 1
    return c


@gluon.jit
def _forward_loader(w0hi_desc, w0lo_desc, w1hi_desc, w1lo_desc, whi_s, wlo_s, ready, empty, n_tiles, tiles_per_f, F,
                    LAYERS: gl.constexpr, M0: gl.constexpr, M1: gl.constexpr, BLOCK_N: gl.constexpr,
                    BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    c = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        f = tile // tiles_per_f
        for layer in range(LAYERS):
            c = _stream_block(w0hi_desc, w0lo_desc, whi_s, wlo_s, ready, empty, (layer * F + f) * M0, c, M0, BLOCK_N,
                              BLOCK_K, STAGES)
            c = _stream_block(w1hi_desc, w1lo_desc, whi_s, wlo_s, ready, empty, (layer * F + f) * M1, c, M1, BLOCK_N,
                              BLOCK_K, STAGES)


@gluon.jit
def _k_tile(x_s, col: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """The ``BLOCK_K`` columns of the fp32 row buffer from column ``col`` (the buffer is held as N tiles)."""
    return x_s.index(col // BLOCK_N).slice(col % BLOCK_N, BLOCK_K, dim=1)


@gluon.jit
def _split_block(x_s, hi_s, lo_s, rows_layout: gl.constexpr, COL0: gl.constexpr, T0: gl.constexpr, K: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """One block's columns (``COL0``, ``K`` wide) of the row buffer scaled into [1, 2) by each row's
    largest magnitude over them and split into the head and tail tiles ``T0``.. the MMAs read; returns
    each row's scale back (a power of two)."""
    amax = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, rows_layout))
    for t in gl.static_range(K // BLOCK_K):
        x = _k_tile(x_s, COL0 + t * BLOCK_K, BLOCK_N, BLOCK_K).load(rows_layout)
        amax = gl.maximum(amax, gl.max(gl.abs(x), axis=1))
    down, up = single._pow2_scales(amax)
    for t in gl.static_range(K // BLOCK_K):
        x = _k_tile(x_s, COL0 + t * BLOCK_K, BLOCK_N, BLOCK_K).load(rows_layout) * down[:, None]
        hi = x.to(gl.float16)
        hi_s.index(T0 + t).store(hi)
        lo_s.index(T0 + t).store(((x - hi.to(gl.float32)) * 2048.0).to(gl.float16))
    return up


@gluon.jit
def _n_tile(hi_s, lo_s, whi_s, wlo_s, ready, empty, c, row_up, acc_layout: gl.constexpr, T0: gl.constexpr,
            K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
            STAGES: gl.constexpr):
    """One N tile's product from the split tiles ``T0``.. and the streamed weight tiles, the MMAs in
    flight across K steps (a slot freed one step later); ``(product, ring position)``."""
    head = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
    tail = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
    for t in gl.static_range(K // BLOCK_K):
        s = c % STAGES
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        head = warpgroup_mma(hi_s.index(T0 + t), whi_s.index(s), head, is_async=True)
        tail = warpgroup_mma(hi_s.index(T0 + t), wlo_s.index(s), tail, is_async=True)
        tail = warpgroup_mma(lo_s.index(T0 + t), whi_s.index(s), tail, is_async=True)
        head, tail = warpgroup_mma_wait(num_outstanding=3, deps=(head, tail))
        if t > 0:
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
        c += 1
    head, tail = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail))
    mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
    return (head + tail * (1.0 / 2048.0)) * row_up[:, None], c


@gluon.jit
def _sigmoid(x):
    """``kernels.activations.sigmoid`` in Gluon: ``1 / (1 + exp(-x))``, the same rounding."""
    return 1.0 / (1.0 + gl.exp(-x))


@gluon.jit
def _gate(p_s, st_s, sg_s, gw_ptr, gw_row0, rows_layout: gl.constexpr, CF: gl.constexpr, G: gl.constexpr,
          BLOCK_M: gl.constexpr):
    """The gate's sigmoids ``sigmoid(s @ gw)`` from the staged first N tile's ``s = [:, :Cf]``, one
    ``Cf``-wide group at a time, into the sigmoid buffer: exact fp32 products, one fused multiply-add a
    K step in order (``twin_epilogue``'s).  ``s`` is stored transposed (``st_s``, ``[Cf, BLOCK_M, 1]``,
    written through a ``[Cf, BLOCK_M]`` view of the same bytes) so that a runtime K loop reads column k
    as ``st_s.index(k)``: unrolled, the loop's loads were hoisted and spilled."""
    st_s._reinterpret(gl.float32, [CF, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(
        gl.permute(p_s.slice(0, CF, dim=1).load(rows_layout), [1, 0]))
    _sync()
    n = gl.arange(0, CF, layout=gl.SliceLayout(0, rows_layout))
    for g in gl.static_range(G // CF):
        acc = gl.zeros((BLOCK_M, CF), gl.float32, rows_layout)
        for k in range(CF):
            s = st_s.index(k).load(rows_layout)
            w = gl.load(gw_ptr + (gw_row0 + k).to(gl.int64) * G + g * CF + n)
            acc = gl.fma(s, w[None, :], acc)
        sg_s.index(g).store(_sigmoid(acc))


@gluon.jit
def _block(x_s, hi_s, lo_s, whi_s, wlo_s, p_s, st_s, sg_s, ready, empty, c, up, gw_ptr, wup_ptr, alpha_ptr, z_ptr, y_ptr,
           out_ptr, e, E, layer, f, F, gated, B: gl.constexpr, K: gl.constexpr, T0: gl.constexpr,
           LMAX: gl.constexpr, CF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
           STAGES: gl.constexpr, STORES: gl.constexpr, num_warps: gl.constexpr):
    """Block ``B`` (``K`` wide, its split tiles from ``T0``) of one layer: each N tile's product staged,
    then ``z`` stored and the next input written back (a gated layer; block 0's first N tile forms the
    gate's sigmoids first), or ``y`` and ``alpha * y`` stored (the identity layer); the ring position back."""
    M0: gl.constexpr = (LMAX + 1) * CF
    G: gl.constexpr = LMAX * CF
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    ROW: gl.constexpr = M0 + 2 * LMAX * CF
    pc = gl.arange(0, CF, layout=gl.SliceLayout(0, rows_layout))
    mask = (e < E)[:, None]
    row_up = gl.convert_layout(up, gl.SliceLayout(1, acc_layout)) * gl.load(wup_ptr + (layer * F + f) * 2 + B)
    for j in range(K // BLOCK_N):
        p, c = _n_tile(hi_s, lo_s, whi_s, wlo_s, ready, empty, c, row_up, acc_layout, T0, K, BLOCK_M, BLOCK_N,
                       BLOCK_K, STAGES)
        p_s.store(p)
        _sync()
        if B == 0:
            if gated:
                if j == 0:                      # the gate's sigmoids, from s = this tile's first Cf columns
                    _gate(p_s, st_s, sg_s, gw_ptr, (layer * F + f) * CF, rows_layout, CF, G, BLOCK_M)
                    _sync()
        col0 = B * M0 + j * BLOCK_N                 # this N tile's first column of the row
        for q in gl.static_range(BLOCK_N // CF):
            col = col0 + q * CF
            pq = p_s.slice(q * CF, CF, dim=1).load(rows_layout)
            u_piece = x_s.index(col // BLOCK_N).slice(q * CF, CF, dim=1)
            uq = u_piece.load(rows_layout)
            offs = col + pc[None, :]
            if gated:                               # z (n_gated, F, E, ROW), focus-major
                z_rows = ((layer * F + f) * E + e).to(gl.int64) * ROW
                if STORES:
                    gl.store(z_ptr + z_rows[:, None] + offs, pq, mask=mask)
                if B == 0:                          # the scalar columns' SiLU, the others gated
                    sq = sg_s.index(gl.maximum(col - CF, 0) // CF).load(rows_layout)
                    # each branch one fused multiply-add, as the twin's (a select between the
                    # product and the add would keep them apart)
                    v = gl.where(col < CF, uq + pq * _sigmoid(pq), uq + pq * sq)
                else:
                    sq = sg_s.index(((col - M0) % G) // CF).load(rows_layout)
                    v = uq + pq * sq
                u_piece.store(v)
            else:                                   # y and the result (E, F, ROW), edge-major
                v = uq + pq
                y_rows = (e.to(gl.int64) * F + f) * ROW
                a = gl.load(alpha_ptr + e.to(gl.int64) * F + f, mask=e < E, other=0.0)
                if STORES:
                    gl.store(y_ptr + y_rows[:, None] + offs, v, mask=mask)
                    gl.store(out_ptr + y_rows[:, None] + offs, v * a[:, None], mask=mask)
        _sync()
    return c


@gluon.jit
def _forward_products(u_ptr, alpha_ptr, gw_ptr, wup_ptr, z_ptr, y_ptr, out_ptr, E, F, n_tiles, tiles_per_f,
                      x_s, hi_s, lo_s, whi_s, wlo_s, p_s, st_s, sg_s, ready, empty,
                      LAYERS: gl.constexpr, LMAX: gl.constexpr, CF: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, STORES: gl.constexpr,
                      num_warps: gl.constexpr):
    """The MMA partition: per row tile, the rows in, every layer's split, products and epilogues out of
    shared memory, ``z`` of the gated layers, ``y`` and the result out."""
    M0: gl.constexpr = (LMAX + 1) * CF
    M1: gl.constexpr = 2 * LMAX * CF
    ROW: gl.constexpr = M0 + M1
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    c = 0
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, rows_layout))
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        f = tile // tiles_per_f
        e = (tile % tiles_per_f) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_layout))
        mask = (e < E)[:, None]
        u_rows = (f * E + e).to(gl.int64) * ROW               # the focus-major input's rows
        for t in gl.static_range(ROW // BLOCK_N):
            x_s.index(t).store(gl.load(u_ptr + u_rows[:, None] + t * BLOCK_N + cols[None, :], mask=mask, other=0.0))
        _sync()
        for layer in range(LAYERS):
            gated = layer < LAYERS - 1
            up0 = _split_block(x_s, hi_s, lo_s, rows_layout, 0, 0, M0, BLOCK_M, BLOCK_N, BLOCK_K)
            up1 = _split_block(x_s, hi_s, lo_s, rows_layout, M0, M0 // BLOCK_K, M1, BLOCK_M, BLOCK_N, BLOCK_K)
            fence_async_shared()
            _sync()
            c = _block(x_s, hi_s, lo_s, whi_s, wlo_s, p_s, st_s, sg_s, ready, empty, c, up0, gw_ptr, wup_ptr, alpha_ptr, z_ptr,
                       y_ptr, out_ptr, e, E, layer, f, F, gated, 0, M0, 0, LMAX, CF, BLOCK_M, BLOCK_N, BLOCK_K, STAGES,
                       STORES, num_warps)
            c = _block(x_s, hi_s, lo_s, whi_s, wlo_s, p_s, st_s, sg_s, ready, empty, c, up1, gw_ptr, wup_ptr, alpha_ptr, z_ptr,
                       y_ptr, out_ptr, e, E, layer, f, F, gated, 1, M1, M0 // BLOCK_K, LMAX, CF, BLOCK_M, BLOCK_N,
                       BLOCK_K, STAGES, STORES, num_warps)
            _sync()


@gluon.jit
def gluon_forward(u_ptr, alpha_ptr, w0hi_ptr, w0lo_ptr, w1hi_ptr, w1lo_ptr, wup_ptr, gw_ptr, z_ptr, y_ptr, out_ptr,
                  E, F, LAYERS: gl.constexpr, LMAX: gl.constexpr, CF: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, STORES: gl.constexpr,
                  num_warps: gl.constexpr):
    """Level 3's stack forward: ``u (F, E, ROW)``, ``alpha (E, F)``, the block weights stacked as fp16 head
    and tail ``(LAYERS * F * m, m)`` (each matrix scaled by its ``wup (LAYERS, F, 2)``), ``gw (LAYERS - 1,
    F, Cf, G)`` fp32; writes ``z (LAYERS - 1, F, E, ROW)``, ``y`` and the result ``(E, F, ROW)``."""
    M0: gl.constexpr = (LMAX + 1) * CF
    M1: gl.constexpr = 2 * LMAX * CF
    ROW: gl.constexpr = M0 + M1
    G: gl.constexpr = LMAX * CF
    tiles_per_f = gl.cdiv(E, BLOCK_M)
    n_tiles = tiles_per_f * F
    w_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], gl.float16)
    a_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float16)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    w0hi_desc = tma.make_tensor_descriptor(w0hi_ptr, [LAYERS * F * M0, M0], [M0, 1], [BLOCK_K, BLOCK_N], w_smem)
    w0lo_desc = tma.make_tensor_descriptor(w0lo_ptr, [LAYERS * F * M0, M0], [M0, 1], [BLOCK_K, BLOCK_N], w_smem)
    w1hi_desc = tma.make_tensor_descriptor(w1hi_ptr, [LAYERS * F * M1, M1], [M1, 1], [BLOCK_K, BLOCK_N], w_smem)
    w1lo_desc = tma.make_tensor_descriptor(w1lo_ptr, [LAYERS * F * M1, M1], [M1, 1], [BLOCK_K, BLOCK_N], w_smem)
    x_s = gl.allocate_shared_memory(gl.float32, [ROW // BLOCK_N, BLOCK_M, BLOCK_N], plain)
    hi_s = gl.allocate_shared_memory(gl.float16, [ROW // BLOCK_K, BLOCK_M, BLOCK_K], a_smem)
    lo_s = gl.allocate_shared_memory(gl.float16, [ROW // BLOCK_K, BLOCK_M, BLOCK_K], a_smem)
    p_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M, BLOCK_N], plain)
    st_s = gl.allocate_shared_memory(gl.float32, [CF, BLOCK_M, 1], plain)
    sg_s = gl.allocate_shared_memory(gl.float32, [G // CF, BLOCK_M, CF], plain)
    whi_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    wlo_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_forward_products, (u_ptr, alpha_ptr, gw_ptr, wup_ptr, z_ptr, y_ptr, out_ptr, E, F, n_tiles, tiles_per_f,
                             x_s, hi_s, lo_s, whi_s, wlo_s, p_s, st_s, sg_s, ready, empty, LAYERS, LMAX, CF, BLOCK_M, BLOCK_N,
                             BLOCK_K, STAGES, STORES, num_warps)),
        (_forward_loader, (w0hi_desc, w0lo_desc, w1hi_desc, w1lo_desc, whi_s, wlo_s, ready, empty, n_tiles, tiles_per_f,
                           F, LAYERS, M0, M1, BLOCK_N, BLOCK_K, STAGES)),
    ], [1], [24])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


# ------------------------------------------------------------------------------- Triton twin

@triton.jit
def twin_block_products(x_ptr, whi_ptr, wlo_ptr, wup_ptr, p_ptr, E, F, layer, ROW: tl.constexpr, COL0: tl.constexpr,
                        K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK: tl.constexpr):
    """One block's product of one layer, ``p (F, E, K)`` from the focus-major rows ``x (F, E, ROW)``: each
    row's block maximum, then ``compensated_step`` over ``BLOCK_K`` tiles in order (program axes: edge
    tile x N tile, focus)."""
    NT: tl.constexpr = K // BLOCK_N
    f = tl.program_id(1).to(tl.int64)
    e = (tl.program_id(0) // NT).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = (tl.program_id(0) % NT) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    e_mask = e < E
    rows = (f * E + e) * ROW + COL0
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.static_range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] + (k + rk)[None, :], mask=e_mask[:, None], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    down, up = pow2_scales(amax)
    w_rows = (layer * F + f) * K
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.static_range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] + (k + rk)[None, :], mask=e_mask[:, None], other=0.0)
        w_offs = (w_rows + k + rk)[:, None] * K + n[None, :]
        head, tail = compensated_step(x, down, tl.load(whi_ptr + w_offs), tl.load(wlo_ptr + w_offs), head, tail)
    w_up = tl.load(wup_ptr + (layer * F + f) * 2 + BLOCK)
    tl.store(p_ptr + ((f * E + e) * K)[:, None] + n[None, :], split_result(head, tail, up * w_up),
             mask=e_mask[:, None])


@triton.jit
def twin_epilogue(x_ptr, p0_ptr, p1_ptr, gw_ptr, alpha_ptr, x_next_ptr, z_ptr, y_ptr, out_ptr, E, F, layer,
                  LMAX: tl.constexpr, CF: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr):
    """A layer's epilogue from both blocks' products: a gated layer's ``z``, sigmoids (``sigmoid(s @ gw)``,
    one fused multiply-add a K step over ``Cf``, a ``Cf``-wide group at a time) and next input; the identity layer's ``y`` and
    ``alpha * y`` (program axes: edge tile, focus)."""
    M0: tl.constexpr = (LMAX + 1) * CF
    M1: tl.constexpr = 2 * LMAX * CF
    ROW: tl.constexpr = M0 + M1
    G: tl.constexpr = LMAX * CF
    f = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (e < E)[:, None]
    pc = tl.arange(0, CF)
    x_rows = ((f * E + e) * ROW)[:, None]
    p0_rows = ((f * E + e) * M0)[:, None]
    p1_rows = ((f * E + e) * M1)[:, None]
    z_rows = (((layer * F + f) * E + e) * ROW)[:, None]
    y_rows = ((e * F + f) * ROW)[:, None]
    a = tl.load(alpha_ptr + e * F + f, mask=e < E, other=0.0)
    for q in tl.static_range(ROW // CF):
        col = q * CF
        if col < M0:
            pq = tl.load(p0_ptr + p0_rows + col + pc[None, :], mask=mask, other=0.0)
        else:
            pq = tl.load(p1_ptr + p1_rows + (col - M0) + pc[None, :], mask=mask, other=0.0)
        uq = tl.load(x_ptr + x_rows + col + pc[None, :], mask=mask, other=0.0)
        offs = col + pc[None, :]
        if GATED:
            tl.store(z_ptr + z_rows + offs, pq, mask=mask)
            if col < CF:
                v = uq + silu(pq)
            else:
                g = col - CF if col < M0 else (col - M0) % G
                acc = tl.zeros((BLOCK_M, CF), dtype=tl.float32)
                for k in tl.static_range(CF):       # one fused multiply-add a K step, in order
                    s = tl.load(p0_ptr + p0_rows + k, mask=mask, other=0.0)
                    w = tl.load(gw_ptr + ((layer * F + f) * CF + k) * G + g + pc)
                    acc = tl.fma(s, w[None, :], acc)
                v = uq + pq * sigmoid(acc)
            tl.store(x_next_ptr + x_rows + offs, v, mask=mask)
        else:
            v = uq + pq
            tl.store(y_ptr + y_rows + offs, v, mask=mask)
            tl.store(out_ptr + y_rows + offs, v * a[:, None], mask=mask)


# ------------------------------------------------------------------------------- host side

def split_matrices(w):
    """Each matrix of ``w (n, F, m, m)`` split once as level 3 splits it (``kernels.compensated``): fp16
    head and 2^11-scaled tail of ``W / 2^e``, ``e = floor(log2(max |W|))``, stacked ``(n * F * m, m)``,
    and the scales ``(n, F)``."""
    import torch
    up = torch.exp2(torch.floor(torch.log2(w.abs().amax((-1, -2)))))
    scaled = w / up[..., None, None]
    hi = scaled.half()
    lo = ((scaled - hi.float()) * single.TAIL).half()
    m = w.shape[-1]
    return hi.reshape(-1, m).contiguous(), lo.reshape(-1, m).contiguous(), up


def operands(edges: int, lmax: int, cf: int, focus: int, layers: int, device, seed: int = 0) -> dict:
    """Random non-zero stack inputs (rows of other magnitudes among them), the weights at the scale of
    ``mixstack.stack.nn``'s initialisation, and their level-3 split."""
    import torch
    m0, m1, row, g = widths(lmax, cf)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u0 = torch.randn(focus, edges, row, generator=gen)
    u0[:, ::7] *= 1e-3                                   # the row scales matter
    alpha = torch.rand(edges, focus, generator=gen) + 0.5
    w0 = torch.randn(layers, focus, m0, m0, generator=gen) / m0 ** 0.5
    w1 = torch.randn(layers, focus, m1, m1, generator=gen) / m1 ** 0.5
    gw = torch.randn(layers - 1, focus, cf, g, generator=gen) / cf ** 0.5
    ins = {k: v.to(device).contiguous() for k, v in dict(u0=u0, alpha=alpha, w0=w0, w1=w1, gw=gw).items()}
    w0hi, w0lo, up0 = split_matrices(ins["w0"])
    w1hi, w1lo, up1 = split_matrices(ins["w1"])
    ins.update(w0hi=w0hi, w0lo=w0lo, w1hi=w1hi, w1lo=w1lo, wup=torch.stack((up0, up1), -1).contiguous(),
               lmax=lmax, cf=cf)
    return ins


def reference(ins) -> tuple:
    """``(result, z, y)`` in float64 (``mixstack.stack.reference.forward_state``)."""
    from mixstack.stack.reference import forward_state
    d = {k: ins[k].double() for k in ("u0", "alpha", "w0", "w1", "gw")}
    return forward_state(d["u0"], d["alpha"], d["w0"], d["w1"], d["gw"], lmax=ins["lmax"], focus_dim=ins["cf"])


def run_twin(ins, cfg) -> tuple:
    """``(result, z, y)`` of the twin at config ``cfg``'s tiles."""
    import torch
    bm, bn, bk, _, warps = cfg
    u, lmax, cf = ins["u0"], ins["lmax"], ins["cf"]
    focus, edges, row = u.shape
    m0, m1, _, _ = widths(lmax, cf)
    layers = ins["w0"].shape[0]
    z = u.new_empty((layers - 1, focus, edges, row))
    y, out = u.new_empty((edges, focus, row)), u.new_empty((edges, focus, row))
    p0, p1 = u.new_empty((focus, edges, m0)), u.new_empty((focus, edges, m1))
    opts = {"num_warps": warps} if u.is_cuda else {}
    x = u
    for layer in range(layers):
        for block, (k, hi, lo, p) in enumerate(((m0, ins["w0hi"], ins["w0lo"], p0), (m1, ins["w1hi"], ins["w1lo"], p1))):
            grid = (triton.cdiv(edges, bm) * (k // bn), focus)
            twin_block_products[grid](x, hi, lo, ins["wup"], p, edges, focus, layer, ROW=row, COL0=block * m0, K=k,
                                      BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK=block, **opts)
        gated = layer < layers - 1
        x_next = torch.empty_like(u) if gated else x
        twin_epilogue[(triton.cdiv(edges, bm), focus)](x, p0, p1, ins["gw"], ins["alpha"], x_next, z, y, out, edges,
                                                       focus, layer, LMAX=lmax, CF=cf, GATED=gated, BLOCK_M=bm, **opts)
        x = x_next
    return out, z, y


def constexprs(cfg, lmax: int, cf: int, layers: int, stores: bool = True) -> dict:
    bm, bn, bk, stages, warps = cfg
    return {"LAYERS": layers, "LMAX": lmax, "CF": cf, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages,
            "STORES": stores, "num_warps": warps}


def run_gluon(ins, cfg, stores: bool = True) -> tuple:
    """``(result, z, y)`` of ``gluon_forward``, one program an SM at most; ``stores`` off: the diagnostic
    form without global stores (its outputs unwritten)."""
    import torch
    u = ins["u0"]
    focus, edges, row = u.shape
    layers = ins["w0"].shape[0]
    z = u.new_empty((layers - 1, focus, edges, row))
    y, out = u.new_empty((edges, focus, row)), u.new_empty((edges, focus, row))
    programs = min(triton.cdiv(edges, cfg[0]) * focus, torch.cuda.get_device_properties(u.device).multi_processor_count)
    gluon_forward[(programs,)](u, ins["alpha"], ins["w0hi"], ins["w0lo"], ins["w1hi"], ins["w1lo"], ins["wup"], ins["gw"],
                               z, y, out, edges, focus, **constexprs(cfg, ins["lmax"], ins["cf"], layers, stores))
    return out, z, y


def shipped_level3(ins):
    """Level 3's forward as it ships at this key (``launchers.stack_forward``, compensated, the key's tuned
    config or the level-1 default): a callable returning ``(result, z, y)``, and the config's name."""
    from mixstack.core.layout import StackLayout
    from mixstack.stack import launchers
    from mixstack.stack.ops import _tuned
    from mixstack.stack.values import StackSpec, Weights
    spec = StackSpec(StackLayout(ins["lmax"], ins["cf"]), True)
    weights = Weights(ins["w0"], ins["w1"], ins["gw"])
    cfg = _tuned("stack_compensated", ins["u0"], ins["u0"].shape[0], spec, 3, log=False)
    plan = launchers.LaunchPlan(cfg, compensated=True)
    return (lambda: launchers.stack_forward(ins["u0"], ins["alpha"], weights, spec, plan)), cfg


def errors(got, ref) -> dict:
    """Relative errors (norm) of ``(result, z, y)`` against float64."""
    return {name: float((g.double() - r).norm() / r.norm()) for name, g, r in zip(("result", "z", "y"), got, ref)}


def bytes_moved(ins) -> int:
    """The compulsory bytes of the forward: the input and alpha read, ``z``, ``y`` and the result written."""
    focus, edges, row = ins["u0"].shape
    layers = ins["w0"].shape[0]
    return 4 * focus * edges * (row * (1 + (layers - 1) + 2) + 1)


def offline(arch: int, lmax: int, cf: int, layers: int) -> list[dict]:
    """Every config that fits, compiled for ``sm_<arch>`` with this Triton, no GPU."""
    runtime = {n: "*fp32" for n in ("u_ptr", "alpha_ptr", "wup_ptr", "gw_ptr", "z_ptr", "y_ptr", "out_ptr")}
    runtime.update({n: "*fp16" for n in ("w0hi_ptr", "w0lo_ptr", "w1hi_ptr", "w1lo_ptr")}, E="i32", F="i32")
    out = []
    for cfg in CONFIGS:
        if not fits(cfg, lmax, cf):
            continue
        row = {"config": list(cfg), "lmax": lmax, "cf": cf, "layers": layers, "smem_counted": smem_bytes(cfg, lmax, cf),
               **single.compile_report(gluon_forward, runtime, constexprs(cfg, lmax, cf, layers), cfg[4], arch)}
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def cpu_check(lmax: int, cf: int, focus: int, layers: int) -> dict:
    """The twin against float64 at a partial row tile (``TRITON_INTERPRET=1``)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu runs the twin in Triton's interpreter: set TRITON_INTERPRET=1")
    ins = operands(67, lmax, cf, focus, layers, "cpu")
    cfg = next(c for c in CONFIGS if fits(c, lmax, cf))
    err = errors(run_twin(ins, cfg), reference(ins))
    print(f"twin forward Cf={cf} lmax={lmax} F={focus}, {layers} layers: relative error {json.dumps(err)} against float64")
    return err


def gpu(args) -> dict:
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    edges = 4099 if args.racecheck else args.edges
    ins = operands(edges, args.lmax, args.focus_dim, args.focus, args.layers, "cuda")
    ref = None if args.racecheck else reference(ins)              # float64 on the GPU
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "edges": edges, "lmax": args.lmax, "cf": args.focus_dim, "focus": args.focus, "layers": args.layers,
              "bytes": bytes_moved(ins), "configs": []}
    variants = {}
    if not args.racecheck:
        level3, cfg3 = shipped_level3(ins)
        record["level3_config"] = cfg3
        record["level3_error"] = errors(level3(), ref)
        variants["level 3 as shipped"] = level3
    for cfg in CONFIGS:
        if not fits(cfg, args.lmax, args.focus_dim):
            continue
        entry = {"config": list(cfg)}
        try:
            twin = run_twin(ins, cfg)
            got = run_gluon(ins, cfg)
            torch.cuda.synchronize()
            each = {n: bool(torch.equal(g, t)) for n, g, t in zip(("result", "z", "y"), got, twin)}
            entry.update(bits_equal=all(each.values()), bits_equal_each=each,
                         max_abs_vs_twin={n: float((g - t).abs().max()) for n, g, t in zip(("result", "z", "y"), got, twin)},
                         nonfinite=int(sum((~torch.isfinite(g)).sum() for g in got)))
            if ref is not None:
                entry.update(error=errors(got, ref), twin_error=errors(twin, ref))
            variants[f"gluon {cfg}"] = lambda cfg=cfg: run_gluon(ins, cfg)
            # what the MMA partition's own stores of z, y and the result cost: the form without them, timed only
            variants[f"gluon {cfg} no stores (diagnostic)"] = lambda cfg=cfg: run_gluon(ins, cfg, stores=False)
            variants.setdefault(f"twin {cfg[:3]}", lambda cfg=cfg: run_twin(ins, cfg))
        except Exception as exc:
            entry["error_text"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        record["configs"].append(entry)
        print(json.dumps(entry), flush=True)
    if not args.racecheck and variants:
        focus, layers = args.focus, args.layers
        m0, m1, _, _ = widths(args.lmax, args.focus_dim)
        flops = 2 * focus * edges * (m0 * m0 + m1 * m1) * layers
        record.update(single.rates(variants, args.rounds, 3, flops))
        for name in sorted(record["ms"], key=record["ms"].get):
            ms = record["ms"][name]
            print(f"{name:40s} {ms:.4f} ms  {record['tflops'][name]:6.1f} TFLOP/s fp32-equiv  "
                  f"{record['bytes'] / ms / 1e9:6.2f} TB/s of the compulsory bytes", flush=True)
    return record


def parser() -> argparse.ArgumentParser:
    p = single.probe_parser(__doc__, 15, "gluon_forward_probe.json", rows=False)
    p.add_argument("--edges", type=int, default=300003, help="edges E (default 300003: S1's)")
    p.add_argument("--focus", type=int, default=2, help="focus streams F (default 2)")
    p.add_argument("--focus-dim", type=int, default=32, help="Cf (default 32), a power of two")
    p.add_argument("--lmax", type=int, default=3, help="lmax (default 3)")
    p.add_argument("--layers", type=int, default=4, help="layers, the last the identity layer (default 4)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.layers < 2:
        raise SystemExit(f"--layers must be at least 2 (a gated layer and the identity layer), got {args.layers}")
    if not any(fits(c, args.lmax, args.focus_dim) for c in CONFIGS):
        raise SystemExit(f"no config tiles --focus-dim {args.focus_dim} --lmax {args.lmax} within an SM's shared "
                         f"memory (Cf a power of two dividing BLOCK_N, which divides both blocks)")
    if args.cpu:
        cpu_check(args.lmax, args.focus_dim, args.focus, args.layers)
        return 0
    record = ({"offline": offline(args.arch, args.lmax, args.focus_dim, args.layers), "triton": triton.__version__}
              if args.offline else gpu(args))
    single.write_record(args.out, "gluon_forward_probe.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
