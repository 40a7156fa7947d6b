"""Regenerate the committed compiler report of the whole supported grid (no GPU needed).

Every (Cf, lmax) of the grid at F 1, exact with the level-1 configs and compensated with
the level-3 policy's configs, and every GEMM config of the shipped H200 table on its path:
each distinct launch is compiled for sm_90 with the ptxas this Triton bundles
(``mixstack.measure.compiler_report``), and its registers and spills are written to
``tests/data/compiler_grid_sm90.json`` with the kernel-source hash and the launch-set hash
they hold for.  ``tests/test_compiler_grid.py`` fails when either hash is stale or a row
breaks the rule (``compiler_report.collapse_reason``), and recompiles a few keys to prove
the file honest.  By default the gate kernels' launches (~290 compiles, ~15 minutes on 2 cores); ``--all`` every
kernel's (~1900, about an hour).

    PYTHONPATH=. python scripts/compiler_grid.py             # regenerate (resumes a cut-off run)
    PYTHONPATH=. python scripts/compiler_grid.py --check     # list the rows that break the rule
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mixstack.measure import compiler_report as cr
from mixstack.tuning import validity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "tests", "data", "compiler_grid_sm90.json")


def cases():
    return cr.grid_cases(table_configs=cr.shipped_table_configs())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=SNAPSHOT)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--check", action="store_true", help="only list the rows of --out that break the rule")
    p.add_argument("--all", action="store_true", help="every kernel's launches (~1900 compiles, about an "
                   "hour on 2 cores), not only the gate kernels'")
    args = p.parse_args(argv)
    if args.check:
        with open(args.out, encoding="utf-8") as fh:
            doc = json.load(fh)
        bad = [(k, r, cr.collapse_reason(r)) for k, r in doc["reports"].items() if cr.collapse_reason(r)]
        for k, r, why in bad:
            print(f"{k} {r['config']} {r['flags']}: {why}")
        print(f"{len(bad)} of {len(doc['reports'])} launches break the rule")
        return 1 if bad else 0
    if not cr.tools_available():
        print("this Triton does not bundle ptxas/cuobjdump/nvdisasm", file=sys.stderr)
        return 2
    partial = args.out + ".partial"
    known = {}
    if os.path.exists(partial):                      # a cut-off run: keep what it compiled
        with open(partial, encoding="utf-8") as fh:
            for line in fh:
                ident, rep = json.loads(line)
                known[ident] = rep
    grid = cases()
    kernels = None if args.all else cr.GRID_KERNELS
    t0 = time.time()
    with open(partial, "a", encoding="utf-8") as fh:
        def keep(ident, rep):
            fh.write(json.dumps([ident, rep]) + "\n")
            fh.flush()
            why = cr.collapse_reason(rep)
            print(f"{time.time() - t0:7.0f}s {ident} {rep['registers']} regs {rep['spill_bytes']} B"
                  + (f"  <-- {why}" if why else ""), flush=True)
        result = cr.compile_grid(grid, workers=args.workers, known=known, on_report=keep, kernels=kernels)
    import triton
    doc = {"format": 1, "arch": 90, "triton": triton.__version__,
           "kernel_hash": validity.kernel_source_hash(roots=cr.launched_roots(grid, kernels)),
           "launch_hash": cr.launch_set_hash(grid, kernels), "kernels": sorted(kernels) if kernels else "all",
           "spill_bound": cr.SPILL_BOUND,
           "fallback_registers": cr.FALLBACK_REGISTERS, "compile_seconds": round(time.time() - t0),
           **result}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=0, sort_keys=True)
        fh.write("\n")
    os.unlink(partial)
    bad = [k for k, r in doc["reports"].items() if cr.collapse_reason(r)]
    print(f"{len(doc['reports'])} launches over {len(grid)} cases; {len(bad)} break the rule; wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
