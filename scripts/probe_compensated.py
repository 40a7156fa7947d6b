"""What holds level 3's split-fp16 GEMM back inside the stack (a GPU probe, not a test).

In the stack the compensated GEMM step of the relay runs at ~41 TFLOP/s at the
S1 key (``probe_backward.py``), where a standalone fp16x3 GEMM with the weights
split once reached 95-98 (h200-measurements.md).  This probe times one block
GEMM ``A (rows x K) @ W (K x N)`` through a small kernel built from the same
helpers (``compensated.split_fp16``, ``compensated.pow2_scales``) in modes
that each drop one piece of the shipped K loop:

- ``prepass``: the shipped form: a first pass over the row's K tiles finds each
  row's largest magnitude, then the split products;
- ``row-scale``: the row scales read from a tensor computed beforehand (what a
  producer kernel could write);
- ``unscaled``: no scaling at all (only valid for inputs already in range);
- ``head-only``: one fp16 product of the heads: the tensor-core and load ceiling;
- ``exact``: the exact fp32 FMA dot, for scale;
- ``row-scale+amax``: ``row-scale`` after a separate pass that computes the row
  scales (torch ops): what a stand-alone scaling launch would cost;
- ``row-scale persistent``, ``head-only persistent``: the same tiles computed
  by a fixed number of programs (``--per-sm`` per SM) that stride over the
  tiles, the tile loop and the K loop flattened into one pipelined loop
  (``tl.range(..., flatten=True)``), so that the next tile's loads overlap this
  tile's last products and its store.  At K = 128 a tile has only four K
  steps, so a program of the tiled launch spends much of its life filling and
  draining its pipeline; the persistent form asks how much of the gap to the
  copy roof that costs (same bits as the tiled launch, checked).

Every mode runs the same tiles, grid and stores; times come from the one
timing loop (``bench.timing``), interleaved in rotating order.  Prints a table
and writes JSON to ``--out``.

    PYTHONPATH=. python scripts/probe_compensated.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from mixstack import launch
from mixstack.bench import timing
from mixstack.kernels.compensated import TAIL_SCALE, pow2_scales, split_fp16

MODES = {"prepass": 0, "row-scale": 1, "unscaled": 2, "head-only": 3, "exact": 4}


@triton.jit
def probe_tile(pid, a_ptr, whi_ptr, wlo_ptr, w32_ptr, rowup_ptr, out_ptr, rows, w_up,
               K: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Output tile ``pid`` (row tile ``pid // NT``, column tile ``pid % NT``) in ``MODE``.
    Row offsets are int64 (the arange is), whatever the type of ``pid``."""
    NT: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    m = (pid // NT) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = (pid % NT) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = m < rows
    n_mask = n < N                      # N need not be a multiple of BLOCK_N (K = 224 at S2)
    if MODE == 0:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for t in tl.range(0, K // BLOCK_K):
            a = tl.load(a_ptr + m[:, None] * K + (t * BLOCK_K + rk)[None, :], mask=m_mask[:, None], other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
        down, up = pow2_scales(amax)
    elif MODE == 1:
        up = tl.load(rowup_ptr + m, mask=m_mask, other=1.0)
        down = 1.0 / up
    else:
        up = tl.full((BLOCK_M,), 1.0, tl.float32)
        down = up
    head = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tail = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(0, K // BLOCK_K):
        k = t * BLOCK_K
        a = tl.load(a_ptr + m[:, None] * K + (k + rk)[None, :], mask=m_mask[:, None], other=0.0)
        w_offs = (k + rk)[:, None] * N + n[None, :]
        if MODE == 4:
            head = tl.dot(a, tl.load(w32_ptr + w_offs, mask=n_mask[None, :], other=0.0), head,
                          input_precision="ieee")
        elif MODE == 3:
            head = tl.dot(a.to(tl.float16), tl.load(whi_ptr + w_offs, mask=n_mask[None, :], other=0.0), head)
        else:
            a_hi, a_lo = split_fp16(a * down[:, None])
            w_hi = tl.load(whi_ptr + w_offs, mask=n_mask[None, :], other=0.0)
            head = tl.dot(a_hi, w_hi, head)
            tail = tl.dot(a_hi, tl.load(wlo_ptr + w_offs, mask=n_mask[None, :], other=0.0), tail)
            tail = tl.dot(a_lo, w_hi, tail)
    if MODE == 4:
        acc = head
    elif MODE == 3:
        acc = head * w_up
    else:
        acc = (head + tail * (1.0 / TAIL_SCALE)) * (up * w_up)[:, None]
    tl.store(out_ptr + m[:, None] * N + n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def probe_gemm_kernel(a_ptr, whi_ptr, wlo_ptr, w32_ptr, rowup_ptr, out_ptr, rows, w_up,
                      K: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per output tile: how the shipped GEMM kernels are launched."""
    probe_tile(tl.program_id(0).to(tl.int64), a_ptr, whi_ptr, wlo_ptr, w32_ptr, rowup_ptr, out_ptr, rows, w_up,
               K, N, MODE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def probe_persistent_kernel(a_ptr, whi_ptr, wlo_ptr, w32_ptr, rowup_ptr, out_ptr, rows, w_up,
                            K: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            PROGRAMS: tl.constexpr):
    """``PROGRAMS`` programs walk the output tiles in strides; the tile loop and the K loop
    are flattened into one pipelined loop, so the next tile's first loads are in flight
    during this tile's last products and its store (modes with one K loop: not ``prepass``)."""
    tiles = tl.cdiv(rows, BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        probe_tile(tile, a_ptr, whi_ptr, wlo_ptr, w32_ptr, rowup_ptr, out_ptr, rows, w_up,
                   K, N, MODE, BLOCK_M, BLOCK_N, BLOCK_K)


PERSISTENT = ("row-scale", "head-only")      # the modes also timed as a persistent kernel


def persistent_programs(dev, per_sm: int) -> int:
    """Programs of the persistent kernel: ``per_sm`` per SM (3 in the interpreter)."""
    if dev.type != "cuda":
        return 3
    return per_sm * torch.cuda.get_device_properties(dev).multi_processor_count


def probe_block(rows, k, cfg, rounds, per_sm=2):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")     # cpu: TRITON_INTERPRET=1
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(rows, k, device=dev, generator=g)
    w = torch.randn(1, 1, k, k, device=dev, generator=g) / k ** 0.5
    w_hi, w_lo, _, _, ups = launch.split_weights(w, w)
    w_up = float(ups[0, 0, 0])

    def row_scales():
        return torch.exp2(torch.floor(torch.log2(a.abs().amax(dim=1).clamp_min(2.0 ** -126))))
    row_up = row_scales()
    out = torch.empty(rows, k, device=dev)
    want = (a.double() @ w[0, 0].double())
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    grid = (triton.cdiv(rows, bm) * triton.cdiv(k, bn),)

    programs = min(grid[0], persistent_programs(dev, per_sm))

    def run(mode):
        name, persistent = mode.removesuffix(" persistent"), mode.endswith(" persistent")
        kw = dict(K=k, N=k, MODE=MODES[name], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

        def go(_=None):
            if persistent:
                probe_persistent_kernel[(programs,)](a, w_hi, w_lo, w, row_up, out, rows, w_up,
                                                     PROGRAMS=programs, **kw)
            else:
                probe_gemm_kernel[grid](a, w_hi, w_lo, w, row_up, out, rows, w_up, **kw)
        return go

    modes = list(MODES) + [f"{m} persistent" for m in PERSISTENT]
    errors, outputs = {}, {}
    for mode in modes:
        out.fill_(float("nan"))                         # a tile left unwritten shows
        run(mode)()
        errors[mode] = ((out.double() - want).norm() / want.norm()).item()
        outputs[mode] = out.clone() if mode.removesuffix(" persistent") in PERSISTENT else None
    same = {f"{m} persistent": bool(torch.equal(outputs[m], outputs[f"{m} persistent"])) for m in PERSISTENT}
    tasks = {mode: timing.Task(run=run(mode)) for mode in modes}

    def scaled_separately(_=None):
        row_up.copy_(row_scales())
        run("row-scale")()
    tasks["row-scale+amax"] = timing.Task(run=scaled_separately)
    errors["row-scale+amax"] = errors["row-scale"]
    res = timing.time_interleaved(tasks, rounds=rounds, warmup=2, clock=timing.clock_for(dev))
    flop = 2 * rows * k * k
    return {mode: {"median_ms": s.median * 1e3, "tflops": flop / s.median / 1e12, "rel_err": errors[mode],
                   **({"same_bits_as_tiled": same[mode], "programs": programs} if mode in same else {})}
            for mode, s in res.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=2 ** 19, help="GEMM rows (S1 key: 2^18 edges x 2 streams)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-sm", type=int, default=2,
                    help="programs per SM of the persistent kernel (default 2: its split form takes 218 "
                         "registers at M64 N64 w4, two programs an SM, in the offline sm_90 report)")
    args = ap.parse_args(argv)
    configs = [{"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3},
               {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3},
               {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}]
    results = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "runs": []}
    for k in (128, 192):
        for cfg in configs:
            if k % cfg["BLOCK_N"]:
                continue
            r = probe_block(args.rows, k, cfg, args.rounds, args.per_sm)
            results["runs"].append({"K": k, "config": cfg, "modes": r})
            tag = " ".join(f"{f}={v}" for f, v in cfg.items())
            print(f"== K = N = {k}, {args.rows} rows, {tag}", flush=True)
            for mode, x in r.items():
                same = "" if "same_bits_as_tiled" not in x else f"  same bits as tiled: {x['same_bits_as_tiled']}"
                print(f"  {mode:20s} {x['median_ms']:8.3f} ms  {x['tflops']:6.1f} TFLOP/s  err {x['rel_err']:.1e}{same}")
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
