"""Registers, spills, shared memory and instruction mix of every kernel one forward and
backward of the stack launches, compiled here for an NVIDIA architecture (no GPU needed).

    PYTHONPATH=. python scripts/kernel_report.py --shape S1
    PYTHONPATH=. python scripts/kernel_report.py --shape S4 --fused 32,64,4,2
    PYTHONPATH=. python scripts/kernel_report.py --shape S1 --compensated 64,64,4,3 --arch 90

``--fused`` / ``--gemm`` / ``--compensated`` / ``--wgrad``: BLOCK_M,BLOCK_N,num_warps,num_stages of
that path (default: the level-1 relay with its default GEMM config); ``--training`` adds the
launches of a training step.  See ``mixstack.measure.compiler_report``
for how the launches are recorded and compiled, and what the numbers mean.
"""

from __future__ import annotations

import argparse
import sys

from mixstack.measure import compiler_report as resources
from mixstack.measure.shapes import STANDARD


def _cfg(text):
    if text is None:
        return None
    bm, bn, w, s = (int(x) for x in text.split(","))
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="S1", choices=sorted(STANDARD))
    p.add_argument("--gemm", help="forward/relay GEMM config BM,BN,warps,stages")
    p.add_argument("--fused", help="fused backward config BM,BN,warps,stages")
    p.add_argument("--compensated", help="level-3 GEMM config BM,BN,warps,stages")
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> (default 90: H100/H200)")
    p.add_argument("--training", action="store_true",
                   help="also the launches a training step adds (weight reductions, double backward)")
    p.add_argument("--wgrad", help="weight-reduction config BM,BN,warps,stages (compensated with --compensated)")
    args = p.parse_args(argv)
    if not resources.tools_available():
        print("this Triton does not bundle ptxas/cuobjdump/nvdisasm", file=sys.stderr)
        return 2
    shape = STANDARD[args.shape]
    comp = _cfg(args.compensated)
    launches = resources.stack_launches(shape.layout, shape.focus, shape.apply_alpha, n_layers=shape.layers,
                                        edges=shape.edges, gemm_cfg=comp or _cfg(args.gemm),
                                        fused_cfg=_cfg(args.fused), compensated=comp is not None)
    if args.training:
        launches += resources.training_launches(shape.layout, shape.focus, shape.apply_alpha, n_layers=shape.layers,
                                                edges=shape.edges, gemm_cfg=comp or _cfg(args.gemm),
                                                wgrad_cfg=_cfg(args.wgrad), compensated=comp is not None,
                                                wgrad_compensated=comp is not None)
    print(f"{shape.describe()}; sm_{args.arch}; {len(launches)} launches, distinct compiles below")
    print("| kernel | flags | config | regs | spill B | smem B | programs/SM | "
          + " | ".join(resources.COUNTED) + " |")
    print("|---" * (7 + len(resources.COUNTED)) + "|")
    for launch in resources.distinct(launches):
        r = resources.compile_report(launch, args.arch)
        flags = ",".join(k for k, v in launch.kwargs.items() if v is True) or "-"
        if "SEGMENT" in launch.kwargs:
            flags = f"segment {launch.kwargs['SEGMENT']}"
        cfg = " ".join(f"{k.replace('BLOCK_', '').replace('num_', '')}{v}" for k, v in r.config.items())
        print(f"| {r.name} | {flags} | {cfg} | {r.registers} | {r.spill_bytes} | {r.shared} | "
              f"{r.programs_per_sm()} | " + " | ".join(str(r.sass[k]) for k in resources.COUNTED) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
