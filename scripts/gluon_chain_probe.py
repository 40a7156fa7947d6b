"""Design B's product phase (BENCHMARKS.md, "Fewer bytes than the relay"): a row tile kept on chip
across the layers.  Does a persistent Gluon kernel that reads each row once, runs ``LAYERS``
compensated block products on it out of shared memory (the weights streamed through a TMA ring by
a loader warp) and writes it once, run its fp16 products faster than the one-product-a-launch
probe (``scripts/gluon_gemm_probe.py``), which its bytes bounded?

    X_0 = A;  X_{l+1} = X_l @ W_l,  each a compensated product: X_l's rows scaled into [1, 2) by the
    power of two of their largest magnitude, split into fp16 head and 2^11-scaled tail, three MMAs
    into two fp32 accumulators; W_l split once and scaled by 1 / w_up[l]

No gate, residual or pointwise work: the floor that design B's kernel would add its epilogues to.

* ``gluon_chain``: one program an SM striding over ``BLOCK_M``-row tiles.  A tile's rows are loaded
  once into an fp32 shared buffer (``BLOCK_M x K``); per layer, each row's largest magnitude over
  that buffer, the split into fp16 head and tail buffers (``K / BLOCK_K`` tiles in the MMA's shared
  layout), then for each N tile the K loop's three warpgroup MMAs with both operands in shared
  memory, the epilogue writing the N tile back into the fp32 buffer as the next layer's input.  A
  one-warp loader partition streams W's head and tail tiles for every (tile, layer, N tile, K tile),
  in that order, through ``STAGES`` slots, each with a ``ready`` and an ``empty`` mbarrier.
* ``gluon_chain`` with ``GROUPS`` 2 (form ``pingpong``): the same, two 64-row tiles an SM, each in its own MMA partition (one
  warpgroup) behind its own barrier, both fed by the one loader's ring (a slot freed by both), so
  that one partition's split and stores can run under the other's MMAs.
* ``gluon_chain`` with ``PREFETCH`` (forms ``chain-prefetch``, ``chain-prefetch-swizzle``): two fp32 row
  buffers, the next tile's rows copied into the other by ``cp.async`` while this tile's layers run;
  ``XVEC``/``XPHASES`` (forms ``*-swizzle``): the row buffer swizzled against the epilogue's bank conflicts.
* the twin: ``LAYERS`` launches of the one-product probe's Triton twin at the chain's tiles, each
  layer's row maxima taken from the last layer's output (the same maximum of the same floats): the
  bits the GPU run holds the chain to, and the arithmetic the interpreter checks against float64.

    python3 scripts/gluon_chain_probe.py --offline [--arch 90]   # compile for sm_90, no GPU
    TRITON_INTERPRET=1 python3 scripts/gluon_chain_probe.py --cpu   # the twin against float64
    python3 scripts/gluon_chain_probe.py [--rows 600006] [--layers 4] [--out DIR]   # a Hopper GPU
    python3 scripts/gluon_chain_probe.py --racecheck   # one small launch a config, for compute-sanitizer

Bytes a row: 8 K for all ``LAYERS`` products (one read, one write), against 8 K a product for the
one-product probe, whose twin moved 2.09-2.45 TB/s at 78-100 TFLOP/s fp32-equivalent on an H100.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gluon_gemm_probe as single  # noqa: E402  (the split, the twin, the timing loop)

BLOCKS = single.BLOCKS
# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps); the fp32 row buffer, the split's two tiles and the
# ring must fit an SM's 227 KB: BLOCK_M 128 at K = 128 only
CONFIGS = ((64, 64, 64, 4, 4), (64, 64, 32, 6, 4), (64, 128, 64, 4, 4), (128, 64, 64, 3, 8), (128, 128, 64, 2, 8))
# the ping-pong kernel's: two 64-row tiles an SM, one warpgroup each (K 192 fits with a two-slot ring only)
PINGPONG_CONFIGS = ((64, 64, 64, 4, 4), (64, 128, 64, 2, 4), (64, 64, 32, 6, 4), (64, 64, 32, 2, 4))
PINGPONG_REGS = 232          # ping-pong's second MMA partition's registers (setmaxnreg); the loader keeps 24
# Triton 3.6 names the partition's barrier thread_barrier, 3.7 barrier
_sync = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


def fits(cfg, k: int, groups: int = 1, prefetch: bool = False) -> bool:
    """Whether config ``cfg`` tiles width ``k`` and its shared memory (``groups`` row tiles, a second
    fp32 row buffer with ``prefetch``, the ring) fits an SM (227 KB)."""
    bm, bn, bk, stages, _ = cfg
    smem = groups * ((2 if prefetch else 1) * bm * k * 4 + 2 * bm * k * 2) + stages * 2 * bk * bn * 2
    return k % bn == 0 and bn % bk == 0 and smem <= 227 * 1024


# ------------------------------------------------------------------------------- Gluon kernel

@gluon.jit
def _chain_loader(whi_desc, wlo_desc, whi_s, wlo_s, ready, empty, n_rounds, LAYERS: gl.constexpr, K: gl.constexpr,
                  NT_N: gl.constexpr, NT_K: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                  STAGES: gl.constexpr, TAIL_W: gl.constexpr):
    nbytes: gl.constexpr = whi_desc.block_type.nbytes + wlo_desc.block_type.nbytes
    head_bytes: gl.constexpr = whi_desc.block_type.nbytes        # a diagnostic form without TAIL_W: half
    c = 0                                       # W tiles issued by this program: the ring's position
    for _round in range(gl.program_id(0), n_rounds, gl.num_programs(0)):
        for layer in range(LAYERS):
            for j in range(NT_N):
                for t in range(NT_K):
                    s = c % STAGES
                    mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)     # a fresh slot passes at once
                    if TAIL_W:
                        mbarrier.expect(ready.index(s), nbytes)
                    else:
                        mbarrier.expect(ready.index(s), head_bytes)
                    k = layer * K + t * BLOCK_K
                    tma.async_copy_global_to_shared(whi_desc, [k, j * BLOCK_N], ready.index(s), whi_s.index(s))
                    if TAIL_W:
                        tma.async_copy_global_to_shared(wlo_desc, [k, j * BLOCK_N], ready.index(s), wlo_s.index(s))
                    c += 1


@gluon.jit
def _k_tile(x_s, base, t: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """K tile ``t`` of the fp32 row buffer whose first N tile is ``base`` (a buffer is held as N tiles:
    an epilogue writes one)."""
    return x_s.index(base + t * BLOCK_K // BLOCK_N).slice(t * BLOCK_K % BLOCK_N, BLOCK_K, dim=1)


@gluon.jit
def _split_rows(x_s, base, hi_s, lo_s, rows_layout: gl.constexpr, NT_K: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """The fp32 row buffer's rows scaled into [1, 2) by their largest magnitude and split into the
    head and tail tiles the MMAs read; returns each row's scale back (a power of two)."""
    amax = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, rows_layout))
    for t in gl.static_range(NT_K):
        x = _k_tile(x_s, base, t, BLOCK_N, BLOCK_K).load(rows_layout)
        amax = gl.maximum(amax, gl.max(gl.abs(x), axis=1))
    down, up = single._pow2_scales(amax)
    for t in gl.static_range(NT_K):
        x = _k_tile(x_s, base, t, BLOCK_N, BLOCK_K).load(rows_layout) * down[:, None]
        hi = x.to(gl.float16)
        hi_s.index(t).store(hi)
        lo_s.index(t).store(((x - hi.to(gl.float32)) * 2048.0).to(gl.float16))
    return up


@gluon.jit
def _chain_products(a_ptr, c_ptr, wup_ptr, rows, n_rounds, x_s, hi_s, lo_s, whi_s, wlo_s, ready, empty,
                    LAYERS: gl.constexpr, K: gl.constexpr, NT_N: gl.constexpr, NT_K: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                    GROUP: gl.constexpr, GROUPS: gl.constexpr, INFLIGHT: gl.constexpr, MMAS: gl.constexpr,
                    RESPLIT: gl.constexpr, PREFETCH: gl.constexpr, num_warps: gl.constexpr):
    """An MMA partition: per row tile, the rows in, every layer's split and products out of shared
    memory, the rows out.  Of each round's ``GROUPS`` row tiles it takes tile ``GROUP`` (a tile past
    the rows runs masked: every group consumes every W tile the loader streams).  ``INFLIGHT``: a K
    step's MMAs stay in flight while the next step's wait for their W tiles (a slot is freed one step
    later); otherwise each step waits for its own.  ``MMAS`` (3; 1 or 2 for the diagnostic forms, whose
    results are wrong by design): the K step's head product alone, or the head and the first tail
    product; ``RESPLIT`` (on; off for a diagnostic form): split each layer's rows, or only the first
    layer's, every later layer reusing its tiles.  ``PREFETCH``: ``x_s`` holds two row buffers; the next
    tile's rows are copied into the other one asynchronously (``cp.async``) while this tile's layers run,
    so that a tile waits for its rows only when they are late."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    c = 0
    it = 0                                      # row tiles this partition has taken: the buffer's parity
    kk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows_layout))
    if PREFETCH:                                # the first tile's rows into buffer 0
        _copy_rows(x_s, 0, a_ptr, rows, gl.program_id(0) * GROUPS + GROUP, rows_layout, K, NT_K, BLOCK_M,
                   BLOCK_N, BLOCK_K)
    for rnd in range(gl.program_id(0), n_rounds, gl.num_programs(0)):
        e = (rnd * GROUPS + GROUP) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_layout))
        offs = e.to(gl.int64)[:, None] * K + kk[None, :]
        mask = (e < rows)[:, None]
        if PREFETCH:                            # the next tile's rows into the other buffer, then this tile's wait
            base = (it % 2) * NT_N
            _copy_rows(x_s, NT_N - base, a_ptr, rows, (rnd + gl.num_programs(0)) * GROUPS + GROUP, rows_layout, K,
                       NT_K, BLOCK_M, BLOCK_N, BLOCK_K)
            async_copy.wait_group(1)
        else:
            base = 0
            for t in gl.static_range(NT_K):
                _k_tile(x_s, base, t, BLOCK_N, BLOCK_K).store(gl.load(a_ptr + offs + t * BLOCK_K, mask=mask, other=0.0))
        _sync()
        up = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, rows_layout))
        for layer in range(LAYERS):
            if RESPLIT or layer == 0:
                up = _split_rows(x_s, base, hi_s, lo_s, rows_layout, NT_K, BLOCK_M, BLOCK_N, BLOCK_K)
            fence_async_shared()
            _sync()
            row_up = gl.convert_layout(up, gl.SliceLayout(1, acc_layout)) * gl.load(wup_ptr + layer)
            for j in range(NT_N):
                head = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
                tail = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
                for t in gl.static_range(NT_K):
                    s = c % STAGES
                    mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                    head = warpgroup_mma(hi_s.index(t), whi_s.index(s), head, is_async=True)
                    if MMAS >= 2:
                        tail = warpgroup_mma(hi_s.index(t), wlo_s.index(s), tail, is_async=True)
                    if MMAS >= 3:
                        tail = warpgroup_mma(lo_s.index(t), whi_s.index(s), tail, is_async=True)
                    if INFLIGHT:                    # this step's MMAs stay in flight; the last step's slot frees
                        head, tail = warpgroup_mma_wait(num_outstanding=MMAS, deps=(head, tail))
                        if t > 0:
                            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
                    else:
                        head, tail = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail))
                        mbarrier.arrive(empty.index(s), count=1)
                    c += 1
                if INFLIGHT:
                    head, tail = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail))
                    mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
                # the last layer's input is in the split tiles now: its fp32 columns are free
                x_s.index(base + j).store((head + tail * (1.0 / 2048.0)) * row_up[:, None])
            _sync()
        for t in gl.static_range(NT_K):
            gl.store(c_ptr + offs + t * BLOCK_K, _k_tile(x_s, base, t, BLOCK_N, BLOCK_K).load(rows_layout), mask=mask)
        _sync()
        it += 1
    if PREFETCH:
        async_copy.wait_group(0)                # the copy past the last tile (masked) retires before the exit


@gluon.jit
def _copy_rows(x_s, base, a_ptr, rows, tile, rows_layout: gl.constexpr, K: gl.constexpr, NT_K: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """Row tile ``tile``'s rows copied asynchronously into the row buffer at ``base`` (zeros past the
    rows), one commit group."""
    e = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_layout))
    kk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows_layout))
    offs = e.to(gl.int64)[:, None] * K + kk[None, :]
    mask = (e < rows)[:, None]
    for t in gl.static_range(NT_K):
        async_copy.async_copy_global_to_shared(_k_tile(x_s, base, t, BLOCK_N, BLOCK_K), a_ptr + offs + t * BLOCK_K,
                                               mask=mask)
    async_copy.commit_group()


@gluon.jit
def gluon_chain(a_ptr, whi_ptr, wlo_ptr, wup_ptr, c_ptr, rows, LAYERS: gl.constexpr, K: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                GROUPS: gl.constexpr, REGS: gl.constexpr, INFLIGHT: gl.constexpr, MMAS: gl.constexpr,
                RESPLIT: gl.constexpr, TAIL_W: gl.constexpr, PREFETCH: gl.constexpr, XVEC: gl.constexpr,
                XPHASES: gl.constexpr, num_warps: gl.constexpr):
    """``C = A @ W_0 @ ... @ W_{LAYERS-1}``, each product compensated, ``A (rows, K)`` fp32, the
    ``W_l`` stacked as fp16 head and tail ``(LAYERS * K, K)``, each scaled by ``1 / w_up[l]``.
    ``GROUPS`` 1: one MMA partition on one row tile at a time.  ``GROUPS`` 2 (ping-pong): two MMA
    partitions of ``num_warps`` warps (the second with ``REGS`` registers), each on its own row tile
    (rounds of two tiles), sharing the loader's W ring (a slot freed once both used it): each
    partition's phases wait only at its own barrier, so one's split and stores can run under the
    other's MMAs.  ``INFLIGHT``: each K step's MMAs left in flight across the next step's wait.
    ``MMAS``, ``RESPLIT``: ``_chain_products``'s (the diagnostic forms); ``TAIL_W`` off (a diagnostic
    form with ``MMAS`` 1): the loader streams the weights' head tiles alone.  ``PREFETCH`` (``GROUPS`` 1):
    two fp32 row buffers, the next tile's rows copied in while this one's layers run.  ``XVEC``,
    ``XPHASES``: the fp32 row buffer's swizzle (1, 1: none; 4, 8: each row's 16-byte pieces permuted
    by the row's index mod 8, so that the epilogue's stores of 8 rows' columns fall into different
    banks; the split's loads are conflict-free either way)."""
    NT_N: gl.constexpr = K // BLOCK_N
    NT_K: gl.constexpr = K // BLOCK_K
    n_rounds = gl.cdiv(gl.cdiv(rows, BLOCK_M), GROUPS)
    w_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], gl.float16)
    a_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float16)
    x_smem: gl.constexpr = gl.SwizzledSharedLayout(XVEC, 1, XPHASES, [1, 0])
    whi_desc = tma.make_tensor_descriptor(whi_ptr, [LAYERS * K, K], [K, 1], [BLOCK_K, BLOCK_N], w_smem)
    wlo_desc = tma.make_tensor_descriptor(wlo_ptr, [LAYERS * K, K], [K, 1], [BLOCK_K, BLOCK_N], w_smem)
    x_s = gl.allocate_shared_memory(gl.float32, [(2 if PREFETCH else 1) * NT_N, BLOCK_M, BLOCK_N], x_smem)
    hi_s = gl.allocate_shared_memory(gl.float16, [NT_K, BLOCK_M, BLOCK_K], a_smem)
    lo_s = gl.allocate_shared_memory(gl.float16, [NT_K, BLOCK_M, BLOCK_K], a_smem)
    if GROUPS == 2:                                         # the second partition's row tile
        x1 = gl.allocate_shared_memory(gl.float32, [NT_N, BLOCK_M, BLOCK_N], x_smem)
        hi1 = gl.allocate_shared_memory(gl.float16, [NT_K, BLOCK_M, BLOCK_K], a_smem)
        lo1 = gl.allocate_shared_memory(gl.float16, [NT_K, BLOCK_M, BLOCK_K], a_smem)
    whi_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    wlo_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=GROUPS)         # every MMA partition releases a slot
    loader = (whi_desc, wlo_desc, whi_s, wlo_s, ready, empty, n_rounds, LAYERS, K, NT_N, NT_K, BLOCK_N, BLOCK_K, STAGES,
              TAIL_W)
    if GROUPS == 1:
        gl.warp_specialize([
            (_chain_products, (a_ptr, c_ptr, wup_ptr, rows, n_rounds, x_s, hi_s, lo_s, whi_s, wlo_s, ready, empty,
                               LAYERS, K, NT_N, NT_K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, 0, GROUPS, INFLIGHT, MMAS, RESPLIT,
                               PREFETCH, num_warps)),
            (_chain_loader, loader),
        ], [1], [24])
    else:
        gl.warp_specialize([
            (_chain_products, (a_ptr, c_ptr, wup_ptr, rows, n_rounds, x_s, hi_s, lo_s, whi_s, wlo_s, ready, empty,
                               LAYERS, K, NT_N, NT_K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, 0, GROUPS, INFLIGHT, MMAS, RESPLIT,
                               False, num_warps)),
            (_chain_products, (a_ptr, c_ptr, wup_ptr, rows, n_rounds, x1, hi1, lo1, whi_s, wlo_s, ready, empty,
                               LAYERS, K, NT_N, NT_K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, 1, GROUPS, INFLIGHT, MMAS, RESPLIT,
                               False, num_warps)),
            (_chain_loader, loader),
        ], [num_warps, 1], [REGS, 24])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


# ------------------------------------------------------------------------------- host side

def operands(rows: int, k: int, layers: int, device, seed: int = 0):
    """Random non-zero ``A`` (rows of other magnitudes among them) and ``layers`` weights, each split
    once: ``(a, [w], w_hi (layers * k, k), w_lo, w_up (layers,))``."""
    import torch
    a, w0, _, hi0, lo0, up0 = single.operands(rows, k, device, seed)
    ws, his, los, ups = [w0], [hi0], [lo0], [up0]
    for layer in range(1, layers):
        _, w, _, hi, lo, up = single.operands(1, k, device, seed + layer)
        ws.append(w), his.append(hi), los.append(lo), ups.append(up)
    return (a, ws, torch.cat(his).contiguous(), torch.cat(los).contiguous(),
            torch.tensor(ups, dtype=torch.float32, device=device))


def run_twin(a, w_hi, w_lo, w_up, cfg):
    """The chain as ``LAYERS`` launches of the one-product twin at the chain's tiles."""
    k = a.shape[1]
    tiles = {"BLOCK_M": cfg[0], "BLOCK_N": cfg[1], "BLOCK_K": cfg[2], "num_warps": cfg[4], "num_stages": 3}
    x = a
    for layer in range(len(w_up)):
        x = single.run_twin(x, w_hi[layer * k:(layer + 1) * k], w_lo[layer * k:(layer + 1) * k], x.abs().amax(1),
                            float(w_up[layer]), tiles)
    return x


def constexprs(cfg, k: int, layers: int, groups: int = 1, inflight: bool = False, mmas: int = 3,
               resplit: bool = True, tail_w: bool = True, prefetch: bool = False, swizzle: bool = False) -> dict:
    bm, bn, bk, stages, warps = cfg
    return {"LAYERS": layers, "K": k, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages,
            "GROUPS": groups, "REGS": PINGPONG_REGS, "INFLIGHT": inflight, "MMAS": mmas, "RESPLIT": resplit,
            "TAIL_W": tail_w, "PREFETCH": prefetch, "XVEC": 4 if swizzle else 1, "XPHASES": 8 if swizzle else 1,
            "num_warps": warps}


def run_gluon(a, w_hi, w_lo, w_up, cfg, groups: int = 1, inflight: bool = False, mmas: int = 3, resplit: bool = True,
              tail_w: bool = True, prefetch: bool = False, swizzle: bool = False):
    """``gluon_chain`` on ``a``, ``groups`` row tiles an SM (1, or 2: ping-pong), one program an SM at most;
    ``inflight``: MMAs left in flight across K steps; ``mmas``, ``resplit``, ``tail_w``: a diagnostic form's;
    ``prefetch``: the next row tile copied in under this one's layers; ``swizzle``: the fp32 row buffer
    swizzled."""
    import torch
    rows, k = a.shape
    c = torch.empty_like(a)
    rounds = triton.cdiv(triton.cdiv(rows, cfg[0]), groups)
    programs = min(rounds, torch.cuda.get_device_properties(a.device).multi_processor_count)
    gluon_chain[(programs,)](a, w_hi, w_lo, w_up, c, rows,
                             **constexprs(cfg, k, len(w_up), groups, inflight, mmas, resplit, tail_w, prefetch, swizzle))
    return c


def error(c, a, ws) -> float:
    ref = a.double()
    for w in ws:
        ref = ref @ w.double()
    return float((c.double() - ref).norm() / ref.norm())


FORMS = ("chain", "pingpong", "chain-inflight", "pingpong-inflight", "chain-prefetch", "chain-swizzle",
         "chain-prefetch-swizzle")
# What bounds the chain's rate: the in-flight chain with one or two of the three MMAs a K step (``mma1``: the
# head product alone), or each layer's split left out (``nosplit``: the first layer's tiles reused), or
# both, and the last with the weights' head tiles alone streamed (``headw``: half the weight bytes); their
# results are wrong by design, so only their times are read (never a default form)
DIAGNOSTIC_FORMS = ("chain-mma1", "chain-mma2", "chain-nosplit", "chain-mma1-nosplit", "chain-mma1-nosplit-headw")
DIAGNOSTIC_CONFIGS = ((128, 128, 64, 2, 8), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4))


def forms(names=FORMS):
    """The kernel's forms the probe runs, of ``names``: ``(name, configs, row tiles an SM, MMAs in flight
    across K steps, MMAs a K step, each layer split, the weights' tail tiles streamed, the next row tile
    copied in under this one's layers, the fp32 row buffer swizzled)``."""
    every = {"chain": (CONFIGS, 1, False, 3, True, True, False, False),
             "pingpong": (PINGPONG_CONFIGS, 2, False, 3, True, True, False, False),
             "chain-inflight": (CONFIGS, 1, True, 3, True, True, False, False),
             "pingpong-inflight": (PINGPONG_CONFIGS, 2, True, 3, True, True, False, False),
             "chain-prefetch": (CONFIGS, 1, True, 3, True, True, True, False),
             "chain-swizzle": (CONFIGS, 1, True, 3, True, True, False, True),
             "chain-prefetch-swizzle": (CONFIGS, 1, True, 3, True, True, True, True),
             "chain-mma1": (DIAGNOSTIC_CONFIGS, 1, True, 1, True, True, False, False),
             "chain-mma2": (DIAGNOSTIC_CONFIGS, 1, True, 2, True, True, False, False),
             "chain-nosplit": (DIAGNOSTIC_CONFIGS, 1, True, 3, False, True, False, False),
             "chain-mma1-nosplit": (DIAGNOSTIC_CONFIGS, 1, True, 1, False, True, False, False),
             "chain-mma1-nosplit-headw": (DIAGNOSTIC_CONFIGS, 1, True, 1, False, False, False, False)}
    return tuple((name, *every[name]) for name in names)


def offline(arch: int, layers: int, names=FORMS) -> list[dict]:
    """Compile every (form, block, config) that fits for ``sm_<arch>`` with this Triton, no GPU
    (``gluon_gemm_probe.compile_report``)."""
    out = []
    runtime = {"a_ptr": "*fp32", "whi_ptr": "*fp16", "wlo_ptr": "*fp16", "wup_ptr": "*fp32", "c_ptr": "*fp32",
               "rows": "i32"}
    for form, configs, groups, inflight, mmas, resplit, tail_w, prefetch, swizzle in forms(names):
        for k in BLOCKS:
            for cfg in configs:
                if not fits(cfg, k, groups, prefetch):
                    continue
                row = {"form": form, "K": k, "config": list(cfg), "layers": layers,
                       **single.compile_report(gluon_chain, runtime,
                                               constexprs(cfg, k, layers, groups, inflight, mmas, resplit, tail_w,
                                                          prefetch, swizzle),
                                               cfg[4], arch)}
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def cpu_check(layers: int) -> None:
    """The twin chain against float64 at a partial row tile (``TRITON_INTERPRET=1``)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu runs the twin in Triton's interpreter: set TRITON_INTERPRET=1")
    for k in BLOCKS:
        a, ws, w_hi, w_lo, w_up = operands(67, k, layers, "cpu")
        print(f"twin chain K={k}, {layers} layers: relative error {error(run_twin(a, w_hi, w_lo, w_up, CONFIGS[0]), a, ws):.2e}"
              " against float64")


def gpu(args) -> dict:
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rows = 4099 if args.racecheck else args.rows
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows, "layers": args.layers, "cases": []}
    for k in BLOCKS:
        a, ws, w_hi, w_lo, w_up = operands(rows, k, args.layers, "cuda")
        case = {"K": k, "configs": []}
        variants, twins = {}, {}            # the twin chain depends on the tiles alone: one run each
        mma_count = {}                      # each timed variant's MMAs a K step (the twin's: 3)
        for form, configs, groups, inflight, mmas, resplit, tail_w, prefetch, swizzle in forms(args.forms):
            for cfg in configs:
                if not fits(cfg, k, groups, prefetch):
                    continue
                entry = {"form": form, "config": list(cfg)}
                if form in DIAGNOSTIC_FORMS:
                    entry["diagnostic"] = True          # wrong by design: its time is what it is for
                try:
                    if cfg not in twins:
                        twins[cfg] = run_twin(a, w_hi, w_lo, w_up, cfg)
                    twin = twins[cfg]
                    c = run_gluon(a, w_hi, w_lo, w_up, cfg, groups, inflight, mmas, resplit, tail_w, prefetch, swizzle)
                    torch.cuda.synchronize()
                    entry.update(error=error(c, a, ws), twin_error=error(twin, a, ws),
                                 nonfinite=int((~torch.isfinite(c)).sum()),
                                 max_abs_vs_twin=float((c - twin).abs().max()), bits_equal=bool(torch.equal(c, twin)))
                    mma_count[f"{form} {cfg}"] = mmas
                    variants[f"{form} {cfg}"] = (lambda cfg=cfg, g=groups, f=inflight, m=mmas, r=resplit, t=tail_w,
                                                 p=prefetch, x=swizzle: run_gluon(a, w_hi, w_lo, w_up, cfg, g, f, m, r, t,
                                                                                  p, x))
                    variants.setdefault(f"twin x{args.layers} {cfg[:3]}", lambda cfg=cfg: run_twin(a, w_hi, w_lo, w_up, cfg))
                except Exception as exc:
                    entry["error_text"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                case["configs"].append(entry)
                print(json.dumps({"K": k, **entry}), flush=True)
        if not args.racecheck and variants:
            case.update(single.rates(variants, args.rounds, 3, 2 * rows * k * k * args.layers))
            for name in sorted(case["ms"], key=case["ms"].get):
                print(f"K={k} {name:40s} {case['ms'][name]:.4f} ms  {case['tflops'][name]:6.1f} TFLOP/s fp32-equiv  "
                      f"{mma_count.get(name, 3) * case['tflops'][name]:6.1f} fp16 work", flush=True)
        record["cases"].append(case)
    return record


def parser() -> argparse.ArgumentParser:
    p = single.probe_parser(__doc__, 15, "gluon_chain_probe.json")
    p.add_argument("--layers", type=int, default=4, help="products in the chain (default 4: a stack's layers)")
    p.add_argument("--forms", type=_form_names, default=FORMS,
                   help=f"the kernel's forms to run, comma-separated (default all: {','.join(FORMS)}; "
                        f"diagnostic forms, timed only: {','.join(DIAGNOSTIC_FORMS)})")
    return p


def _form_names(text: str) -> tuple:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FORMS + DIAGNOSTIC_FORMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown form(s) {unknown or text!r}; choose from "
                                         f"{', '.join(FORMS + DIAGNOSTIC_FORMS)}")
    return names


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.layers < 1:
        raise SystemExit(f"--layers must be at least 1, got {args.layers}")
    if args.cpu:
        cpu_check(args.layers)
        return 0
    record = ({"offline": offline(args.arch, args.layers, args.forms), "triton": triton.__version__} if args.offline
              else gpu(args))
    single.write_record(args.out, "gluon_chain_probe.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
