"""How fast can the stack's backward be in exact fp32 on this GPU? (a GPU probe, not a test)

Levels 1 and 2 must compute every product with Triton's exact dot,
``tl.dot(..., input_precision="ieee")`` (SPEC §3: no TF32), and level 2 must
give level 1's bits.  Issue 4 asks level 2's backward to take at most a
fraction (0.65, 0.8 at S2) of the compiled reference's time.  Whatever the
gate work costs, the backward cannot be faster than its block GEMMs alone, so
this probe measures the fastest those GEMMs can run here:

- every block product of the standard shapes, ``A (rows x K) @ W (K x K)``
  with K = m0 and m1 of the shape and rows = E * F, through the exact mode of
  ``probe_compensated.py``'s kernel (the product alone: no residual read, no
  gate work, so the bound below is optimistic for any real kernel), over a
  sweep of tile configs (``--quick``: four);
- the same product through cuBLAS (``torch.mm``, TF32 off), the vendor's
  fp32 GEMM, for scale (levels 1-2 may not use it: it is not ``tl.dot``);

then, per shape, the backward's GEMM-only lower bound: ``n_layers`` times
each block's FLOPs at the best rate measured for that block, against the
issue's target.  Times come from the one timing loop (``bench.timing``),
every variant of a block interleaved in rotating order.

    PYTHONPATH=. python scripts/probe_exact_ceiling.py --out ceiling.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import pathlib
import sys

import torch
import triton

from mixstack.bench import timing
from mixstack.bench.shapes import STANDARD, shape_by_name

_PROBE = pathlib.Path(__file__).resolve().with_name("probe_compensated.py")

# Issue 4's targets: the fraction of the compiled reference's backward, and the
# compiled reference's backward time the issue measured on the H200 (ms).
TARGET_FRACTION = {"S1": 0.65, "S2": 0.8, "S3": 0.65, "S4": 0.65}
ISSUE_COMPILE_MS = {"S1": 12.9, "S2": 31.8, "S3": 27.6, "S4": 16.6}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): eleven of the tuner's 13 exact
# GEMM candidates (tuning.families._GEMM) with the K tile of levels 1-2, and three with
# K tiles of 16 / 64 (the set the tenth session's H200 run measured).
CONFIGS = (
    (64, 128, 32, 4, 3), (64, 128, 32, 4, 4), (64, 64, 32, 4, 2), (64, 64, 32, 4, 3), (64, 64, 32, 4, 4),
    (64, 128, 32, 8, 3), (64, 64, 32, 8, 3), (32, 64, 32, 4, 3), (32, 128, 32, 4, 3), (128, 64, 32, 8, 3),
    (128, 128, 32, 8, 2), (64, 64, 16, 4, 3), (64, 128, 16, 4, 4), (64, 64, 64, 4, 2),
)
QUICK = CONFIGS[2:4] + CONFIGS[:1] + CONFIGS[11:12]


@functools.cache
def _probe_module():
    """``probe_compensated.py`` loaded once (its kernels keep their compile caches)."""
    spec = importlib.util.spec_from_file_location("probe_compensated", _PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks_of(names):
    """``{(K, rows): [shape names]}``: the distinct block GEMMs of the named shapes."""
    out: dict[tuple[int, int], list[str]] = {}
    for name in names:
        shape = shape_by_name(name)
        for k in (shape.layout.m0, shape.layout.m1):
            out.setdefault((k, shape.edges * shape.focus), []).append(shape.name)
    return out


def time_block(k: int, rows: int, configs, rounds: int, device) -> dict:
    """Every config's exact product and cuBLAS's on one block, interleaved: ms, TFLOP/s, error."""
    probe = _probe_module()
    kernel, exact = probe.probe_gemm_kernel, probe.MODES["exact"]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(rows, k, device=device, generator=g)
    w = torch.randn(k, k, device=device, generator=g) / k ** 0.5
    out = torch.empty(rows, k, device=device)
    want = a.double() @ w.double()

    def triton_run(cfg):
        bm, bn, bk, warps, stages = cfg
        grid = (triton.cdiv(rows, bm) * triton.cdiv(k, bn),)

        def go():
            kernel[grid](a, w, w, w, a, out, rows, 1.0, K=k, N=k, MODE=exact, BLOCK_M=bm, BLOCK_N=bn,
                         BLOCK_K=bk, num_warps=warps, num_stages=stages)
        return go

    def cublas():
        torch.mm(a, w, out=out)

    variants = {"cublas": cublas}
    variants.update({"M{} N{} K{} w{} s{}".format(*cfg): triton_run(cfg) for cfg in configs
                     if k % cfg[2] == 0})
    errors, refused = {}, {}
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")          # cuBLAS without TF32
    try:
        for name, fn in list(variants.items()):
            out.fill_(float("nan"))                     # a tile a variant leaves unwritten shows
            try:
                fn()
            except (triton.runtime.errors.OutOfResources, RuntimeError) as exc:   # shared memory, registers
                refused[name] = f"{type(exc).__name__}: {exc}"[:200]
                del variants[name]
                continue
            errors[name] = ((out.double() - want).norm() / want.norm()).item()
        res = timing.time_interleaved({n: timing.Task(run=fn) for n, fn in variants.items()},
                                      rounds=rounds, warmup=2, clock=timing.clock_for(device))
    finally:
        torch.set_float32_matmul_precision(previous)
    flop = 2 * rows * k * k
    rows_out = {n: {**s.to_dict(), "tflops": flop / s.median / 1e12, "rel_err": errors[n]}
                for n, s in res.items()}
    for r in rows_out.values():
        del r["samples_ms"]
    best = max((n for n in rows_out if n != "cublas"), key=lambda n: rows_out[n]["tflops"])
    return {"K": k, "rows": rows, "variants": rows_out, "refused": refused, "best_triton": best}


def lower_bounds(blocks: list[dict], names, compile_ms: dict[str, float]) -> list[dict]:
    """Per shape: the backward's GEMMs at the best measured rates, against the target."""
    rate = {(b["K"], b["rows"]): b for b in blocks}
    out = []
    for name in names:
        shape = shape_by_name(name)
        rows = shape.edges * shape.focus
        tri = cub = 0.0
        for k in (shape.layout.m0, shape.layout.m1):
            b = rate[(k, rows)]
            flop = shape.layers * 2 * rows * k * k
            tri += flop / (b["variants"][b["best_triton"]]["tflops"] * 1e12)
            cub += flop / (b["variants"]["cublas"]["tflops"] * 1e12)
        target = TARGET_FRACTION.get(shape.name, 0.65) * compile_ms[shape.name] if shape.name in compile_ms else None
        out.append({"shape": shape.name, "gemm_bound_ms_triton_ieee": tri * 1e3, "gemm_bound_ms_cublas": cub * 1e3,
                    "target_ms": target, "compile_ms": compile_ms.get(shape.name)})
    return out


def parse_compile(text: str | None) -> dict[str, float]:
    """``S1=13.4,S4=17.6`` over the issue's figures."""
    out = dict(ISSUE_COMPILE_MS)
    for part in filter(None, (text or "").split(",")):
        name, _, ms = part.partition("=")
        out[shape_by_name(name).name] = float(ms)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--shape", action="append", help="standard shapes (default: all four)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="four tile configs instead of the sweep")
    ap.add_argument("--compile-ms", help="the compiled reference's backward ms to use, e.g. S1=13.4,S4=17.6 "
                                         "(default: issue 4's figures)")
    ap.add_argument("--rows-scale", type=float, default=1.0,
                    help="shrink the rows (tests: the interpreter cannot run 600006 rows)")
    args = ap.parse_args(argv)
    names = args.shape or list(STANDARD)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")     # cpu: TRITON_INTERPRET=1
    configs = QUICK if args.quick else CONFIGS
    blocks = []
    for (k, rows), used_by in blocks_of(names).items():
        run_rows = max(1, int(rows * args.rows_scale))
        b = time_block(k, run_rows, configs, args.rounds, device)
        b["rows"] = rows                                    # the bound is for the shape's rows
        b["shapes"] = used_by
        blocks.append(b)
        best = b["variants"][b["best_triton"]]
        print(f"K = N = {k:3d}, {rows} rows ({', '.join(used_by)}): best ieee {b['best_triton']} "
              f"{best['tflops']:.1f} TFLOP/s (err {best['rel_err']:.1e}); cuBLAS "
              f"{b['variants']['cublas']['tflops']:.1f}; {len(b['refused'])} refused", flush=True)
    bounds = lower_bounds(blocks, names, parse_compile(args.compile_ms))
    print("\n| shape | GEMMs alone at the best ieee rate (ms) | at cuBLAS's rate (ms) | issue 4's target (ms) |")
    print("|---|---:|---:|---:|")
    for b in bounds:
        tgt = "-" if b["target_ms"] is None else f"{b['target_ms']:.2f}"
        print(f"| {b['shape']} | {b['gemm_bound_ms_triton_ieee']:.2f} | {b['gemm_bound_ms_cublas']:.2f} | {tgt} |")
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "blocks": blocks, "bounds": bounds}
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
