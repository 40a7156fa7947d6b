"""``mixstack bench train``: one optimizer step of force-matching training, for the stack and for
the potential, at each level: time, peak memory and every gradient's error against float64."""

from __future__ import annotations

from dataclasses import replace

from ..common import COUNT, command_line, progress, results_folder, start_bench, write_cases
from .options import TRAIN_LEVELS, add_levels, add_potential, add_run, add_shape, model_with, with_rounds

HELP = "one force-matching training step: the stack and the potential"
DESCRIPTION = ("Time one optimizer step of force-matching training at each level, for the stack at "
               "S1-S4 and for the potential at about 500 and 2000 atoms, with peak memory and every gradient's "
               "error against float64. --shape picks the stack cases, --atoms / --cell the potential's; either "
               "alone drops the other workload.")


def add_arguments(p) -> None:
    p.add_argument("--shape", action="append", metavar="ID",
                   help="stack cases: a standard shape S1..S4 or C1, C4; repeatable")
    p.add_argument("--atoms", action="append", type=COUNT, metavar="N",
                   help="potential cases: about N atoms; repeatable (default 500, 2000 on a GPU)")
    p.add_argument("--cell", metavar="NAME", help="the potential's cell: diamond (default) or cu-bcc")
    add_shape(p, "potential")
    add_potential(p)
    add_levels(p, TRAIN_LEVELS)
    add_run(p)


def config(args):
    """The ``TrainBenchConfig`` the parsed ``bench train`` arguments ask for."""
    from ...bench import train_bench
    from ...bench.model_bench import CELLS
    from ...measure import shapes

    cfg = train_bench.default_config(args.device, quick=args.quick)
    if args.shape or args.atoms:
        cfg = replace(cfg, shapes=tuple(shapes.shape_by_name(s) for s in args.shape or []),
                      atoms=tuple(dict.fromkeys(args.atoms or [])))
    cfg = replace(cfg, model=model_with(args, cfg.model), seed=args.seed)
    if args.cell:
        if args.cell not in CELLS:
            raise ValueError(f"--cell {args.cell}: unknown cell; use {' or '.join(CELLS)}")
        cfg = replace(cfg, cell=args.cell)
    if args.levels:
        cfg = replace(cfg, variants=train_bench.parse_variants(args.levels), notes=())
    return with_rounds(cfg, args)


def run(args, argv=None) -> int:
    from ...bench import train_bench

    cfg = config(args)
    device = start_bench("mixstack bench train", train_bench, cfg,
                         f"stack {', '.join(s.name for s in cfg.shapes) or '—'}; potential "
                         f"{', '.join(f'~{a}' for a in cfg.atoms) or '—'} atoms")
    if device is None:
        return 2
    out = results_folder(args.out, device, "bench-train")
    bar, step = progress(train_bench.total_steps(cfg))
    with bar:
        record = train_bench.run_train_bench(cfg, on_step=step, command=command_line(argv))
    return write_cases(args, record, train_bench, out, "cases", "case")
