"""``mixstack bench stack`` (and ``mixstack bench``): the operator, forward and backward, at
each level: time, peak memory and the error against float64 (docs/contract.md §8)."""

from __future__ import annotations

from dataclasses import replace

from ..common import (
    COUNT,
    command_line,
    fancy_output,
    print_table,
    progress,
    results_folder,
    start_bench,
    write_results,
)
from .options import (
    STACK_LEVELS,
    add_check_edges,
    add_levels,
    add_passes,
    add_run,
    add_shape,
    check_lmax,
    passes,
    with_rounds,
)

# A CPU run of more row-edges than this (E x F x ROW) at level 0 takes minutes: say so first.
CPU_SLOW_ELEMENTS = 20_000_000
CUSTOM = ("focus", "focus_dim", "lmax", "layers", "no_alpha")

HELP = "the operator at each level (the default target)"
DESCRIPTION = ("Time the mixing stack's forward, backward and both at each level, with peak memory "
               "and the error against float64. Without options: shapes S1-S4 and every level on a GPU; the small "
               "shapes C1 and C4 at level 0 on a CPU.")


def add_arguments(p) -> None:
    p.add_argument("--shape", action="append", metavar="ID",
                   help="a standard shape: S1..S4 (GPU sizes) or C1, C4 (CPU sizes); repeatable")
    p.add_argument("--edges", type=COUNT, help="a custom shape with this many edges E (its other sizes: "
                   "--focus, --focus-dim, --lmax, --layers, --no-alpha)")
    add_shape(p, "custom shape")
    p.add_argument("--no-alpha", action="store_true", help="custom shape: apply_alpha=False")
    add_levels(p, STACK_LEVELS)
    add_passes(p)
    add_check_edges(p)
    add_run(p)


def _or(value, default):
    return default if value is None else value


def custom_shape(args):
    """The ``--edges`` shape, or ``None``; its sizes without ``--edges`` are an error."""
    from ...measure import shapes
    if args.edges is None:
        given = [f"--{o.replace('_', '-')}" for o in CUSTOM if getattr(args, o) not in (None, False)]
        if given:
            raise ValueError(f"{', '.join(given)}: sizes of a custom shape; give its --edges too")
        return None
    check_lmax(args.lmax)
    return shapes.BenchShape("custom", args.edges, _or(args.focus, 2), _or(args.focus_dim, 32),
                             _or(args.lmax, 3), _or(args.layers, 4), not args.no_alpha)


def config(args):
    """The ``BenchConfig`` the parsed ``bench stack`` arguments ask for."""
    from ...bench import stack_bench
    from ...measure import shapes

    cfg = stack_bench.default_config(args.device, quick=args.quick)
    chosen = [shapes.shape_by_name(s) for s in args.shape or []]
    custom = custom_shape(args)
    if custom is not None:
        chosen.append(custom)
    if chosen:
        cfg = replace(cfg, shapes=tuple(chosen))
    if args.levels:
        cfg = replace(cfg, variants=stack_bench.parse_variants(args.levels), notes=())
    if args.passes:
        cfg = replace(cfg, passes=passes(args, stack_bench.PASSES))
    if args.check_edges is not None:
        cfg = replace(cfg, check_edges=args.check_edges)
    return replace(with_rounds(cfg, args), seed=args.seed)


def cpu_warnings(cfg, device) -> list[str]:
    """Shapes that take minutes at level 0 on a CPU (the GPU sizes S1-S4 do)."""
    if device.type != "cpu":
        return []
    return [f"{s.name} has {s.edges:,} edges: on a CPU each variant takes minutes at this size "
            f"(the C1 and C4 shapes are the CPU sizes)"
            for s in cfg.shapes if s.edges * s.focus * s.layout.row > CPU_SLOW_ELEMENTS]


def failures(record: dict) -> list[str]:
    """Every failed variant and timed pass of a stack bench record, one line each."""
    failed = [f"{v['variant']} on {s['name']}: {v['failed']}" for s in record["shapes"]
              for v in s["variants"] if v["failed"]]
    return failed + [f"timing {p} on {s['name']}: {why}" for s in record["shapes"]
                     for p, why in s["failed_passes"].items()]


def run(args, argv=None) -> int:
    from ...bench import stack_bench, stack_report
    from ...measure import report

    cfg = config(args)
    device = start_bench("mixstack bench", stack_bench, cfg, f"shapes {', '.join(s.name for s in cfg.shapes)}",
                         f"passes {', '.join(stack_bench.PASS_LABELS[p] for p in cfg.passes)}",
                         warnings=lambda device: cpu_warnings(cfg, device))
    if device is None:
        return 2
    out = results_folder(args.out, device, "bench")
    fancy = fancy_output()
    bar, step = progress(stack_bench.total_steps(cfg), fancy=fancy)
    with bar:
        record = stack_bench.run_bench(cfg, on_step=step, command=command_line(argv))
    print()
    print("\n".join(report.header_lines(record)))
    print_table(stack_report.summary_rows(record), fancy)
    for line in stack_report.consistency_warnings(record):
        print(f"  warning: {line}")
    return write_results(stack_report.write, record, out, args.no_plot, failures(record))
