"""``mixstack tune`` and ``mixstack freeze``: the commands that measure on and
deploy to the local GPU (parsed by ``mixstack.cli``, which dispatches here)."""

from __future__ import annotations

import itertools

import sys

from .cli import _MODEL_OPTIONS, _print_table


# -------------------------------------------------------------------- freeze

def freeze(args) -> int:
    import torch

    from .deploy import freeze
    from .potential import SO2Potential

    if args.checkpoint:
        model = SO2Potential.load(args.checkpoint, device=args.device)
    else:
        kw = {key: getattr(args, opt) for opt, key in _MODEL_OPTIONS.items()
              if getattr(args, opt, None) is not None}
        model = SO2Potential(**kw, seed=args.seed, device=args.device or None,
                             dtype=torch.float64 if args.float64 else None)
    if args.structure in ("diamond", "cu-bcc"):
        from .bench.model_bench import build_cell
        example = build_cell(args.structure, 16, seed=args.seed)
    else:
        try:
            from ase.io import read
        except ImportError as exc:
            raise ImportError("reading a structure needs ASE; `pip install mixstack[potential]`") from exc
        example = read(args.structure)
    print(f"mixstack freeze: {model.__class__.__name__}({model.extra_repr()}) on "
          f"{next(model.parameters()).device}, example {example.get_chemical_formula()} "
          f"({len(example)} atoms); compiling with AOTInductor (a minute or more)")
    path = freeze(model, example, args.out, tune=not args.no_tune)
    print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------- tune

def tune_keys(args) -> list | None:
    """The shape keys the parsed ``tune`` arguments ask for (``None``: the default S1-S4)."""
    from . import tuning
    from .bench import shapes

    keys = []
    for name in args.shape or []:
        keys.append(shapes.shape_by_name(name).tuning_key())
    if (args.focus_dim is None) != (args.lmax is None):
        raise ValueError("a custom key needs both --focus-dim and --lmax")
    for cf, lmax, focus in itertools.product(args.focus_dim or (), args.lmax or (), args.focus):
        keys.append(tuning.shape_key(focus_dim=cf, lmax=lmax, n_focus=focus, apply_alpha=not args.no_alpha))
    return keys or None                              # repeated keys: tuning.tune measures each once


def _tune_progress(enabled: bool):
    """A rich progress bar (one line per family and key) and its callback; no-ops when disabled."""
    import contextlib
    if not enabled:
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("{task.description:<58}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn())
    tasks = {}

    def step(ev):
        desc = f"{ev.family} {ev.key.short()}: {ev.candidate}"
        if (ev.family, ev.key) not in tasks:
            tasks[(ev.family, ev.key)] = bar.add_task(desc, total=ev.total)
        bar.update(tasks[(ev.family, ev.key)], completed=ev.done, total=ev.total, description=desc)
    return bar, step


def tune_rows(results) -> list[dict]:
    """The summary table of ``mixstack tune``: one row per family and key."""
    from .tuning.families import family, label
    rows = []
    for r in results:
        base, win = r.baseline_ms, r.winner_ms
        if r.status in ("failed", "not-run", "no-candidates"):
            entry = ""
        else:
            entry = label(r.config) if r.config is not None else f"None ({family(r.family).baseline_name})"
        rows.append({
            "family": r.family, "key": r.key.short(), "status": r.status, "entry": entry,
            "baseline ms": "" if base is None else f"{base:.3f}",
            "winner ms": "" if win is None else f"{win:.3f}",
            "speedup": "" if base is None or win is None else f"{base / win:.3f}x",
            "skipped": len(r.skipped) or "", "rejected": len(r.rejected) or "",
        })
    return rows


def tune(args) -> int:
    from . import tuning
    from .tuning import driver, probes, store, sweep

    keys = tune_keys(args)
    names = driver.resolve_families(args.family)
    for name, value in (("rounds", args.rounds), ("warmup", args.warmup)):
        if value is not None and value < (0 if name == "warmup" else 1):
            raise ValueError(f"--{name} must be positive, got {value}")
    device = probes.tuning_device(args.device)
    dev_name = tuning.device_name(device)
    shown = keys or driver.default_keys()
    print(f"mixstack tune on {dev_name}: {len(shown)} key(s) ({'; '.join(k.short() for k in shown)}); "
          f"families {', '.join(names)}; results in {store.user_path(dev_name)}")
    tty = sys.stdout.isatty()
    try:
        import rich  # noqa: F401
        use_rich = True
    except ImportError:
        use_rich = False
    bar, step = _tune_progress(tty and use_rich)
    with bar:
        results = tuning.tune(keys, families=names, force=args.force,
                              rounds=args.rounds or sweep.DEFAULT_ROUNDS,
                              warmup=sweep.DEFAULT_WARMUP if args.warmup is None else args.warmup,
                              margin=args.margin, device=device, progress=step, stop_on_error=False)
    print()
    if results:
        _print_table(tune_rows(results), tty, use_rich)
    for r in results:
        for lab, why in {**r.skipped, **r.rejected}.items():
            print(f"  note: {r.family} {r.key.short()}: {lab}: {why}")
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        print(f"FAILED {r.family} {r.key.short()}: {r.error}", file=sys.stderr)
    return 1 if failed else 0
