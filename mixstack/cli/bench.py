"""``mixstack bench``: time, peak memory and accuracy of each level, for the operator
(``bench`` / ``bench stack``), for a whole potential (``bench model``), or for one training step
of either (``bench train``)."""

from __future__ import annotations

import sys
from dataclasses import replace

from .common import (
    MODEL_OPTIONS,
    announce,
    command_line,
    fancy_output,
    has_rich,
    positive,
    print_table,
    progress_bar,
    write_results,
)

# A CPU run of more row-edges than this (E x F x ROW) at level 0 takes minutes: say so first.
CPU_SLOW_ELEMENTS = 20_000_000


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time, peak memory and accuracy of each level (docs/contract.md §8)",
                       description="Benchmark the mixing stack. Without options: shapes S1-S4 and "
                       "every level on a GPU; two small shapes at level 0 on a CPU (about a minute). "
                       "`mixstack bench model`: energy+forces frames of an SO2Potential on diamond and "
                       "bcc Cu cells of about 500, 2000 and 4400 atoms. `mixstack bench train`: one "
                       "optimizer step of force-matching training, for the stack at S1-S4 and for the "
                       "potential at about 500 and 2000 atoms.")
    b.add_argument("target", nargs="?", choices=("stack", "model", "grid", "train"), default="stack",
                   help="stack: the operator (default); model: a whole potential, energy + forces; "
                        "grid: every supported (Cf, lmax, F) against the compiled reference, resumable; "
                        "train: a training step (stack and potential)")
    b.add_argument("--shape", action="append", metavar="ID",
                   help="a standard shape: S1..S4 (GPU sizes) or C1, C4 (CPU sizes); repeatable")
    b.add_argument("--edges", type=int, help="a custom shape with this many edges E")
    b.add_argument("--focus", type=_ints, help="custom shape / model: focus streams F (default 2); "
                   "grid: a comma-separated subset of 1,2,4")
    b.add_argument("--focus-dim", type=_ints, help="custom shape / model: channels Cf (default 32); "
                   "grid: a comma-separated subset of 16,32,...,128")
    b.add_argument("--lmax", type=_ints, help="custom shape / model: lmax (default 3); grid: a subset of 1..6")
    b.add_argument("--layers", type=int, help="custom shape / model: n_layers (default 4)")
    b.add_argument("--cell", action="append", metavar="NAME",
                   help="model: diamond or cu-bcc; repeatable (default both)")
    b.add_argument("--atoms", action="append", type=int, metavar="N",
                   help="model: about N atoms per cell; repeatable (default 500, 2000, 4400 on a GPU)")
    b.add_argument("--blocks", type=int, help="model: interaction blocks (default 2)")
    b.add_argument("--cutoff", type=float, help="model: cutoff in Å (default 5)")
    b.add_argument("--no-alpha", action="store_true", help="custom shape: apply_alpha=False")
    b.add_argument("--levels", help="variants, comma-separated: 0 (eager), 0c (torch.compile), 1, 2, "
                   "2f (level 2 with the fused backward forced), 3; "
                   "model also 1c, 2c, 3c (that level under torch.compile) and 1g, 2g, 3g (that level replayed "
                   "from a CUDA graph)")
    b.add_argument("--pass", dest="passes", action="append", metavar="PASS",
                   help="fwd, bwd (backward alone) or both (fwd+bwd); repeatable or comma-separated "
                        "(default: all three)")
    b.add_argument("--repeats", type=int, help="timed rounds per pass")
    b.add_argument("--warmup", type=int, help="untimed warm-up rounds per pass")
    b.add_argument("--check-edges", type=int, help="edges checked against float64 (default 4096)")
    b.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--breakdown", action="store_true",
                   help="model: where each variant's frame time goes, stage by stage, forward and backward")
    b.add_argument("--md-steps", type=int, metavar="N",
                   help="model: NVE steps (1 fs) per variant at ~4400 atoms through the ASE calculator: "
                        "steps/s, ns/day, µs/atom/step, energy drift (default 100 on a GPU, 0 = none)")
    b.add_argument("--md-atoms", type=int, action="append", metavar="N",
                   help="model: the cell sizes (--atoms values) that run MD; repeatable (default 4400)")
    b.add_argument("--quick", action="store_true", help="one shape, few rounds: a smoke run")
    b.add_argument("--out", help="results folder (default results/<date>-<device>-bench/)")
    b.add_argument("--no-plot", action="store_true", help="write JSON, Markdown and CSV only")
    b.add_argument("--seconds", type=float, help="grid: stop cleanly before a key that would not fit in "
                   "this many seconds (0: measure nothing, rebuild the outputs from --out's key files)")
    b.add_argument("--resume", action="store_true", help="grid: skip keys already measured in --out")
    b.add_argument("--warm-workers", default="auto", metavar="N",
                   help="grid: worker processes that compile each batch of keys before it is measured "
                        "(default auto: half the cores, at most 8; 0: compile while measuring)")


def _ints(text: str) -> tuple[int, ...]:
    """``"32"`` or ``"32,64"`` -> ``(32,)`` / ``(32, 64)``."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected integers separated by commas, got {text!r}") from None


def _single(args) -> None:
    """``stack`` and ``model`` take one value of --focus, --focus-dim and --lmax."""
    for opt in ("focus", "focus_dim", "lmax"):
        value = getattr(args, opt)
        if isinstance(value, tuple):
            if len(value) != 1:
                raise ValueError(f"--{opt.replace('_', '-')} takes one value here (lists are for `bench grid`)")
            setattr(args, opt, value[0])


def _or(value, default):
    return default if value is None else value


def bench_config(args):
    """The ``BenchConfig`` the parsed ``bench`` arguments ask for."""
    from ..bench import stack_bench
    from ..measure import counts, env, shapes

    _single(args)
    model_only = [f"--{o}" for o, v in (("breakdown", args.breakdown or None), ("md-steps", args.md_steps),
                                        ("md-atoms", args.md_atoms)) if v is not None]
    if model_only:
        raise ValueError(f"{', '.join(model_only)}: options of `mixstack bench model`, not of `mixstack bench`")
    device = env.resolve_device(args.device)
    cfg = stack_bench.default_config(device, quick=args.quick)
    chosen = [shapes.shape_by_name(s) for s in args.shape or []]
    if args.edges is not None:
        positive("--edges", args.edges, allow_zero=True)
        for opt in ("focus", "focus_dim", "layers"):
            positive(f"--{opt.replace('_', '-')}", getattr(args, opt))
        chosen.append(shapes.BenchShape("custom", args.edges, _or(args.focus, 2), _or(args.focus_dim, 32),
                                        _or(args.lmax, 3), _or(args.layers, 4), not args.no_alpha))
    if chosen:
        cfg = replace(cfg, shapes=tuple(chosen))
    if args.levels:
        cfg = replace(cfg, variants=stack_bench.parse_variants(args.levels), notes=())
    if args.passes:
        passes = [p.strip() for item in args.passes for p in item.split(",") if p.strip()]
        bad = [p for p in passes if p not in counts.PASSES]
        if bad:
            raise ValueError(f"--pass takes {', '.join(counts.PASSES)}; got {', '.join(bad)}")
        cfg = replace(cfg, passes=tuple(dict.fromkeys(passes)))
    for option, field, value in (("--repeats", "rounds", args.repeats), ("--warmup", "warmup", args.warmup),
                                 ("--check-edges", "check_edges", args.check_edges)):
        if value is not None:
            cfg = replace(cfg, **{field: positive(option, value, allow_zero=field == "warmup")})
    return replace(cfg, seed=args.seed)


def model_bench_config(args):
    """The ``ModelBenchConfig`` the parsed ``bench model`` arguments ask for."""
    from ..bench import model_bench

    _single(args)
    stack_only = [f"--{o}" for o, v in (("shape", args.shape), ("edges", args.edges),
                                        ("pass", args.passes), ("check-edges", args.check_edges))
                  if v is not None]
    if stack_only or args.no_alpha:
        raise ValueError(f"{', '.join(stack_only or ['--no-alpha'])}: options of `mixstack bench` "
                         "(the operator), not of `mixstack bench model`")
    cfg = model_bench.default_config(args.device, quick=args.quick)
    model = dict(cfg.model)
    for opt, key in MODEL_OPTIONS.items():
        value = getattr(args, opt)
        if value is not None:
            model[key] = positive(f"--{opt.replace('_', '-')}", value)
    if not 1 <= model["lmax"] <= 6:
        raise ValueError(f"--lmax must be in 1..6, got {model['lmax']}")
    cfg = replace(cfg, model=model, seed=args.seed)
    if args.cell:
        bad = [c for c in args.cell if c not in model_bench.CELLS]
        if bad:
            raise ValueError(f"--cell {', '.join(bad)}: unknown cell; use {', '.join(model_bench.CELLS)}")
        cfg = replace(cfg, cells=tuple(dict.fromkeys(args.cell)))
    if args.atoms:
        positive("--atoms", min(args.atoms))
        cfg = replace(cfg, atoms=tuple(dict.fromkeys(args.atoms)))
    if args.levels:
        cfg = replace(cfg, variants=model_bench.parse_variants(args.levels), notes=())
    for option, field, value in (("--repeats", "rounds", args.repeats), ("--warmup", "warmup", args.warmup)):
        if value is not None:
            cfg = replace(cfg, **{field: positive(option, value, allow_zero=field == "warmup")})
    if args.breakdown:
        cfg = replace(cfg, breakdown=True)
    if args.md_steps is not None:
        cfg = replace(cfg, md_steps=positive("--md-steps", args.md_steps, allow_zero=True))
    if args.md_atoms:
        positive("--md-atoms", min(args.md_atoms))
        cfg = replace(cfg, md_atoms=tuple(dict.fromkeys(args.md_atoms)))
    return cfg


def cpu_warnings(cfg, device) -> list[str]:
    """Shapes that take minutes at level 0 on a CPU (the GPU sizes S1-S4 do)."""
    if device.type != "cpu":
        return []
    return [f"{s.name} has {s.edges:,} edges: on a CPU each variant takes minutes at this size "
            f"(the C1 and C4 shapes are the CPU sizes)"
            for s in cfg.shapes if s.edges * s.focus * s.layout.row > CPU_SLOW_ELEMENTS]


def train_bench_config(args):
    """The ``TrainBenchConfig`` the parsed ``bench train`` arguments ask for: ``--shape`` picks the
    stack cases, ``--atoms`` / ``--cell`` the potential's (either alone drops the other workload)."""
    from ..bench import train_bench
    from ..measure import shapes

    cfg = train_bench.default_config(args.device, quick=args.quick)
    if args.shape or args.atoms:
        cfg = replace(cfg, shapes=tuple(shapes.shape_by_name(s) for s in args.shape or []),
                      atoms=tuple(dict.fromkeys(positive("--atoms", a) for a in args.atoms or [])))
    model = dict(cfg.model)
    for opt, key in MODEL_OPTIONS.items():
        if getattr(args, opt) is not None:
            model[key] = positive(f"--{opt.replace('_', '-')}", getattr(args, opt))
    cfg = replace(cfg, model=model, seed=args.seed)
    if args.cell:
        from ..bench.model_bench import CELLS
        if len(args.cell) > 1 or args.cell[0] not in CELLS:
            raise ValueError(f"--cell {' '.join(args.cell)}: bench train takes one cell, {' or '.join(CELLS)}")
        cfg = replace(cfg, cell=args.cell[0])
    if args.levels:
        cfg = replace(cfg, variants=train_bench.parse_variants(args.levels), notes=())
    for option, field, value in (("--repeats", "rounds", args.repeats), ("--warmup", "warmup", args.warmup)):
        if value is not None:
            cfg = replace(cfg, **{field: positive(option, value, allow_zero=field == "warmup")})
    return cfg


def run(args, argv=None) -> int:
    if args.target == "grid":
        return _run_grid(args, argv)
    _single(args)
    if args.target == "model":
        return _run_model(args, argv)
    if args.target == "train":
        return _run_train(args, argv)
    from ..bench import stack_bench, stack_report
    from ..measure import env, report

    cfg = bench_config(args)
    keys, skipped = stack_bench.plan(cfg)
    device = env.resolve_device(cfg.device)
    fancy = fancy_output()
    print(f"mixstack bench on {device}: shapes {', '.join(s.name for s in cfg.shapes)}; "
          f"variants {', '.join(stack_bench.VARIANTS[k] for k in keys) or 'none'}; "
          f"passes {', '.join(stack_bench.PASS_LABELS[p] for p in cfg.passes)}; "
          f"{cfg.rounds} rounds after {cfg.warmup} warm-up")
    for line in cpu_warnings(cfg, device):
        print(f"  warning: {line}")
    if not announce("mixstack bench", keys, skipped, cfg.notes):
        return 2
    if sys.stdout.isatty() and not has_rich():
        print('  (for a progress bar, install the [bench] extra: `pip install -e ".[bench]"` from a clone of mixstack)')
    bar, step = progress_bar(stack_bench.total_steps(cfg), fancy)
    with bar:
        record = stack_bench.run_bench(cfg, on_step=step, command=command_line(argv))
    print()
    print("\n".join(report.header_lines(record)))
    print_table(stack_report.summary_rows(record), fancy)
    for line in stack_report.consistency_warnings(record):
        print(f"  warning: {line}")
    out = args.out or report.default_dir(record)
    failed = [f"{v['variant']} on {s['name']}: {v['failed']}" for s in record["shapes"]
              for v in s["variants"] if v["failed"]]
    failed += [f"timing {p} on {s['name']}: {why}" for s in record["shapes"]
               for p, why in s["failed_passes"].items()]
    return write_results(stack_report.write, record, out, args.no_plot, failed)


def _run_model(args, argv) -> int:
    from ..bench import model_bench
    from ..measure import env, report

    cfg = model_bench_config(args)
    keys, skipped = model_bench.plan(cfg)
    device = env.resolve_device(cfg.device)
    names = model_bench.VARIANTS
    print(f"mixstack bench model on {device}: cells {', '.join(cfg.cells)} at ~{', '.join(map(str, cfg.atoms))} "
          f"atoms; variants {', '.join(names[k] for k in keys) or 'none'}; "
          f"{cfg.rounds} rounds after {cfg.warmup} warm-up")
    if not announce("mixstack bench model", keys, skipped, cfg.notes):
        return 2
    n_cells = len(cfg.cells) * len(cfg.atoms)

    def keep(partial):              # each finished cell is on disk: a run cut off keeps them
        done = len(partial["cells"])
        if done < n_cells:
            folder = args.out or report.default_dir(partial, purpose="bench-model")
            model_bench.write(partial, folder, with_plot=False)
            print(f"  {partial['cells'][-1]['label']} done ({done} of {n_cells} cells); written to {folder}")

    record = model_bench.run_model_bench(cfg, command=command_line(argv), on_cell=keep)
    return _show_and_write(args, record, model_bench, "cells", "label", "bench-model")


def _show_and_write(args, record: dict, bench, cases: str, label: str, purpose: str) -> int:
    """The model or training bench's header and summary table, then its result files
    (``bench.write``) and failures (``record[cases][i]["variants"]``, named by ``label``)."""
    from ..measure import report

    print("\n".join(report.header_lines(record)))
    print(report.markdown_table(bench.summary_rows(record)), end="")
    out = args.out or report.default_dir(record, purpose=purpose)
    failed = [f"{v['variant']} on {c[label]}: {v['failed']}" for c in record[cases]
              for v in c["variants"] if v["failed"]]
    return write_results(bench.write, record, out, args.no_plot, failed)


def _run_train(args, argv) -> int:
    from ..bench import train_bench
    from ..measure import env

    cfg = train_bench_config(args)
    keys, skipped = train_bench.plan(cfg)
    device = env.resolve_device(cfg.device)
    print(f"mixstack bench train on {device}: stack {', '.join(s.name for s in cfg.shapes) or '—'}; potential "
          f"{', '.join(f'~{a}' for a in cfg.atoms) or '—'} atoms; variants "
          f"{', '.join(train_bench.VARIANTS[k] for k in keys) or 'none'}; {cfg.rounds} rounds after "
          f"{cfg.warmup} warm-up")
    if not announce("mixstack bench train", keys, skipped, cfg.notes):
        return 2
    bar, step = progress_bar(train_bench.total_steps(cfg), fancy_output())
    with bar:
        record = train_bench.run_train_bench(cfg, on_step=step, command=command_line(argv))
    return _show_and_write(args, record, train_bench, "cases", "case", "bench-train")

def grid_config(args):
    """The ``GridConfig`` the parsed ``bench grid`` arguments ask for."""
    from ..bench import grid, stack_bench

    other = [f"--{o}" for o, v in (("shape", args.shape), ("cell", args.cell), ("atoms", args.atoms),
                                   ("blocks", args.blocks), ("cutoff", args.cutoff), ("layers", args.layers),
                                   ("breakdown", args.breakdown or None), ("md-steps", args.md_steps),
                                   ("md-atoms", args.md_atoms))
             if v is not None]
    if other or args.no_alpha or args.quick:
        raise ValueError(f"{', '.join(other or ['--no-alpha / --quick'])}: not an option of `mixstack bench grid`")
    from ..measure import prewarm
    cfg = grid.with_subset(grid.GridConfig(device=args.device, seed=args.seed, resume=args.resume,
                                           seconds=positive("--seconds", args.seconds, allow_zero=True),
                                           warm_workers=prewarm.resolve_workers(args.warm_workers, "--warm-workers")),
                           focus_dims=args.focus_dim, lmaxes=args.lmax, focus=args.focus)
    bad = [f"Cf {c}" for c in cfg.focus_dims if c % 16 or not 16 <= c <= 128]
    bad += [f"lmax {x}" for x in cfg.lmaxes if not 1 <= x <= 6] + [f"F {x}" for x in cfg.focus if x < 1]
    if bad:
        raise ValueError(f"outside the supported grid: {', '.join(bad)}")
    if args.levels:
        cfg = replace(cfg, variants=stack_bench.parse_variants(args.levels))
    if args.passes:
        passes = tuple(dict.fromkeys(p.strip() for item in args.passes for p in item.split(",") if p.strip()))
        if not set(passes) <= {"fwd", "bwd", "both"}:
            raise ValueError(f"--pass takes fwd, bwd, both; got {', '.join(passes)}")
        cfg = replace(cfg, passes=passes)
    for option, field, value in (("--repeats", "rounds", args.repeats), ("--warmup", "warmup", args.warmup),
                                 ("--check-edges", "check_edges", args.check_edges), ("--edges", "edges", args.edges)):
        if value is not None:
            cfg = replace(cfg, **{field: positive(option, value, allow_zero=field == "warmup")})
    return cfg


def _run_grid(args, argv) -> int:
    import time

    from ..bench import grid, stack_bench
    from ..measure import env

    cfg = grid_config(args)
    device = env.resolve_device(cfg.device)
    out = args.out or "results/grid"
    keys, skipped = stack_bench.plan(cfg.bench_config(cfg.shape(*cfg.keys()[0])))
    print(f"mixstack bench grid on {device}: {len(cfg.keys())} keys (Cf {','.join(map(str, cfg.focus_dims))}; "
          f"lmax {','.join(map(str, cfg.lmaxes))}; F {','.join(map(str, cfg.focus))}); variants "
          f"{', '.join(stack_bench.VARIANTS[k] for k in keys) or 'none'}; {cfg.rounds} rounds; into {out}"
          + (f"; at most {cfg.seconds:.0f} s" if cfg.seconds else "") + ("; resuming" if cfg.resume else "")
          + (f"; {cfg.warm_workers} warm-up workers" if cfg.warm_workers else "; no warm-up workers"))
    if not announce("mixstack bench grid", keys, skipped, ()):
        return 2
    t0 = time.monotonic()

    def on_key(event, name, detail):
        print(f"  [{time.monotonic() - t0:6.0f} s] {event} {name} {detail}".rstrip(), flush=True)
    done = grid.run_grid(cfg, out, on_key=on_key)
    try:
        paths = grid.write_outputs(out, with_plot=not args.no_plot)
    except ImportError as exc:
        paths = grid.write_outputs(out, with_plot=False)
        print(f"  note: no plot: {exc}")
    print(f"measured {len(done['measured'])}, skipped {len(done['skipped'])} (done before), "
          f"left {len(done['stopped'])} (time)")
    print("results: " + ", ".join(str(p) for p in paths.values()))
    failed = [f"{r['key']}: {v['variant']}: {v['failed']}" for r in grid.load_records(out)
              for v in r["shape"]["variants"] if v["failed"]]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0
