"""``mixstack bench model``: energy + forces frames of an ``SO2Potential`` at each level, where a
frame's time goes (``--breakdown``) and NVE molecular dynamics (``--md-steps``)."""

from __future__ import annotations

from dataclasses import replace

from ..common import COUNT, COUNT0, command_line, progress, results_folder, start_bench, write_cases
from .options import MODEL_LEVELS, add_levels, add_potential, add_run, add_shape, model_with, with_rounds

CELL_NAMES = "diamond or cu-bcc"          # potential.cells.CELLS, which imports nothing light enough for --help

HELP = "a whole potential: energy + forces frames, breakdown, MD"
DESCRIPTION = ("Time energy + forces frames of an SO2Potential on diamond and bcc Cu cells of about "
               "500, 2000 and 4400 atoms at each level, with peak memory and the deviation from the compiled "
               "level 0 and from float64. On a CPU: ~64-atom cells at level 0.")


def add_arguments(p) -> None:
    p.add_argument("--cell", action="append", metavar="NAME", help=f"{CELL_NAMES}; repeatable (default both)")
    p.add_argument("--atoms", action="append", type=COUNT, metavar="N",
                   help="about N atoms per cell; repeatable (default 500, 2000, 4400 on a GPU)")
    add_shape(p, "model")
    add_potential(p)
    add_levels(p, MODEL_LEVELS)
    p.add_argument("--breakdown", action="store_true",
                   help="where each variant's frame time goes, stage by stage, forward and backward")
    p.add_argument("--md-steps", type=COUNT0, metavar="N",
                   help="NVE steps (1 fs) per variant through the ASE calculator: steps/s, ns/day, "
                        "µs/atom/step, energy drift (default 100 on a GPU, 0 = none)")
    p.add_argument("--md-atoms", type=COUNT, action="append", metavar="N",
                   help="the cell sizes (--atoms values) that run MD; repeatable (default 4400)")
    add_run(p, quick="one cell size, few rounds: a smoke run")


def config(args):
    """The ``ModelBenchConfig`` the parsed ``bench model`` arguments ask for."""
    from ...bench import model_bench

    cfg = model_bench.default_config(args.device, quick=args.quick)
    cfg = replace(cfg, model=model_with(args, cfg.model), seed=args.seed)
    if args.cell:
        bad = [c for c in args.cell if c not in model_bench.CELLS]
        if bad:
            raise ValueError(f"--cell {', '.join(bad)}: unknown cell; use {', '.join(model_bench.CELLS)}")
        cfg = replace(cfg, cells=tuple(dict.fromkeys(args.cell)))
    if args.atoms:
        cfg = replace(cfg, atoms=tuple(dict.fromkeys(args.atoms)))
    if args.levels:
        cfg = replace(cfg, variants=model_bench.parse_variants(args.levels), notes=())
    if args.breakdown:
        cfg = replace(cfg, breakdown=True)
    if args.md_steps is not None:
        cfg = replace(cfg, md_steps=args.md_steps)
    if args.md_atoms:
        cfg = replace(cfg, md_atoms=tuple(dict.fromkeys(args.md_atoms)))
    return with_rounds(cfg, args)


def run(args, argv=None) -> int:
    from ...bench import model_bench

    cfg = config(args)
    device = start_bench("mixstack bench model", model_bench, cfg,
                         f"cells {', '.join(cfg.cells)} at ~{', '.join(map(str, cfg.atoms))} atoms")
    if device is None:
        return 2
    out = results_folder(args.out, device, "bench-model")
    n_cells = len(cfg.cells) * len(cfg.atoms)

    def keep(partial):              # each finished cell is on disk: a run cut off keeps them
        done = len(partial["cells"])
        if done < n_cells:
            model_bench.write(partial, out, with_plot=False)
            print(f"  {partial['cells'][-1]['label']} done ({done} of {n_cells} cells); written to {out}", flush=True)

    bar, step = progress(None)
    with bar:
        record = model_bench.run_model_bench(cfg, command=command_line(argv), on_step=step, on_cell=keep)
    return write_cases(args, record, model_bench, out, "cells", "label")
