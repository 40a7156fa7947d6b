"""Level 3's compensated block product with explicit warp partitions (Gluon), against its Triton
twin: does a producer/consumer kernel that states its partitions itself beat the pointer kernel
on the relay's blocks, before anything is built on it?

    C[e, n] = (A[e, :] @ W[:, n])  from  a_hi @ w_hi + 2^-11 (a_hi @ w_lo + a_lo @ w_hi)

``A`` fp32 ``(rows, K)``; ``W`` split once into fp16 head and tail (``kernels.compensated``'s
``split_weights_kernel``); each row brought into [1, 2) by the power of two of its recorded
maximum (the relay's writers record them: ``AMAX_IN``), split in registers, three warpgroup MMAs
into two fp32 accumulators, the scales undone in the epilogue.  K in natural order (the stack's
degree order permutes whole K tiles; it changes which tile comes when, not the work).

* ``gluon_compensated_gemm``: a 1-warp loader partition issues the TMA loads of each K step (the
  fp32 ``A`` tile and both weight tiles) into a ring of ``STAGES`` shared-memory slots, each with
  a ``ready`` and an ``empty`` mbarrier; the default partition (``num_warps`` warps, 64 rows per
  warpgroup) waits on ``ready``, splits ``A`` in registers, issues the three MMAs with the head
  and tail of ``A`` as register operands, and frees the slot on ``empty``.  Rows are divided
  between warpgroups, not duplicated (what Triton 3.6's own pass did: BENCHMARKS.md, "Level 3
  on TMA loads and specialised warps").
* ``twin_compensated_gemm``: the Triton twin, pointer loads, the same split, products, K order
  and tiles (``kernels.compensated.compensated_step`` and ``split_result``): the interpreter runs
  it on the CPU (``--cpu``), the GPU run holds the Gluon kernel to it.

    python3 scripts/gluon_gemm_probe.py --offline [--arch 90]   # compile for sm_90, no GPU: registers, spills, smem
    TRITON_INTERPRET=1 python3 scripts/gluon_gemm_probe.py --cpu   # the twin in the interpreter against float64
    python3 scripts/gluon_gemm_probe.py [--rows 600006] [--out DIR]   # on a Hopper GPU: bits, rates

On the GPU: for each block (K = N = 128 and 192, the S1 key's m = 0 and |m| = 1 blocks) and each
config, the Gluon kernel's result against the twin's (max abs difference, bits equal or not) and
float64, and interleaved CUDA-event medians of both, in TFLOP/s of fp32-equivalent work (2 E K N
a product) and of fp16 tensor-core work (three products; each config's head-only variant, one
product at fp16 accuracy, is its pipeline's ceiling); ``--racecheck`` runs one small launch of each Gluon config only, for
``compute-sanitizer --tool racecheck``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mixstack.kernels.compensated import compensated_step, pow2_scales, split_result  # noqa: E402

TAIL = 2048.0                       # 2^11, kernels.compensated.TAIL_SCALE
BLOCKS = (128, 192)                 # the S1 key's block widths (m = 0: 4 x 32; |m| = 1: 6 x 32)
# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps, PIPELINE, PERSISTENT): 64 rows a warpgroup; PIPELINE:
# the next K tile's split overlaps this one's MMAs; PERSISTENT: a program an SM over the tiles, so the
# loader fills the next tile's slots during this one's epilogue (a tile's shape is a power of two:
# K = 192 takes three N tiles)
TILES = ((64, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 64, 32, 4, 8), (128, 128, 32, 3, 8), (128, 64, 64, 3, 8))
CONFIGS = tuple((*t, pipeline, persistent) for t in TILES for pipeline, persistent in ((0, 0), (1, 0), (1, 1)))
TWIN = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}


# ------------------------------------------------------------------------------- Gluon kernel

@gluon.jit
def _pow2_scales(amax):
    """``kernels.compensated.pow2_scales`` in Gluon (a Gluon kernel cannot call a ``triton.jit`` function)."""
    bits = amax.to(gl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = gl.minimum(gl.maximum(e, -126), 126)
    return ((127 - e) << 23).to(gl.float32, bitcast=True), ((127 + e) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _tiles(n_tiles, PERSISTENT: gl.constexpr):
    """This program's tiles: ``range`` bounds over the tile index (one tile, or a stride of the grid)."""
    if PERSISTENT:
        return gl.program_id(0), n_tiles, gl.num_programs(0)
    return gl.program_id(0), gl.program_id(0) + 1, 1


@gluon.jit
def _loader(a_desc, whi_desc, wlo_desc, a_s, whi_s, wlo_s, ready, empty, n_tiles, NT: gl.constexpr,
            N_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
            STAGES: gl.constexpr, PERSISTENT: gl.constexpr):
    nbytes: gl.constexpr = a_desc.block_type.nbytes + whi_desc.block_type.nbytes + wlo_desc.block_type.nbytes
    first, last, stride = _tiles(n_tiles, PERSISTENT)
    c = 0                                       # K steps issued by this program: the ring's position
    for tile in range(first, last, stride):
        row0 = (tile // NT) * BLOCK_M
        n0 = (tile % NT) * BLOCK_N
        for t in range(N_K):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)     # a fresh slot passes at once
            mbarrier.expect(ready.index(s), nbytes)
            k = t * BLOCK_K
            tma.async_copy_global_to_shared(a_desc, [row0, k], ready.index(s), a_s.index(s))
            tma.async_copy_global_to_shared(whi_desc, [k, n0], ready.index(s), whi_s.index(s))
            tma.async_copy_global_to_shared(wlo_desc, [k, n0], ready.index(s), wlo_s.index(s))
            c += 1


@gluon.jit
def _split(a_s, down, a_layout: gl.constexpr):
    """The slot's fp32 ``A`` tile, each row scaled into [1, 2), as fp16 head and 2^11-scaled tail
    (``kernels.compensated.split_fp16``'s arithmetic, in Gluon)."""
    a = a_s.load(a_layout) * down[:, None]
    a_hi = a.to(gl.float16)
    return a_hi, ((a - a_hi.to(gl.float32)) * 2048.0).to(gl.float16)


@gluon.jit
def _mmas(a_hi, a_lo, w_hi, w_lo, head, tail, HEAD_ONLY: gl.constexpr):
    """The three MMAs of one K tile into the two accumulators (``HEAD_ONLY``: the head product
    alone, the pipeline's tensor-core ceiling at fp16 accuracy, not a result)."""
    head = warpgroup_mma(a_hi, w_hi, head, is_async=True)
    if not HEAD_ONLY:
        tail = warpgroup_mma(a_hi, w_lo, tail, is_async=True)
        tail = warpgroup_mma(a_lo, w_hi, tail, is_async=True)
    return head, tail


@gluon.jit
def _tile_products(a_s, whi_s, wlo_s, ready, empty, down, c, acc_layout: gl.constexpr, N_K: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PIPELINE: gl.constexpr,
                   HEAD_ONLY: gl.constexpr):
    """One tile's K loop from the ring, starting at its step ``c``: the two accumulators."""
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    head = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
    tail = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
    if PIPELINE:
        # the next K tile's split overlaps this one's three MMAs
        mbarrier.wait(ready.index(c % STAGES), (c // STAGES) & 1)
        a_hi, a_lo = _split(a_s.index(c % STAGES), down, a_layout)
        for t in range(N_K - 1):
            s = (c + t) % STAGES
            head, tail = _mmas(a_hi, a_lo, whi_s.index(s), wlo_s.index(s), head, tail, HEAD_ONLY)
            s1 = (c + t + 1) % STAGES
            mbarrier.wait(ready.index(s1), ((c + t + 1) // STAGES) & 1)
            n_hi, n_lo = _split(a_s.index(s1), down, a_layout)
            head, tail, a_hi, a_lo = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail, a_hi, a_lo))
            mbarrier.arrive(empty.index(s), count=1)
            a_hi, a_lo = n_hi, n_lo
        s = (c + N_K - 1) % STAGES
        head, tail = _mmas(a_hi, a_lo, whi_s.index(s), wlo_s.index(s), head, tail, HEAD_ONLY)
        head, tail = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail))
        mbarrier.arrive(empty.index(s), count=1)
    else:
        for t in range(N_K):
            s = (c + t) % STAGES
            mbarrier.wait(ready.index(s), ((c + t) // STAGES) & 1)
            a_hi, a_lo = _split(a_s.index(s), down, a_layout)
            head, tail = _mmas(a_hi, a_lo, whi_s.index(s), wlo_s.index(s), head, tail, HEAD_ONLY)
            head, tail = warpgroup_mma_wait(num_outstanding=0, deps=(head, tail))
            mbarrier.arrive(empty.index(s), count=1)
    return head, tail


@gluon.jit
def _products(a_s, whi_s, wlo_s, ready, empty, amax_ptr, c_ptr, rows, w_up, n_tiles, N: gl.constexpr,
              NT: gl.constexpr, N_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, PIPELINE: gl.constexpr, HEAD_ONLY: gl.constexpr, PERSISTENT: gl.constexpr,
              num_warps: gl.constexpr):
    """The MMA partition: each of this program's tiles from the ring, then its epilogue (the row and
    weight scales undone, a plain store), while the loader already fills the next tile's slots."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    first, last, stride = _tiles(n_tiles, PERSISTENT)
    c = 0
    for tile in range(first, last, stride):
        row0 = (tile // NT) * BLOCK_M
        n0 = (tile % NT) * BLOCK_N
        e_a = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, a_layout))
        down, _ = _pow2_scales(gl.load(amax_ptr + e_a, mask=e_a < rows, other=1.0))
        head, tail = _tile_products(a_s, whi_s, wlo_s, ready, empty, down, c, acc_layout, N_K, BLOCK_M, BLOCK_N,
                                    STAGES, PIPELINE, HEAD_ONLY)
        c += N_K
        e = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        _, up = _pow2_scales(gl.load(amax_ptr + e, mask=e < rows, other=1.0))
        out = (head + tail * (1.0 / 2048.0)) * (up * w_up)[:, None]
        mask = (e < rows)[:, None] & (n < N)[None, :]
        gl.store(c_ptr + e.to(gl.int64)[:, None] * N + n[None, :], out, mask=mask)


@gluon.jit
def gluon_compensated_gemm(a_ptr, whi_ptr, wlo_ptr, amax_ptr, c_ptr, rows, w_up,
                           K: gl.constexpr, N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           BLOCK_K: gl.constexpr, STAGES: gl.constexpr, PIPELINE: gl.constexpr,
                           PERSISTENT: gl.constexpr, HEAD_ONLY: gl.constexpr, num_warps: gl.constexpr):
    """``C = A @ W`` for ``A (rows, K)`` fp32, ``W`` as fp16 head and tail ``(K, N)`` scaled by
    ``1 / w_up``, each row's maximum in ``amax``: one ``(BLOCK_M, BLOCK_N)`` tile a program, or
    (``PERSISTENT``) a program an SM striding over the tiles, N tiles fastest (an ``A`` tile's
    programs run together and share it through L2)."""
    NT: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    N_K: gl.constexpr = K // BLOCK_K
    n_tiles = gl.cdiv(rows, BLOCK_M) * NT
    a_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float32)
    w_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], gl.float16)
    a_desc = tma.make_tensor_descriptor(a_ptr, [rows, K], [K, 1], [BLOCK_M, BLOCK_K], a_smem)
    whi_desc = tma.make_tensor_descriptor(whi_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N], w_smem)
    wlo_desc = tma.make_tensor_descriptor(wlo_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N], w_smem)
    a_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M, BLOCK_K], a_smem)
    whi_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    wlo_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_K, BLOCK_N], w_smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_products, (a_s, whi_s, wlo_s, ready, empty, amax_ptr, c_ptr, rows, w_up, n_tiles, N, NT, N_K, BLOCK_M,
                     BLOCK_N, STAGES, PIPELINE, HEAD_ONLY, PERSISTENT, num_warps)),
        (_loader, (a_desc, whi_desc, wlo_desc, a_s, whi_s, wlo_s, ready, empty, n_tiles, NT, N_K, BLOCK_M, BLOCK_N,
                   BLOCK_K, STAGES, PERSISTENT)),
    ], [1], [24])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


# ------------------------------------------------------------------------------- Triton twin

@triton.jit
def twin_compensated_gemm(a_ptr, whi_ptr, wlo_ptr, amax_ptr, c_ptr, rows, w_up, K: tl.constexpr, N: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The Gluon kernel's arithmetic with pointer loads: ``kernels.compensated``'s step and result."""
    NT: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    e = (tl.program_id(0) // NT).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = (tl.program_id(0) % NT) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    e_mask, n_mask = e < rows, n < N
    down, up = pow2_scales(tl.load(amax_ptr + e, mask=e_mask, other=1.0))
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        a = tl.load(a_ptr + e[:, None] * K + (k + rk)[None, :], mask=e_mask[:, None], other=0.0)
        w_offs = (k + rk)[:, None] * N + n[None, :]
        w_hi = tl.load(whi_ptr + w_offs, mask=n_mask[None, :], other=0.0)
        w_lo = tl.load(wlo_ptr + w_offs, mask=n_mask[None, :], other=0.0)
        head, tail = compensated_step(a, down, w_hi, w_lo, head, tail)
    tl.store(c_ptr + e[:, None] * N + n[None, :], split_result(head, tail, up * w_up),
             mask=e_mask[:, None] & n_mask[None, :])


# ------------------------------------------------------------------------------- host side

def operands(rows: int, k: int, device, seed: int = 0):
    """Random non-zero ``A``, ``W``, ``A``'s row maxima and ``W``'s fp16 split (head, tail, scale)."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(rows, k, generator=gen).to(device)
    a[::7] *= 1e-3                                   # rows of other magnitudes: the row scales matter
    w = (torch.randn(k, k, generator=gen) / k ** 0.5).to(device)
    amax = a.abs().amax(1)
    e = torch.floor(torch.log2(w.abs().max()))
    w_up = float(2.0 ** e)
    w_hi = (w / w_up).half()
    w_lo = ((w / w_up - w_hi.float()) * TAIL).half()
    return a, w, amax, w_hi.contiguous(), w_lo.contiguous(), w_up


def run_twin(a, w_hi, w_lo, amax, w_up, cfg=TWIN):
    import torch
    rows, k = a.shape
    c = torch.empty(rows, k, device=a.device)
    opts = {x: cfg[x] for x in ("num_warps", "num_stages") if x in cfg}
    grid = (triton.cdiv(rows, cfg["BLOCK_M"]) * triton.cdiv(k, cfg["BLOCK_N"]),)
    twin_compensated_gemm[grid](a, w_hi, w_lo, amax, c, rows, w_up, K=k, N=k, BLOCK_M=cfg["BLOCK_M"],
                                BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], **opts)
    return c


def constexprs(cfg, k: int, head_only: bool = False) -> dict:
    """The Gluon kernel's compile-time arguments for config ``cfg`` at block width ``k``."""
    bm, bn, bk, stages, warps, pipeline, persistent = cfg
    return {"K": k, "N": k, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "PIPELINE": pipeline,
            "PERSISTENT": persistent, "HEAD_ONLY": int(head_only), "num_warps": warps}


def run_gluon(a, w_hi, w_lo, amax, w_up, cfg, head_only: bool = False):
    import torch
    rows, k = a.shape
    c = torch.empty(rows, k, device=a.device)
    tiles = triton.cdiv(rows, cfg[0]) * triton.cdiv(k, cfg[1])
    if cfg[6]:                                  # persistent: a program an SM (one fits an SM)
        tiles = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    gluon_compensated_gemm[(tiles,)](a, w_hi, w_lo, amax, c, rows, w_up, **constexprs(cfg, k, head_only))
    return c


def error(c, a, w) -> float:
    ref = a.double() @ w.double()
    return float((c.double() - ref).norm() / ref.norm())


def compile_report(kernel, runtime: dict, values: dict, num_warps: int, arch: int) -> dict:
    """``kernel`` built for ``sm_<arch>`` by this Triton, no GPU (``runtime``: the non-constexpr
    arguments' types; ``values``: the constexprs): registers, spills, shared memory, warps (the
    partitions' included), and the warpgroup MMAs, TMA loads, register reallocations and per-thread
    asynchronous copies (``cp.async``, and the depths they are waited to) in its PTX;
    a build that fails gives ``{"error": ...}``."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from mixstack.measure.compiler_report import cubin_resources

    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: runtime.get(n, "constexpr") for n in names}
    consts = {(i,): values[n] for i, n in enumerate(names) if n in values}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if runtime.get(n, "").startswith("*")}
    try:
        src = GluonASTSource(kernel, sig, constexprs=consts, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    except Exception as exc:                      # report the failure, go on
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    row = {k: v for k, v in cubin_resources(compiled).items() if k != "sass"}
    ptx = compiled.asm.get("ptx", "")
    row.update(wgmma=ptx.count("wgmma.mma_async"), tma_loads=ptx.count("cp.async.bulk.tensor"),
               setmaxnreg=ptx.count("setmaxnreg"),
               wgmma_waits=sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}),
               cp_async=len(re.findall(r"cp\.async\.c[ag]\.shared", ptx)),
               cp_async_waits=sorted({int(n) for n in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)}))
    return row


def offline(arch: int) -> list[dict]:
    """Compile every (block, config) for ``sm_<arch>`` with this Triton, no GPU (``compile_report``)."""
    out = []
    runtime = {"a_ptr": "*fp32", "whi_ptr": "*fp16", "wlo_ptr": "*fp16", "amax_ptr": "*fp32", "c_ptr": "*fp32",
               "rows": "i32", "w_up": "fp32"}
    for k in BLOCKS:
        for cfg in CONFIGS:
            if k % cfg[1] or k % cfg[2]:
                continue
            row = {"K": k, "config": list(cfg),
                   **compile_report(gluon_compensated_gemm, runtime, constexprs(cfg, k), cfg[4], arch)}
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def cpu_check() -> None:
    """The twin against float64 at a partial row tile (on the CPU: ``TRITON_INTERPRET=1``, set
    before the kernels are decorated, hence in the environment)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu runs the twin in Triton's interpreter: set TRITON_INTERPRET=1")
    for k in BLOCKS:
        a, w, amax, w_hi, w_lo, w_up = operands(67, k, "cpu")
        c = run_twin(a, w_hi, w_lo, amax, w_up)
        print(f"twin K={k}: relative error {error(c, a, w):.2e} against float64")


def rates(variants: dict, rounds: int, reps: int, flops: float, device="cuda") -> dict:
    """``mixstack.measure.timing.time_interleaved`` over ``variants`` (each sample ``reps`` calls
    back to back, one warm-up round): median ms a call and TFLOP/s of ``flops`` a call, per name."""
    from mixstack.measure.timing import time_interleaved

    samples = time_interleaved({name: (lambda f=f: [f() for _ in range(reps)]) for name, f in variants.items()},
                               rounds=rounds, warmup=1, device=device)
    ms = {name: s.median * 1e3 / reps for name, s in samples.items()}
    return {"ms": ms, "tflops": {name: flops / t / 1e9 for name, t in ms.items()}}


def gpu(args) -> dict:
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": args.rows, "cases": []}
    for k in BLOCKS:
        a, w, amax, w_hi, w_lo, w_up = operands(args.rows if not args.racecheck else 4099, k, "cuda")
        twin = run_twin(a, w_hi, w_lo, amax, w_up)
        case = {"K": k, "twin_error": error(twin, a, w), "configs": []}
        variants = {"twin": lambda: run_twin(a, w_hi, w_lo, amax, w_up)}
        for cfg in CONFIGS:
            if k % cfg[1]:
                continue
            entry = {"config": list(cfg)}
            try:
                c = run_gluon(a, w_hi, w_lo, amax, w_up, cfg)
                torch.cuda.synchronize()
                entry.update(error=error(c, a, w), nonfinite=int((~torch.isfinite(c)).sum()),
                             max_abs_vs_twin=float((c - twin).abs().max()), bits_equal=bool(torch.equal(c, twin)))
                variants[str(cfg)] = (lambda cfg=cfg: run_gluon(a, w_hi, w_lo, amax, w_up, cfg))
                if cfg[5] and cfg[6]:           # the persistent pipelined form's ceiling: its head product alone
                    head = run_gluon(a, w_hi, w_lo, amax, w_up, cfg, head_only=True)
                    entry["head_only_error"] = error(head, a, w)
                    variants[f"{cfg} head only"] = (lambda cfg=cfg: run_gluon(a, w_hi, w_lo, amax, w_up, cfg, True))
            except Exception as exc:
                entry["error_text"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            case["configs"].append(entry)
            print(json.dumps({"K": k, **entry}), flush=True)
        if not args.racecheck:
            case.update(rates(variants, args.rounds, 5, 2 * args.rows * k * k))
            # fp16 tensor-core work: three products a tile (one for head only); the twin's too
            case["fp16_tflops"] = {name: t * (1 if name.endswith("head only") else 3) for name, t in case["tflops"].items()}
            for name in sorted(case["ms"], key=case["ms"].get):
                print(f"K={k} {name:32s} {case['ms'][name]:.4f} ms  {case['tflops'][name]:6.1f} TFLOP/s fp32-equiv  "
                      f"{case['fp16_tflops'][name]:6.1f} fp16 work", flush=True)
        record["cases"].append(case)
    return record


def probe_parser(doc: str, rounds: int, record: str, rows: bool = True) -> argparse.ArgumentParser:
    """The options every Gluon probe takes (its own added by the caller); ``rows``: ``--rows``, the rows of
    ``A`` (a probe sized otherwise adds its own)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--offline", action="store_true", help="compile for --arch without a GPU")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--cpu", action="store_true", help="the Triton twin in the interpreter against float64")
    p.add_argument("--racecheck", action="store_true", help="one small launch per config (for compute-sanitizer)")
    if rows:
        p.add_argument("--rows", type=int, default=600006, help="rows of A (default 600006: S1's two focus streams)")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--out", help=f"folder for {record}")
    return p


def write_record(out: str | None, name: str, record: dict) -> None:
    """A probe's record as JSON into folder ``out`` (made if missing) as ``name``; nothing without ``out``."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as fh:
            json.dump(record, fh, indent=1)


def parser() -> argparse.ArgumentParser:
    return probe_parser(__doc__, 20, "gluon_probe.json")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.cpu:
        cpu_check()
        return 0
    record = {"offline": offline(args.arch), "triton": triton.__version__} if args.offline else gpu(args)
    write_record(args.out, "gluon_probe.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
