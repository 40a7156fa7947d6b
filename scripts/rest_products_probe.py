"""The rest of deepmd-kit's model's products, one at a time: exact fp32 (cuBLAS, TF32 off) against
``mixstack.deepmd.rest_products.product`` run eagerly (its split as separate passes) and compiled
by Inductor (the split fused, as in deepmd-kit's compiled inference), and against
``product_kernel`` (one Triton kernel, ``A`` split in registers) at each of ``--kernel-config``'s
launch configs, at the shapes of the water and 2-stream configs' products at ~4,000 atoms
(mixstack's stack excluded).  Interleaved CUDA-event medians of each variant's CUDA-graph replay
(the device's time, as in a replayed frame; with ``--eager-calls`` each call as issued, the host's
launches included), the error of each against float64 relative to ``|a| @ |b|``, and whether
``rest_products.eligible`` takes the product.

    PYTHONPATH=. python scripts/rest_products_probe.py --out DIR [--shape NAME ...] [--scale 1.0]

``--scale`` multiplies the rows that grow with the system (a CPU dry run: ``--device cpu --scale
0.002 --no-compile``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from mixstack.deepmd import rest_products
from mixstack.measure.timing import clock_for, time_interleaved
from mixstack.potential.graphs import graph_replay

DEFAULT_CONFIGS = ["64,0,32,3", "128,0,32,3", "64,0,64,3", "128,0,64,2", "64,256,32,3", "64,256,64,2"]
EDGES, NODES = 316_554, 4_000       # the water frame at ~4,000 atoms (rcut 6)
# name: (batch, M, K, N, which of M / N grows with the system); from a dispatch trace of each
# config's frame (mixstack's operators whole), counted at 300 atoms and scaled
SHAPES = {
    "water-grid-mlp-192": (1, 27 * NODES, 192, 192, "M"),
    "water-grid-mlp-96": (1, 27 * NODES, 96, 96, "M"),
    "water-grid-to-s2": (1, 104, 27, 96 * NODES, "N"),
    "water-grid-from-s2": (1, 27, 104, 96 * NODES, "N"),
    "water-edge-32-64": (1, EDGES, 32, 64, "M"),
    "water-edge-25-256": (1, EDGES, 25, 256, "M"),
    "water-node-l-576": (9, NODES, 32, 576, "M"),
    "two-stream-grid-mlp-96": (1, 48 * NODES, 96, 96, "M"),
    "two-stream-grid-mlp-192": (1, 48 * NODES, 192, 192, "M"),
    "two-stream-to-s2": (1, 152, 48, 96 * NODES, "N"),
    "two-stream-from-s2": (1, 48, 152, 96 * NODES, "N"),
    "two-stream-edge-32-96": (2, EDGES, 32, 96, "M"),
    "two-stream-node-l-576": (16, NODES, 32, 576, "M"),
}


def operands(batch, m, k, n, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(batch, m, k, generator=gen, device=device)
    b = torch.randn(batch, k, n, generator=gen, device=device)
    return a.squeeze(0) if batch == 1 else a, b.squeeze(0) if batch == 1 else b


def relative_error(out, a, b) -> float:
    exact = a.double() @ b.double()
    return ((out.double() - exact).abs() / (a.double().abs() @ b.double().abs()).clamp_min(1e-300)).max().item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="(repeatable; default all)")
    p.add_argument("--scale", type=float, default=1.0, help="factor on the rows that grow with the system")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-compile", action="store_true", help="skip the Inductor-compiled form")
    p.add_argument("--eager-calls", action="store_true",
                   help="time each call as issued, the host's launches included (default on a GPU: each "
                        "variant's CUDA-graph replay, as a replayed frame runs it)")
    p.add_argument("--kernel-config", action="append", default=None, metavar="BM,BN,BK,STAGES",
                   help="a launch config of the kernel form, BN 0 for the kernel's own column tile (repeatable; "
                        "default 64,0,32,3 128,0,32,3 64,0,64,3 128,0,64,2 64,256,32,3 64,256,64,2)")
    p.add_argument("--out", default=None, help="folder for rest_products_probe.json")
    args = p.parse_args(argv)
    try:
        configs = [tuple(int(v) for v in c.split(",")) for c in (args.kernel_config or DEFAULT_CONFIGS)]
        if any(len(c) != 4 for c in configs):
            raise ValueError
    except ValueError:
        p.error("--kernel-config takes BM,BN,BK,STAGES, e.g. 64,0,32,3")
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    print(f"{'shape':26} {'B,M,K,N':>26} {'eligible':>8} {'fp32 ms':>9} {'eager x':>8} {'compiled x':>10} "
          f"{'best kernel x':>14} {'config':>14} {'err fp32':>9} {'err comp':>9} {'err kern':>9}")
    for name in args.shape or SHAPES:
        batch, m, k, n, grows = SHAPES[name]
        m, n = (max(16, int(m * args.scale)), n) if grows == "M" else (m, max(16, int(n * args.scale)))
        a, b = operands(batch, m, k, n, device)
        eligible = rest_products.eligible(a, b, cpu=device.type == "cpu")
        variants = {"fp32": lambda: a @ b, "eager": lambda: rest_products.product(a, b)}
        if not args.no_compile:             # one compile a shape: no recompile limit reached across shapes
            compiled = torch.compile(rest_products.product, dynamic=False)
            variants["compiled"] = lambda: compiled(a, b)
        if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            for bm, bn, bk, stages in configs:
                variants[f"kernel-{bm}-{bn or 'auto'}-{bk}-{stages}"] = (
                    lambda bm=bm, bn=bn, bk=bk, stages=stages: rest_products.product_kernel(
                        a, b, block_m=bm, block_n=bn or None, block_k=bk, num_stages=stages))
        if device.type == "cuda" and not args.eager_calls:
            variants = {key: graph_replay(fn, device) for key, fn in variants.items()}
        samples = time_interleaved(variants, rounds=args.rounds, warmup=2, clock=clock_for(device))
        med = {key: s.median * 1e3 for key, s in samples.items()}
        errors = {"fp32": relative_error(a @ b, a, b), "compensated": relative_error(rest_products.product(a, b), a, b)}
        if any(key.startswith("kernel") for key in variants):
            errors["kernel"] = relative_error(rest_products.product_kernel(a, b), a, b)
        rows.append({"shape": name, "batch": batch, "m": m, "k": k, "n": n, "eligible": eligible, "ms": med,
                     "error": errors})
        ratio = {key: med["fp32"] / v for key, v in med.items()}
        nan = float("nan")
        best = max((key for key in ratio if key.startswith("kernel")), key=ratio.get, default=None)
        kernels = f"{ratio[best]:14.2f} {best[7:]:>14}" if best else f"{nan:14.2f} {'-':>14}"
        print(f"{name:26} {f'{batch},{m},{k},{n}':>26} {str(eligible):>8} {med['fp32']:9.3f} {ratio['eager']:8.2f} "
              f"{ratio.get('compiled', nan):10.2f} {kernels} {errors['fp32']:9.1e} {errors['compensated']:9.1e} "
              f"{errors.get('kernel', nan):9.1e}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "rest_products_probe.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
