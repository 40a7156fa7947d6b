"""The offline sm_90 compiler report of level 3's TMA-fed, warp-specialised block GEMM
(``kernels.gemm_tma``, tiled and persistent) beside the pointer kernel it would replace, at
S1-S4's keys and the shipped table's two tiles: registers, spills, shared memory, and the
SASS that says whether the Hopper machinery is there (``HGMMA``: warpgroup MMA; ``UTMALDG``: TMA loads; ``USETMAXREG``: the
producer and consumer warp groups' register split of warp specialisation; ``SYNCS``:
mbarrier waits and arrivals).  A launch Triton cannot build is listed with its error.

Run with the GPU machine's Triton first on the path (``pip install --no-deps --target DIR
triton==3.6.0``; ``PYTHONPATH=DIR:. python scripts/tma_report.py``): the report is of the
Triton imported.  Writes JSON to ``--out`` (default: stdout only)."""

from __future__ import annotations

import argparse
import json
import sys

import triton

from mixstack.core.layout import StackLayout
from mixstack.measure import compiler_report as cr

OPCODES = cr.COUNTED + ("UTMALDG", "USETMAXREG", "SYNCS", "WARPGROUP")
# The level-3 keys of the benchmark set (S1-S4: Cf, lmax, F) and the shipped table's two tiles.
KEYS = ((32, 3, 2), (64, 3, 1), (32, 6, 1), (64, 1, 2))
TILES = ((64, 64, 4, 3), (64, 128, 4, 4))


KINDS = ("pointer", "tma", "tma persistent")


def gemm_launches(key, tile, kind: str):
    cf, lmax, n_focus = key
    cfg = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), tile))
    if kind != "pointer":
        cfg["TMA"] = True
        cfg["persistent"] = kind == "tma persistent"
    launches = cr.stack_launches(StackLayout(lmax, cf), n_focus, gemm_cfg=cfg, compensated=True)
    return [launch for launch in cr.distinct(launches) if "gemm" in launch.name]


def flags(launch) -> str:
    kw = launch.kwargs
    on = [k for k in ("A_EDGE_MAJOR", "ALPHA_ON_A", "STORE_Z", "GATE", "RESIDUAL", "ALPHA_ON_OUT", "AMAX_IN",
                      "AMAX_OUT") if kw.get(k)]
    blocks = "both" if kw.get("BOTH_BLOCKS") else f"block {kw.get('FIRST_BLOCK')}"
    return f"{blocks}: {' '.join(on) or '-'}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = []
    print(f"triton {triton.__version__}, sm_90")
    for key in KEYS:
        for tile in TILES:
            for kind in KINDS:
                for launch in gemm_launches(key, tile, kind):
                    row = dict(key=key, tile=tile, kind=kind, kernel=launch.name, flags=flags(launch))
                    try:
                        rep = cr.compile_report(launch, opcodes=OPCODES)
                        row.update(registers=rep.registers, spill_bytes=rep.spill_bytes, shared=rep.shared,
                                   warps=rep.num_warps, programs_per_sm=rep.programs_per_sm(), sass=rep.sass)
                    except Exception as exc:      # a build failure is a result here
                        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
                    rows.append(row)
                    sass = row.get("sass", {})
                    what = row.get("error") or (
                        f"{row['warps']} warps x {row['registers']} regs, {row['spill_bytes']} B spilled, "
                        f"{row['shared']} B shared, {row['programs_per_sm']}/SM; HGMMA {sass['HGMMA']} UTMALDG {sass['UTMALDG']} "
                        f"USETMAXREG {sass['USETMAXREG']} SYNCS {sass['SYNCS']} LDGSTS {sass['LDGSTS']}")
                    print(f"{key} M{tile[0]} N{tile[1]} s{tile[3]} {kind:14s} {row['flags']:40s} {what}",
                          flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(dict(triton=triton.__version__, arch=90, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
