"""``mixstack bench grid``: every supported key (Cf, lmax, F) at each level against the compiled
reference, resumable; a heat map and the level-3 verdicts the policy reads."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from ..common import COUNT, NONNEGATIVE, POSITIVE, announce, writable_folder
from .options import STACK_LEVELS, add_check_edges, add_levels, add_passes, add_run, add_shape, check_lmax, passes

GRID_PASSES = ("fwd", "bwd", "both")

HELP = "every supported (Cf, lmax, F) against the compiled reference, resumable"
DESCRIPTION = ("Measure every supported key (Cf 16-128, lmax 1-6, F 1, 2, 4) at each level against "
               "the compiled level 0, one key file each as it finishes, then a heat map, JSON, CSV and the "
               "level-3 verdicts. Run again with --resume to go on where a run stopped.")


def add_arguments(p) -> None:
    add_shape(p, "a comma-separated subset of the grid (Cf 16,32,...,128; lmax 1..6; F 1,2,4)", lists=True)
    p.add_argument("--edges", type=COUNT, help="one edge count for every key (default: by key)")
    p.add_argument("--edge-scale", type=POSITIVE, help="scale the tuner's timing set's row floats (~0.67 GB a surface) "
                   "by this factor for each key's edge count (default 0.5)")
    add_levels(p, STACK_LEVELS)
    add_passes(p)
    add_check_edges(p)
    p.add_argument("--seconds", type=NONNEGATIVE, help="stop cleanly before a key that would not fit in "
                   "this many seconds (0: measure nothing, rebuild the outputs from --out's key files)")
    p.add_argument("--resume", action="store_true", help="skip keys already measured in --out")
    p.add_argument("--warm-workers", default="auto", metavar="N",
                   help="worker processes that compile each batch of keys before it is measured "
                        "(default auto: half the cores, at most 8; 0: compile while measuring)")
    p.add_argument("--batch-groups", type=COUNT, metavar="N",
                   help="(Cf, lmax) groups per warm-up batch (default: one per worker); the next batch "
                        "compiles while this one is measured")
    p.add_argument("--batches-ahead", type=COUNT, metavar="N",
                   help="batches handed to the workers beyond the one measured next (default 1)")
    p.add_argument("--no-warm-validations", action="store_true",
                   help="the workers do not run each key's level-3 float64 validations ahead (milliseconds "
                        "on the GPU, beside the measurement of earlier keys)")
    p.add_argument("--check", metavar="GRID",
                   help="after the run, compare --out's keys with this committed grid (a grid folder or its "
                        "grid.json) and name every key and level slower by more than its noise; exit 1 if "
                        "any (with --seconds 0: compare without measuring)")
    add_run(p, quick=None)


def config(args):
    """The ``GridConfig`` the parsed ``bench grid`` arguments ask for."""
    from ...bench import grid, stack_bench
    from ...measure import prewarm

    cfg = grid.with_subset(grid.GridConfig(device=args.device, seed=args.seed, resume=args.resume,
                                           seconds=args.seconds,
                                           warm_workers=prewarm.resolve_workers(args.warm_workers, "--warm-workers")),
                           focus_dims=args.focus_dim, lmaxes=args.lmax, focus=args.focus)
    check_lmax(*cfg.lmaxes)
    bad = [f"Cf {c}" for c in cfg.focus_dims if c % 16 or not 16 <= c <= 128]
    if bad:
        raise ValueError(f"outside the supported grid: {', '.join(bad)}")
    if args.levels:
        cfg = replace(cfg, variants=stack_bench.parse_variants(args.levels))
    if args.no_warm_validations:
        cfg = replace(cfg, warm_validations=False)
    if args.passes:
        cfg = replace(cfg, passes=passes(args, GRID_PASSES))
    for field in ("repeats", "warmup", "check_edges", "edges", "edge_scale", "batch_groups", "batches_ahead"):
        if getattr(args, field) is not None:
            cfg = replace(cfg, **{"rounds" if field == "repeats" else field: getattr(args, field)})
    return cfg


def default_out(device) -> str:
    """``<user results folder>/<device>-grid``: one folder per device, so that ``--resume`` finds it."""
    import os

    from ...core import config
    from ...measure import env
    return os.path.join(config.results_dir(), f"{env.device_slug(env.device_info(device))}-grid")


def run(args, argv=None) -> int:
    from ...bench import grid, stack_bench
    from ...measure import env

    cfg = config(args)
    baseline = None
    if args.check:
        from ...bench import grid_check
        baseline = grid_check.load(args.check)      # a bad baseline fails before any measuring
    device = env.resolve_device(cfg.device)
    keys, skipped = stack_bench.plan(cfg.bench_config(cfg.shape(*cfg.keys()[0])))
    out = args.out or default_out(device)
    print(f"mixstack bench grid on {device}: {len(cfg.keys())} keys (Cf {','.join(map(str, cfg.focus_dims))}; "
          f"lmax {','.join(map(str, cfg.lmaxes))}; F {','.join(map(str, cfg.focus))}); variants "
          f"{', '.join(stack_bench.VARIANTS[k] for k in keys) or 'none'}; {cfg.rounds} rounds; into {out}"
          + (f"; at most {cfg.seconds:.0f} s" if cfg.seconds else "") + ("; resuming" if cfg.resume else "")
          + (f"; {cfg.warm_workers} warm-up workers" if cfg.warm_workers else "; no warm-up workers"))
    if not announce("mixstack bench grid", keys, skipped, ()):
        return 2
    writable_folder("--out", out)
    t0 = time.monotonic()

    def on_key(event, name, detail):
        print(f"  [{time.monotonic() - t0:6.0f} s] {event} {name} {detail}".rstrip(), flush=True)
    if cfg.seconds == 0:                            # nothing to measure: the outputs from the key files
        have = {k: grid.key_path(out, *k).exists() for k in cfg.keys()}
        done = {"measured": [], "skipped": [grid.key_name(*k) for k, v in have.items() if v],
                "stopped": [grid.key_name(*k) for k, v in have.items() if not v]}
        print(f"  --seconds 0: no measuring; the outputs are rebuilt from the key files in {out}")
    else:
        done = grid.run_grid(cfg, out, on_key=on_key)
    try:
        paths = grid.write_outputs(out, with_plot=not args.no_plot)
    except ImportError as exc:
        paths = grid.write_outputs(out, with_plot=False)
        print(f"  note: no plot: {exc}")
    print(f"measured {len(done['measured'])}, skipped {len(done['skipped'])} (done before), "
          f"left {len(done['stopped'])} (time)")
    print(f"results in {out}: " + ", ".join(p.name for p in paths.values()))
    failed = [f"{r['key']}: {v['variant']}: {v['failed']}" for r in grid.load_records(out)
              for v in r["shape"]["variants"] if v["failed"]]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    slower = []
    if baseline is not None:
        verdict = grid_check.compare(baseline, grid.load_records(out))
        print(verdict.report())
        slower = verdict.slower
    return 1 if failed or slower else 0
