"""What the command modules share: how a command's parser is made, output (tables, progress,
results folders), the argument types every count and number option uses, and file checks.

The CLI is the only part of mixstack that prints.  Tables and progress bars use rich (the
``[bench]`` extra) when stdout is a terminal; otherwise tables are Markdown and progress is a
plain line now and then.  Nothing here imports torch: the parsers are built from this module,
and ``--help``, ``--version`` and argument errors must stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import tempfile
import time

# ``bench model``, ``bench train`` and ``freeze`` options that set an ``SO2Potential`` argument.
MODEL_OPTIONS = {"focus": "n_focus", "focus_dim": "focus_dim", "lmax": "lmax", "layers": "n_layers",
                 "blocks": "n_blocks", "cutoff": "cutoff"}
# Without a terminal, progress is a line per finished step, at most one per this many seconds.
PROGRESS_INTERVAL_S = 5.0
BENCH_EXTRA_HINT = '`pip install -e ".[bench]"` from a clone of mixstack'


# ------------------------------------------------------------------ parsers

def add_command(sub, name: str, module) -> argparse.ArgumentParser:
    """The parser of command (or bench target) ``name`` under ``sub``, made from ``module``: its
    one-line ``HELP``, its ``DESCRIPTION`` (where it has one) and its ``add_arguments(parser)``."""
    parser = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", None))
    module.add_arguments(parser)
    return parser


# ------------------------------------------------------------------ argument types

def count(minimum: int = 1):
    """The argparse type of every count option: an integer ``>= minimum``.  One validator,
    so that every count option says the same thing about a bad value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    parse.__name__ = "count"
    return parse


def count_list(minimum: int = 1):
    """``"32"`` or ``"32,64"`` -> ``(32,)`` / ``(32, 64)``, each element as ``count(minimum)``."""
    one = count(minimum)

    def parse(text: str) -> tuple[int, ...]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"must be integers >= {minimum} separated by commas, got {text!r}")
        try:
            return tuple(one(t) for t in items)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be integers >= {minimum} separated by commas, got {text!r}") from None
    parse.__name__ = "count list"
    return parse


def name_list(known: tuple[str, ...] | None = None):
    """``"a,b"`` -> ``("a", "b")``: names separated by commas, each once, each one of ``known``
    (any name when ``None``)."""
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        bad = [t for t in items if known is not None and t not in known]
        if bad or not items:
            takes = f"takes {', '.join(known)}" if known else "takes names"
            raise argparse.ArgumentTypeError(f"{takes}, separated by commas; got {text!r}")
        return items
    parse.__name__ = "name list"
    return parse


def number(minimum: float = 0.0, *, inclusive: bool = False):
    """The argparse type of every real-valued option: a number ``> minimum`` (``>=`` if ``inclusive``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"must be a number {'>=' if inclusive else '>'} {minimum:g}, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


COUNT = count(1)                      # rounds, atoms, steps, edges, channels ...
COUNT0 = count(0)                     # warm-up rounds, MD steps: zero means none
POSITIVE = number(0.0)                # seconds, Å, fs
NONNEGATIVE = number(0.0, inclusive=True)


def existing_file(option: str, path: str) -> str:
    """``path`` unchanged, or a ``ValueError`` naming the option when no such file exists."""
    if not os.path.isfile(path):
        raise ValueError(f"{option} {path}: no such file")
    return path


# ------------------------------------------------------------------ where results go

def writable_folder(option: str, path) -> str:
    """Create ``path`` and write a file in it, before any work: a ``ValueError`` naming ``option``
    when that fails (a run must not measure for an hour and then find it cannot write)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mixstack-write-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write results there ({exc.strerror or exc})") from None
    return str(path)


def writable_file(option: str, path: str) -> str:
    """``path`` unchanged when the folder it goes into can be created and written; else a
    ``ValueError`` naming ``option``."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        writable_folder(option, folder)
    except ValueError:
        raise ValueError(f"{option} {path}: cannot write {folder}") from None
    return path


def results_folder(out: str | None, device, purpose: str) -> str:
    """The folder a run writes, checked writable now: ``--out``, or a new
    ``<date>-<device>-<purpose>`` folder in the user results folder (``MIXSTACK_RESULTS_DIR``)."""
    if out:
        return writable_folder("--out", out)
    from ..core import config
    from ..measure import env, report
    path = report.run_folder(env.device_info(device), purpose)
    try:
        return writable_folder("--out", path)
    except ValueError as exc:
        raise ValueError(f"{exc}; this is the user results folder ({config.RESULTS_DIR_VARIABLE} or "
                         f"{config.default_results_dir()}): set {config.RESULTS_DIR_VARIABLE}, or pass --out") from None


# ------------------------------------------------------------------ output

def has_rich() -> bool:
    """Whether rich (the ``[bench]`` extra) is installed."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def fancy_output() -> bool:
    """Rich tables and progress bars: stdout is a terminal and rich is installed."""
    return sys.stdout.isatty() and has_rich()


class LineProgress:
    """Progress without a terminal: ``[done/total] what (elapsed)``, one line per finished step
    but at most one per ``interval`` seconds, and always the last; flushed, so a log shows it."""

    def __init__(self, total: int | None, interval: float = PROGRESS_INTERVAL_S, clock=time.monotonic):
        self.total, self.interval, self.clock = total, interval, clock
        self.done, self.t0, self.last = 0, clock(), None

    def __call__(self, description: str) -> None:
        self.done += 1
        now = self.clock()
        if self.last is not None and now - self.last < self.interval and self.done != self.total:
            return
        self.last = now
        of = f"/{self.total}" if self.total else ""
        print(f"  [{self.done}{of}] {description} ({now - self.t0:.0f} s)", flush=True)


def progress(total: int | None, *, fancy: bool | None = None, width: int = 40):
    """Progress of a long run: a context manager and its step callback ``step(description)``.
    A rich progress bar on a terminal (with rich installed), else ``LineProgress`` lines."""
    if fancy is None:
        fancy = fancy_output()
    if not fancy:
        if sys.stdout.isatty():
            print(f"  (for a progress bar, install the [bench] extra: {BENCH_EXTRA_HINT})")
        return contextlib.nullcontext(), LineProgress(total)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    bar = Progress(TextColumn("{task.description:<" + str(width) + "}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), transient=True)
    task = bar.add_task("starting", total=total)
    return bar, lambda desc: bar.update(task, advance=1, description=desc)


def print_table(rows: list[dict], fancy: bool) -> None:
    """``rows`` (dicts with the same keys) as a rich table, or as Markdown."""
    from ..measure.report import markdown_table
    if not fancy:
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


def command_line(argv) -> str:
    """The command as typed, for results files."""
    argv = sys.argv[1:] if argv is None else argv
    return "mixstack " + " ".join(shlex.quote(a) for a in argv)


def announce(name: str, keys, skipped, notes) -> bool:
    """Print a bench's skip notices and notes; ``False`` (after saying so) when no variant can run."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        by_reason.setdefault(s["reason"], []).append(s["variant"])
    lines = [f"skipped {', '.join(v)} (GPU levels): {why}" for why, v in by_reason.items()]
    for line in lines + list(notes):
        print(f"  note: {line}")
    if not keys:
        print(f"{name}: nothing to run", file=sys.stderr)
        return False
    return True


def start_bench(name: str, bench, cfg, what: str, *details: str, warnings=None):
    """Start a bench target's run: the device ``cfg.device`` names and the variants ``bench.plan(cfg)``
    runs there, said in one line, ``NAME on DEVICE: WHAT; variants ...; DETAILS; R rounds after W
    warm-up``, then ``warnings(device)``, the skip notices and the notes.  The device, or ``None``
    (after saying so) when no variant can run."""
    from ..measure import env

    keys, skipped = bench.plan(cfg)
    device = env.resolve_device(cfg.device)
    variants = ", ".join(bench.VARIANTS[k] for k in keys) or "none"
    print(f"{name} on {device}: " + "; ".join((what, f"variants {variants}", *details,
                                              f"{cfg.rounds} rounds after {cfg.warmup} warm-up")))
    for line in warnings(device) if warnings else ():
        print(f"  warning: {line}")
    return device if announce(name, keys, skipped, cfg.notes) else None


def write_results(write, record: dict, out, no_plot: bool, failed: list[str]) -> int:
    """Write a bench's result files (without the plot if matplotlib is missing), say
    where, list the failures; the exit status: 1 if anything failed."""
    try:
        paths = write(record, out, with_plot=not no_plot)
    except ImportError as exc:
        paths = write(record, out, with_plot=False)
        print(f"  note: no plot: {exc}")
    print(f"results in {out}: " + ", ".join(os.path.basename(str(p)) for p in paths.values()))
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


def write_cases(args, record: dict, bench, out, cases: str, label: str) -> int:
    """The model or training bench's header and summary table, then its result files
    (``bench.write``) and failures (``record[cases][i]["variants"]``, named by ``label``)."""
    from ..measure import report

    print("\n".join(report.header_lines(record)))
    print(report.markdown_table(bench.summary_rows(record)), end="")
    failed = [f"{v['variant']} on {c[label]}: {v['failed']}" for c in record[cases]
              for v in c["variants"] if v["failed"]]
    return write_results(bench.write, record, out, args.no_plot, failed)
