"""One exact-fp32 block product ``A (R x K) @ W (K x K)`` on the GPU: cuBLAS (TF32 off), Triton's
``tl.dot(input_precision="ieee")`` and a Gluon FMA GEMM with a chosen register tile, interleaved,
medians of CUDA-event timings, TFLOP/s, and the bits of every Triton/Gluon result against the
Triton M64 N64 K16 one (the same sequential K order, so the same bits are expected).

    PYTHONPATH=. python scripts/exact_gemm_probe.py --rows 131072 --k 448 896 1344 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from mixstack.measure.timing import clock_for, time_interleaved


@triton.jit
def triton_gemm(a_ptr, w_ptr, o_ptr, E, KD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pid * BM + tl.arange(0, BM).to(tl.int64)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for t in tl.range(0, KD // BK):
        a = tl.load(a_ptr + rm[:, None] * KD + (t * BK + rk)[None, :], mask=(rm < E)[:, None], other=0.0)
        w = tl.load(w_ptr + (t * BK + rk)[:, None] * KD + rn[None, :], mask=(rn < KD)[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision="ieee")
    tl.store(o_ptr + rm[:, None] * KD + rn[None, :], acc, mask=(rm < E)[:, None] & (rn < KD)[None, :])


@gluon.jit
def gluon_gemm(a_ptr, w_ptr, o_ptr, E, KD: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, SPT_M: gl.constexpr, SPT_N: gl.constexpr, TPW_M: gl.constexpr,
               WPC_M: gl.constexpr):
    WARPS: gl.constexpr = gl.num_warps()
    acc_l: gl.constexpr = gl.BlockedLayout([SPT_M, SPT_N], [TPW_M, 32 // TPW_M], [WPC_M, WARPS // WPC_M], [1, 0])
    a_l: gl.constexpr = gl.DotOperandLayout(0, acc_l, 0)
    b_l: gl.constexpr = gl.DotOperandLayout(1, acc_l, 0)
    ga_l: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 4 // BK, BK // 4], [WARPS, 1], [1, 0])
    gb_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [WARPS, 1], [1, 0])
    # A's rows SPT_M apart in a warp's load fall in one bank group unless swizzled by row // SPT_M
    a_s_l: gl.constexpr = gl.SwizzledSharedLayout(4, SPT_M, BK // 4, [1, 0])
    b_s_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    a_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BK], a_s_l)
    b_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BK, BN], b_s_l)
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ga_l))
    rk = gl.arange(0, BK, layout=gl.SliceLayout(0, ga_l))
    a_ptrs = a_ptr + rm.to(gl.int64)[:, None] * KD + rk[None, :]
    a_mask = (rm < E)[:, None] & (rk < BK)[None, :]
    rkb = gl.arange(0, BK, layout=gl.SliceLayout(1, gb_l))
    rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, gb_l))
    b_ptrs = w_ptr + rkb[:, None] * KD + rn[None, :]
    b_mask = (rkb < BK)[:, None] & (rn < KD)[None, :]
    NK: gl.constexpr = KD // BK
    for s in gl.static_range(STAGES - 1):
        cp.async_copy_global_to_shared(a_smem.index(s), a_ptrs + s * BK, mask=a_mask)
        cp.async_copy_global_to_shared(b_smem.index(s), b_ptrs + s * BK * KD, mask=b_mask)
        cp.commit_group()
    acc = gl.zeros([BM, BN], gl.float32, acc_l)
    for t in range(NK):
        cp.wait_group(STAGES - 2)
        gl.thread_barrier()
        nt = t + STAGES - 1
        if nt < NK:
            cp.async_copy_global_to_shared(a_smem.index(nt % STAGES), a_ptrs + nt * BK, mask=a_mask)
            cp.async_copy_global_to_shared(b_smem.index(nt % STAGES), b_ptrs + nt * BK * KD, mask=b_mask)
        cp.commit_group()
        a = a_smem.index(t % STAGES).load(a_l)
        b = b_smem.index(t % STAGES).load(b_l)
        acc = gl.dot_fma(a, b, acc)
    cp.wait_group(0)
    om = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
    on = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
    gl.store(o_ptr + om.to(gl.int64)[:, None] * KD + on[None, :], acc, mask=(om < E)[:, None] & (on < KD)[None, :])


TRITON = {"T M64 N64 w4 s3": (64, 64, 4, 3), "T M64 N64 w4 s4": (64, 64, 4, 4), "T M64 N64 w4 s5": (64, 64, 4, 5),
          "T M64 N128 w4 s3": (64, 128, 4, 3), "T M128 N128 w8 s2": (128, 128, 8, 2)}
# name: BM, BN, warps, stages, SPT_M, SPT_N, TPW_M, WPC_M
GLUON = {
    "G M64 N128 w4 s3 [8,4]": (64, 128, 4, 3, 8, 4, 4, 2),
    "G M64 N128 w4 s4 [8,4]": (64, 128, 4, 4, 8, 4, 4, 2),
    "G M64 N128 w4 s5 [8,4]": (64, 128, 4, 5, 8, 4, 4, 2),
    "G M64 N128 w4 s6 [8,4]": (64, 128, 4, 6, 8, 4, 4, 2),
    "G M64 N128 w4 s3 [8,8]": (64, 128, 4, 3, 8, 8, 4, 2),
    "G M128 N128 w8 s3 [8,4]": (128, 128, 8, 3, 8, 4, 4, 4),
    "G M128 N64 w4 s3 [8,4]": (128, 64, 4, 3, 8, 4, 4, 4),
    "G M128 N64 w4 s5 [8,4]": (128, 64, 4, 5, 8, 4, 4, 4),
    "G M128 N128 w4 s3 [8,8]": (128, 128, 4, 3, 8, 8, 4, 2),
    "G M128 N128 w4 s4 [8,8]": (128, 128, 4, 4, 8, 8, 4, 2),
    "G M128 N128 w4 s3 [4,4]": (128, 128, 4, 3, 4, 4, 4, 2),
    "G M128 N128 w4 s3 [8,4]": (128, 128, 4, 3, 8, 4, 4, 2),
    "G M128 N128 w4 s4 [8,4]": (128, 128, 4, 4, 8, 4, 4, 2),
    "G M128 N64 w2 s3 [8,8]": (128, 64, 2, 3, 8, 8, 4, 2),
}


def runner(name, a, w, out, bk):
    r, k = a.shape
    if name == "cuBLAS":
        return lambda: torch.mm(a, w, out=out)
    if name in TRITON:
        bm, bn, nw, ns = TRITON[name]
        grid = (triton.cdiv(r, bm), triton.cdiv(k, bn))
        return lambda: triton_gemm[grid](a, w, out, r, KD=k, BM=bm, BN=bn, BK=bk, num_warps=nw, num_stages=ns)
    bm, bn, nw, ns, sm, sn, tm, wm = GLUON[name]
    grid = (triton.cdiv(r, bm), triton.cdiv(k, bn))
    return lambda: gluon_gemm[grid](a, w, out, r, KD=k, BM=bm, BN=bn, BK=bk, STAGES=ns, SPT_M=sm, SPT_N=sn,
                                    TPW_M=tm, WPC_M=wm, num_warps=nw)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--k", type=int, nargs="+", default=[448, 896, 1344])
    p.add_argument("--bk", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--variants", default=None, help="names to run, separated by ';' (default: all)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    names = ["cuBLAS", *TRITON, *GLUON]
    if args.variants:
        names = ["cuBLAS", "T M64 N64 w4 s3"] + [n for n in args.variants.split(";") if n not in ("cuBLAS", "T M64 N64 w4 s3")]
    rows = []
    for k in args.k:
        g = torch.Generator(device="cuda").manual_seed(k)
        a = torch.randn(args.rows, k, device="cuda", generator=g)
        w = torch.randn(k, k, device="cuda", generator=g) / k ** 0.5
        ref64 = (a[:4096].double() @ w.double())
        outs, fns = {}, {}
        for n in names:
            outs[n] = torch.empty(args.rows, k, device="cuda")
            try:
                fns[n] = runner(n, a, w, outs[n], args.bk)
                fns[n]()
            except Exception as exc:                     # a variant this Triton cannot build
                print(f"K={k} {n}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                fns.pop(n, None)
        samples = time_interleaved(fns, rounds=args.rounds, warmup=1, clock=clock_for("cuda"))
        base = outs["T M64 N64 w4 s3"]
        flop = 2.0 * args.rows * k * k
        for n, got in samples.items():
            med = got.median * 1e3
            err = ((outs[n][:4096].double() - ref64).norm() / ref64.norm()).item()
            same = bool(torch.equal(outs[n], base)) if n != "cuBLAS" else None
            row = dict(k=k, rows=args.rows, variant=n, ms=med, tflops=flop / med / 1e9, rel_err=err, bitwise_triton=same,
                       spread=(max(got.times) - got.minimum) / got.median)
            rows.append(row)
            print(f"K={k:5d} {n:26s} {med:8.3f} ms {row['tflops']:6.1f} TFLOP/s err {err:.2e} bits==T64: {same}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "exact_gemm_probe.json"), "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
