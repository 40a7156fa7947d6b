"""``mixstack tune``: measure launch configs, the fused backward and the level-3 GEMMs
on the local GPU and record them in the user's table."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time

from .common import (
    COUNT,
    COUNT0,
    NONNEGATIVE,
    POSITIVE,
    LineProgress,
    existing_file,
    fancy_output,
    print_table,
    writable_folder,
)

HELP = "measure launch configs and the fused backward on this GPU (docs/contract.md §5)"
DESCRIPTION = ("Sweep the tuning families for shape keys on the local GPU and "
               "record the results in the user's table (MIXSTACK_CACHE_DIR). Without options: "
               "the keys of S1-S4, every family; keys with an entry are skipped.")


def add_arguments(p) -> None:
    p.add_argument("--shape", action="append", metavar="ID", help="a standard shape S1..S4; repeatable")
    p.add_argument("--focus-dim", type=COUNT, nargs="+", metavar="CF",
                   help="custom keys: channels Cf (with --lmax); several values sweep every combination")
    p.add_argument("--lmax", type=COUNT, nargs="+", metavar="L", help="custom keys: lmax (with --focus-dim)")
    p.add_argument("--focus", type=COUNT, nargs="+", default=[2], metavar="F",
                   help="custom keys: focus streams F (default 2)")
    p.add_argument("--no-alpha", action="store_true", help="custom key: apply_alpha=False")
    p.add_argument("--keys-of", metavar="TABLE.json",
                   help="every shape key of a tuning table file (e.g. mixstack/tables/NVIDIA_H200.json: "
                        "re-sweep the keys it covered after a kernel change voided them)")
    p.add_argument("--family", action="append", metavar="NAME",
                   help="stack_fwd, stack_bwd_relay, stack_bwd_fused, stack_compensated, "
                        "stack_compensated_tma; repeatable (default: stack_bwd_relay and stack_compensated; "
                        "with --full all five); the training families stack_wgrad and "
                        "stack_wgrad_compensated run only when named")
    p.add_argument("--full", action="store_true",
                   help="the full candidate sets, timing set and rounds (minutes a key) instead of the "
                        "quick sweep (pruned candidates, half the timing set, 5 rounds: ~30 s a key)")
    p.add_argument("--seconds", type=POSITIVE, help="stop cleanly before the next family and key once this "
                   "many seconds are spent (run again to go on: covered keys are skipped)")
    p.add_argument("--force", action="store_true", help="measure keys that already have an entry")
    p.add_argument("--rounds", type=COUNT, help="timed rounds (default 5; --full 20)")
    p.add_argument("--warmup", type=COUNT0, help="untimed warm-up rounds (default 1; --full 2)")
    p.add_argument("--margin", type=NONNEGATIVE, default=0.02,
                   help="fraction a candidate must win by, beyond the baseline's spread (default 0.02)")
    p.add_argument("--device", help="CUDA device (default: the current one)")
    p.add_argument("--warm-workers", default="auto", metavar="N",
                   help="worker processes that compile each key's kernels before its sweep times anything "
                        "(default auto: half the cores, at most 8; 0: compile inside the sweep)")


def tune_keys(args) -> list | None:
    """The shape keys the parsed ``tune`` arguments ask for (``None``: the default S1-S4)."""
    from .. import tuning
    from ..measure import shapes

    keys = [shapes.shape_by_name(name).tuning_key() for name in args.shape or []]
    if (args.focus_dim is None) != (args.lmax is None):
        raise ValueError("a custom key needs both --focus-dim and --lmax")
    for cf, lmax, focus in itertools.product(args.focus_dim or (), args.lmax or (), args.focus):
        keys.append(tuning.shape_key(focus_dim=cf, lmax=lmax, n_focus=focus, apply_alpha=not args.no_alpha))
    if getattr(args, "keys_of", None):
        keys += table_keys(args.keys_of)
    return keys or None                              # repeated keys: the sweep measures each once


def table_keys(path: str) -> list:
    """The shape keys of every entry of a tuning table file, in the file's order, once each."""
    import json

    from ..tuning.keys import ShapeKey
    try:
        with open(existing_file("--keys-of", path), encoding="utf-8") as fh:
            entries = json.load(fh)["entries"]
        return list(dict.fromkeys(ShapeKey.parse(k) for fam in entries.values() for k in fam))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--keys-of {path}: not a mixstack tuning table ({exc})") from None


def progress(fancy: bool):
    """A rich progress bar (one line per family and key) and its callback on a terminal; else a
    line per finished sweep step, now and then (``LineProgress``)."""
    if not fancy:
        lines = LineProgress(None)
        return contextlib.nullcontext(), lambda ev: lines(f"{ev.family} {ev.key.short()}: {ev.phase} "
                                                          f"{ev.candidate} ({ev.done} of {ev.total})")
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
    from ..tuning.families import family, label
    rows = []
    for r in results:
        base, win = r.baseline_ms, r.winner_ms
        if r.status in ("failed", "not-run", "no-candidates", "no-baseline", "out-of-time"):
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


def run(args, argv=None) -> int:
    from .. import tuner, tuning
    from ..measure import prewarm
    from ..tuner import probes, sweep
    from ..tuning import store

    keys = tune_keys(args)
    workers = prewarm.resolve_workers(getattr(args, "warm_workers", "auto"), "--warm-workers")
    quick = not args.full
    names = tuner.resolve_families(args.family, quick)
    rounds = args.rounds or (sweep.QUICK_ROUNDS if quick else sweep.DEFAULT_ROUNDS)
    warmup = args.warmup if args.warmup is not None else (sweep.QUICK_WARMUP if quick else sweep.DEFAULT_WARMUP)
    device = probes.tuning_device(args.device)
    dev_name = tuning.device_name(device)
    shown = keys or tuner.default_keys()
    print(f"mixstack tune on {dev_name}: {len(shown)} key(s) ({'; '.join(k.short() for k in shown)}); "
          f"families {', '.join(names)}; {'quick' if quick else 'full'} sweep, {rounds} rounds; "
          f"results in {store.user_path(dev_name)}; "
          + (f"{workers} warm-up workers" if workers else "no warm-up workers"))
    writable_folder("the tuning table's folder (MIXSTACK_CACHE_DIR)", os.path.dirname(store.user_path(dev_name)))
    fancy = fancy_output()
    bar, step = progress(fancy)
    warmed = []
    t0 = time.monotonic()
    with bar:
        results = tuner.tune(keys, families=names, force=args.force, rounds=rounds, warmup=warmup,
                             margin=args.margin, device=device, progress=step, stop_on_error=False,
                             quick=quick, seconds=args.seconds, warm_workers=workers,
                             on_warm=lambda key, summary: warmed.append((key, summary)))
    elapsed = time.monotonic() - t0
    print()
    for key, summary in warmed:
        print(f"  warm-up {key.short()}: {summary.describe()}")
    tuned = len({r.key for r in results if r.status == "tuned"})
    print(f"  {elapsed:.1f} s in all ({sum(s.seconds for _, s in warmed):.1f} s of warm-up); "
          f"{tuned} key(s) measured" + (f", {elapsed / tuned:.1f} s a key" if tuned else ""))
    if results:
        print_table(tune_rows(results), fancy)
    for r in results:
        for lab, why in {**r.skipped, **r.rejected}.items():
            print(f"  note: {r.family} {r.key.short()}: {lab}: {why}")
    late = sorted({r.key.short() for r in results if r.status == "out-of-time"})
    if late:
        print(f"  note: --seconds ran out before {len(late)} key(s): {'; '.join(late)}; run again to go on")
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        print(f"FAILED {r.family} {r.key.short()}: {r.error}", file=sys.stderr)
    return 1 if failed else 0
