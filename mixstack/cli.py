"""The ``mixstack`` command: ``mixstack bench``, ``mixstack bench model``, ``mixstack tune``,
``mixstack freeze`` and ``mixstack info``.

With ``cli_deploy`` (tune, freeze), the only modules that print.
``main(argv)`` returns the exit status, so tests call it directly; the console
script ``mixstack`` and ``python -m mixstack.cli`` both run it.  Progress bars and tables use rich
(``mixstack[bench]``) when stdout is a terminal, and plain text otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from dataclasses import replace
from pathlib import Path

_LEVEL_SOURCES = {
    "use_level": "a mixstack.use_level(...) scope",
    "set_level": "mixstack.set_level(...)",
    "MIXSTACK_LEVEL": "the MIXSTACK_LEVEL environment variable",
    "default": "the default: 2 where CUDA is available, else 0",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixstack", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="device, versions, active level, and whether the Triton levels can run")
    info.add_argument("--device", help="device to report on (default: cuda if available, else cpu)")
    info.add_argument("--json", action="store_true", help="print the record as JSON")

    b = sub.add_parser("bench", help="time, peak memory and accuracy of each level (SPEC §7)",
                       description="Benchmark the mixing stack. Without options: shapes S1-S4 and "
                       "every level on a GPU; two small shapes at level 0 on a CPU (about a minute). "
                       "`mixstack bench model`: energy+forces frames of an SO2Potential on diamond and "
                       "bcc Cu cells of about 500, 2000 and 4400 atoms.")
    b.add_argument("target", nargs="?", choices=("stack", "model"), default="stack",
                   help="stack: the operator (default); model: a whole potential, energy + forces")
    b.add_argument("--shape", action="append", metavar="ID",
                   help="a standard shape: S1..S4 (GPU sizes) or C1, C4 (CPU sizes); repeatable")
    b.add_argument("--edges", type=int, help="a custom shape with this many edges E")
    b.add_argument("--focus", type=int, help="custom shape / model: focus streams F (default 2)")
    b.add_argument("--focus-dim", type=int, help="custom shape / model: channels Cf (default 32)")
    b.add_argument("--lmax", type=int, help="custom shape / model: lmax (default 3)")
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
                   "model also 1c, 2c, 3c (that level under torch.compile)")
    b.add_argument("--pass", dest="passes", action="append", metavar="PASS",
                   help="fwd, bwd (backward alone) or both (fwd+bwd); repeatable or comma-separated "
                        "(default: all three)")
    b.add_argument("--repeats", type=int, help="timed rounds per pass")
    b.add_argument("--warmup", type=int, help="untimed warm-up rounds per pass")
    b.add_argument("--check-edges", type=int, help="edges checked against float64 (default 4096)")
    b.add_argument("--device", help="device (default: cuda if available, else cpu)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--quick", action="store_true", help="one shape, few rounds: a smoke run")
    b.add_argument("--out", help="results folder (default results/bench-<date>-<device>/)")
    b.add_argument("--no-plot", action="store_true", help="write JSON and Markdown only")

    t = sub.add_parser("tune", help="measure launch configs and the fused backward on this GPU (SPEC §5)",
                       description="Sweep the tuning families for shape keys on the local GPU and "
                       "record the results in the user's table (MIXSTACK_CACHE_DIR). Without options: "
                       "the keys of S1-S4, every family; keys with an entry are skipped.")
    t.add_argument("--shape", action="append", metavar="ID", help="a standard shape S1..S4; repeatable")
    t.add_argument("--focus-dim", type=int, nargs="+", metavar="CF",
                   help="custom keys: channels Cf (with --lmax); several values sweep every combination")
    t.add_argument("--lmax", type=int, nargs="+", metavar="L", help="custom keys: lmax (with --focus-dim)")
    t.add_argument("--focus", type=int, nargs="+", default=[2], metavar="F",
                   help="custom keys: focus streams F (default 2)")
    t.add_argument("--no-alpha", action="store_true", help="custom key: apply_alpha=False")
    t.add_argument("--family", action="append", metavar="NAME",
                   help="stack_fwd, stack_bwd_relay, stack_bwd_fused, stack_compensated; repeatable "
                        "(default: all four)")
    t.add_argument("--force", action="store_true", help="measure keys that already have an entry")
    t.add_argument("--rounds", type=int, help="timed rounds (default 20)")
    t.add_argument("--warmup", type=int, help="untimed warm-up rounds (default 2)")
    t.add_argument("--margin", type=float, default=0.02,
                   help="fraction a candidate must win by, beyond the baseline's spread (default 0.02)")
    t.add_argument("--device", help="CUDA device (default: the current one)")

    fz = sub.add_parser("freeze", help="export a potential with AOTInductor into a .pt2 file (SPEC §6)",
                        description="Tune the model's mixing-stack keys on the local GPU (CUDA, level "
                        ">= 2), then torch.export the energy, forces and stress and compile them with "
                        "AOTInductor into a .pt2 that mixstack.load (or MixstackCalculator) runs. The "
                        "model: a checkpoint written by SO2Potential.save, or a new one from the options.")
    fz.add_argument("out", help="the .pt2 file to write")
    fz.add_argument("--checkpoint", help="an SO2Potential.save file (default: a new model)")
    fz.add_argument("--structure", default="diamond",
                    help="example structure: diamond, cu-bcc, or a file ASE reads (default diamond)")
    for opt, text in (("--lmax", "lmax (default 2)"), ("--focus-dim", "channels Cf (default 16)"),
                      ("--focus", "focus streams (default 2)"), ("--layers", "stack layers (default 3)"),
                      ("--blocks", "interaction blocks (default 2)")):
        fz.add_argument(opt, type=int, help=f"new model: {text}")
    fz.add_argument("--cutoff", type=float, help="new model: cutoff in Å (default 5)")
    fz.add_argument("--float64", action="store_true", help="new model: float64 weights")
    fz.add_argument("--seed", type=int, default=0, help="new model: initialisation seed (default 0)")
    fz.add_argument("--device", help="where to trace and compile (default: cpu, or the checkpoint's)")
    fz.add_argument("--no-tune", action="store_true", help="do not tune missing keys first")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``mixstack <command>``; return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "info":
            return _info(args)
        if args.command in ("tune", "freeze"):
            from . import cli_deploy
            return cli_deploy.tune(args) if args.command == "tune" else cli_deploy.freeze(args)
        return _bench(args, argv)
    except (ValueError, ImportError) as exc:
        print(f"mixstack {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------- info

def info_lines(record: dict) -> list[str]:
    """The lines ``mixstack info`` prints for an ``env.collect`` record."""
    dev = record["device"]
    if dev["type"] == "cuda":
        device = (f"{dev['name']} (cuda:{dev['index']}, sm {dev['capability']}, "
                  f"{dev['sm_count']} SMs, {dev['memory_gib']} GiB)")
    else:
        device = f"{dev['type']} ({dev['name']}, {dev['threads']} threads)"
    lvl = record["active_level"]
    triton_ok = record["triton_levels"]["available"]
    level_line = f"level: {lvl['level']}, from {_LEVEL_SOURCES.get(lvl['source'], lvl['source'])}"
    if lvl["level"] > 0 and not triton_ok:
        level_line += " (calls run level 0 here: the Triton levels cannot run)"
    return [
        f"mixstack {record['mixstack']} (git {record['git_revision'] or 'unknown'})",
        f"python {record['python']} on {record['platform']}",
        f"torch {record['torch']}, Triton {record['triton'] or 'not installed'}, "
        f"CUDA {record['cuda'] or 'none (torch built without CUDA)'}, "
        f"driver {record['driver'] or 'unknown'}",
        f"device: {device}",
        level_line,
        f"TRITON_INTERPRET: {'set' if record['triton_interpret'] else 'not set'}",
        f"Triton levels (1-3): {'can run' if triton_ok else 'cannot run'} here: "
        f"{record['triton_levels']['why']}",
    ] + [_coverage_line(t) for t in record.get("tuning_tables", [])]


def _coverage_line(table: dict) -> str:
    """One ``mixstack info`` line per tuning table: where it is and what it covers."""
    head = f"tuning table ({table['source']}): {table['path']}"
    if not table["exists"]:
        return head + ": none"
    counts = ", ".join(f"{fam} {n}" for fam, n in sorted(table["valid_entries"].items()))
    text = f"{head}: valid entries: {counts or 'none'}"
    if table["problems"]:
        text += " (" + "; ".join(table["problems"]) + ")"
    return text


def _info(args) -> int:
    from .bench import env
    from .tuning import store, validity
    record = env.collect(args.device)
    device = record["device"]
    table_device = device["name"] if device["type"] == "cuda" else validity.device_name(None)
    record["tuning_tables"] = store.coverage(table_device)
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print("\n".join(info_lines(record)))
    return 0


# -------------------------------------------------------------------- bench

def bench_config(args):
    """The ``BenchConfig`` the parsed ``bench`` arguments ask for."""
    from .bench import counts, env, runner, shapes

    device = env.resolve_device(args.device)
    cfg = runner.default_config(device, quick=args.quick)
    chosen = [shapes.shape_by_name(s) for s in args.shape or []]
    if args.edges is not None:
        chosen.append(shapes.BenchShape("custom", args.edges, _or(args.focus, 2), _or(args.focus_dim, 32),
                                        _or(args.lmax, 3), _or(args.layers, 4), not args.no_alpha))
    if chosen:
        cfg = replace(cfg, shapes=tuple(chosen))
    if args.levels:
        cfg = replace(cfg, variants=runner.parse_variants(args.levels), notes=())
    if args.passes:
        passes = [p.strip() for item in args.passes for p in item.split(",") if p.strip()]
        bad = [p for p in passes if p not in counts.PASSES]
        if bad:
            raise ValueError(f"--pass takes {', '.join(counts.PASSES)}; got {', '.join(bad)}")
        cfg = replace(cfg, passes=tuple(dict.fromkeys(passes)))
    for name, value in (("rounds", args.repeats), ("warmup", args.warmup),
                        ("check_edges", args.check_edges)):
        if value is not None:
            if value < (0 if name == "warmup" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
            cfg = replace(cfg, **{name: value})
    return replace(cfg, seed=args.seed)


def _or(value, default):
    return default if value is None else value


def _skip_notice(skipped: list[dict]) -> list[str]:
    """Group skipped variants by reason: ``L1, L2, L3 skipped: <why>``."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        by_reason.setdefault(s["reason"], []).append(s["variant"])
    return [f"skipped {', '.join(v)} (GPU levels): {why}" for why, v in by_reason.items()]


def _progress(total: int, enabled: bool):
    """A rich progress bar (context manager) and its step callback; a no-op when disabled."""
    import contextlib
    if not enabled:
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), transient=True)
    task = bar.add_task("starting", total=total)
    return bar, lambda desc: bar.update(task, advance=1, description=desc)


def _print_table(rows: list[dict], tty: bool, use_rich: bool) -> None:
    from .bench.report import markdown_table
    if not (tty and use_rich):
        print(markdown_table(rows), end="")
        return
    from rich.console import Console
    from rich.table import Table
    table = Table(show_lines=False)
    for col in rows[0]:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    Console().print(table)


def _bench(args, argv) -> int:
    from .bench import env, report, runner

    if args.target == "model":
        return _bench_model(args, argv)
    cfg = bench_config(args)
    keys, skipped = runner.plan(cfg)
    tty = sys.stdout.isatty()
    try:
        import rich  # noqa: F401
        use_rich = True
    except ImportError:
        use_rich = False
    device = env.resolve_device(cfg.device)
    print(f"mixstack bench on {device}: shapes {', '.join(s.name for s in cfg.shapes)}; "
          f"variants {', '.join(runner.VARIANTS[k] for k in keys) or 'none'}; "
          f"passes {', '.join(runner.PASS_LABELS[p] for p in cfg.passes)}; "
          f"{cfg.rounds} rounds after {cfg.warmup} warm-up")
    command = _announce("mixstack bench", keys, skipped, cfg.notes, argv)
    if command is None:
        return 2
    if tty and not use_rich:
        print("  (install mixstack[bench] for a progress bar)")
    bar, step = _progress(runner.total_steps(cfg), tty and use_rich)
    with bar:
        record = runner.run_bench(cfg, on_step=step, command=command)
    print()
    print("\n".join(report.header_lines(record)))
    _print_table(report.summary_rows(record), tty, use_rich)
    out = args.out or report.default_dir(record)
    failed = [f"{v['variant']} on {s['name']}: {v['failed']}" for s in record["shapes"]
              for v in s["variants"] if v["failed"]]
    failed += [f"timing {p} on {s['name']}: {why}" for s in record["shapes"]
               for p, why in s["failed_passes"].items()]
    return _write_results(report.write, record, out, args.no_plot, failed)


def _announce(name: str, keys, skipped, notes, argv) -> str | None:
    """Print a bench's skip notices and notes; return its command line, or ``None``
    (after saying so) when no variant can run."""
    for line in _skip_notice(skipped) + list(notes):
        print(f"  note: {line}")
    if not keys:
        print(f"{name}: nothing to run", file=sys.stderr)
        return None
    argv = sys.argv[1:] if argv is None else argv
    return "mixstack " + " ".join(shlex.quote(a) for a in argv)


def _write_results(write, record: dict, out, no_plot: bool, failed: list[str]) -> int:
    """Write a bench's result files (without the plot if matplotlib is missing), say
    where, list the failures; the exit status: 1 if anything failed."""
    try:
        paths = write(record, out, with_plot=not no_plot)
    except ImportError as exc:
        paths = write(record, out, with_plot=False)
        print(f"  note: no plot: {exc}")
    print("results: " + ", ".join(str(p) for p in paths.values()))
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


# -------------------------------------------------------------- bench model

_MODEL_OPTIONS = {"focus": "n_focus", "focus_dim": "focus_dim", "lmax": "lmax", "layers": "n_layers",
                  "blocks": "n_blocks", "cutoff": "cutoff"}


def model_bench_config(args):
    """The ``ModelBenchConfig`` the parsed ``bench model`` arguments ask for."""
    from .bench import model_bench

    stack_only = [f"--{o}" for o, v in (("shape", args.shape), ("edges", args.edges),
                                        ("pass", args.passes), ("check-edges", args.check_edges))
                  if v is not None]
    if stack_only or args.no_alpha:
        raise ValueError(f"{', '.join(stack_only or ['--no-alpha'])}: options of `mixstack bench` "
                         "(the operator), not of `mixstack bench model`")
    cfg = model_bench.default_config(args.device, quick=args.quick)
    model = dict(cfg.model)
    for opt, key in _MODEL_OPTIONS.items():
        value = getattr(args, opt)
        if value is not None:
            if value <= 0:
                raise ValueError(f"--{opt.replace('_', '-')} must be positive, got {value}")
            model[key] = value
    if not 1 <= model["lmax"] <= 6:
        raise ValueError(f"lmax must be in 1..6, got {model['lmax']}")
    cfg = replace(cfg, model=model, seed=args.seed)
    if args.cell:
        bad = [c for c in args.cell if c not in model_bench.CELLS]
        if bad:
            raise ValueError(f"unknown cell {', '.join(bad)}; use {', '.join(model_bench.CELLS)}")
        cfg = replace(cfg, cells=tuple(dict.fromkeys(args.cell)))
    if args.atoms:
        if min(args.atoms) < 1:
            raise ValueError(f"--atoms must be positive, got {min(args.atoms)}")
        cfg = replace(cfg, atoms=tuple(dict.fromkeys(args.atoms)))
    if args.levels:
        cfg = replace(cfg, variants=model_bench.parse_variants(args.levels), notes=())
    for name, value in (("rounds", args.repeats), ("warmup", args.warmup)):
        if value is not None:
            if value < (0 if name == "warmup" else 1):
                raise ValueError(f"--{'repeats' if name == 'rounds' else name} must be positive, got {value}")
            cfg = replace(cfg, **{name: value})
    return cfg


def _bench_model(args, argv) -> int:
    from .bench import env, model_bench

    cfg = model_bench_config(args)
    keys, skipped = model_bench.plan(cfg)
    device = env.resolve_device(cfg.device)
    VARIANTS = model_bench.VARIANTS
    print(f"mixstack bench model on {device}: cells {', '.join(cfg.cells)} at ~{', '.join(map(str, cfg.atoms))} "
          f"atoms; variants {', '.join(VARIANTS[k] for k in keys) or 'none'}; "
          f"{cfg.rounds} rounds after {cfg.warmup} warm-up")
    command = _announce("mixstack bench model", keys, skipped, cfg.notes, argv)
    if command is None:
        return 2
    record = model_bench.run_model_bench(cfg, command=command)
    from .bench import report
    print("\n".join(report.header_lines(record)))
    rows = model_bench.summary_rows(record)
    print(report.markdown_table(rows), end="")
    stamp = report.default_dir(record).name.replace("bench-", "bench-model-", 1)
    out = args.out or Path("results") / stamp
    failed = [f"{v['variant']} on {c['label']}: {v['failed']}" for c in record["cells"]
              for v in c["variants"] if v["failed"]]
    return _write_results(model_bench.write, record, out, args.no_plot, failed)


if __name__ == "__main__":
    sys.exit(main())
