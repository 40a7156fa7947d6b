"""Triton's Hopper warp specialisation (``tl.range(..., warp_specialize=True)``, sm_90) and a
split GEMM with a per-row scale: compiled offline, no GPU needed.  No mixstack import.

Measured with Triton 3.6.0 and 3.7.1 (2026-12-02):
  BM=64,  row scale constant -> builds; both consumer partitions hold the whole 64x64 tile
  BM=64,  row scale loaded   -> builds; the same
  BM=128, row scale constant -> builds; the rows are split, a 64x64 tile per consumer
  BM=128, row scale loaded   -> fails: "PassManager::run failed" in NVGPUWarpSpecialization
  any atomic in the kernel   -> fails the same way
Run: python repro/triton_hopper_ws_partition.py
"""
import os
import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def split_gemm(a_ptr, b_ptr, c_ptr, s_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               LOADED_SCALE: tl.constexpr, ATOMIC: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_d = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    rows = pm * BM + tl.arange(0, BM)
    s = tl.load(s_ptr + rows, mask=rows < M, other=1.0) if LOADED_SCALE else tl.full((BM,), 0.5, tl.float32)
    head, tail = tl.zeros((BM, BN), tl.float32), tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K // BK, warp_specialize=True):
        a = a_d.load([pm * BM, k * BK]) * s[:, None]
        b = b_d.load([k * BK, pn * BN])
        hi = a.to(tl.float16)
        head = tl.dot(hi, b, head)
        tail = tl.dot((a - hi.to(tl.float32)).to(tl.float16), b, tail)
    out = head + tail
    tl.store(c_ptr + rows[:, None] * N + (pn * BN + tl.arange(0, BN))[None, :], out)
    if ATOMIC:
        tl.atomic_max(s_ptr + rows, tl.max(out, axis=1))


def build(bm, loaded, atomic=False):
    sig = dict(a_ptr="*fp32", b_ptr="*fp16", c_ptr="*fp32", s_ptr="*fp32", M="i32", N="i32", K="i32", BM="constexpr",
               BN="constexpr", BK="constexpr", LOADED_SCALE="constexpr", ATOMIC="constexpr")
    src = ASTSource(split_gemm, sig, constexprs={(7,): bm, (8,): 64, (9,): 32, (10,): loaded, (11,): atomic},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(7)})
    err = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)           # the pass prints its whole reproducer
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
    except Exception as exc:
        return f"fails: {str(exc).strip().splitlines()[-1]}"
    finally:
        os.dup2(err, 2)
    ttgir = compiled.asm["ttgir"]
    p0 = ttgir[ttgir.find("partition0("):ttgir.find("partition1(")]
    tiles = sorted(set(re.findall(r"warp_group_dot [^\n]*-> tensor<(\d+x\d+)xf32", p0)))
    return f"builds: {compiled.metadata.num_warps} warps, consumer partition 0's accumulators {tiles}"


print("triton", triton.__version__)
for bm in (64, 128):
    for loaded in (False, True):
        print(f"BM={bm:3d}, row scale {'loaded  ' if loaded else 'constant'} ->", build(bm, loaded))
print("BM= 64, an atomic max    ->", build(64, False, atomic=True))
