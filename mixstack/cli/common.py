"""What the command modules share: output (tables, progress bars, results files),
the model options of ``bench model`` and ``freeze``, and argument checks.

The CLI is the only part of mixstack that prints.  Tables and progress bars use
rich (the ``[bench]`` extra) when stdout is a terminal, plain text otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys

# ``bench model`` and ``freeze`` options that set an ``SO2Potential`` argument.
MODEL_OPTIONS = {"focus": "n_focus", "focus_dim": "focus_dim", "lmax": "lmax", "layers": "n_layers",
                 "blocks": "n_blocks", "cutoff": "cutoff"}


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


def progress_bar(total: int, enabled: bool, width: int = 40):
    """A rich progress bar (context manager) and its step callback ``step(description)``;
    a no-op pair when disabled."""
    if not enabled:
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("{task.description:<" + str(width) + "}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), transient=True)
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


def write_results(write, record: dict, out, no_plot: bool, failed: list[str]) -> int:
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


def positive(name: str, value, *, allow_zero: bool = False):
    """``value`` unchanged, or a ``ValueError`` naming the option when it is not positive."""
    if value is not None and value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value}")
    return value


def existing_file(option: str, path: str) -> str:
    """``path`` unchanged, or a ``ValueError`` naming the option when no such file exists."""
    if not os.path.isfile(path):
        raise ValueError(f"{option} {path}: no such file")
    return path
