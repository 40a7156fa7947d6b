"""Results files of every bench and sweep: a record's JSON, its Markdown, a long-format CSV (one
row per measurement, for tidy analysis) and a PNG plot, each carrying the device, the software
versions and the date (docs/contract.md §8).  A bench brings its own renderers
(``bench.stack_report`` for ``mixstack bench``); matplotlib is an optional dependency
(``mixstack[bench]``), imported only when a plot is drawn, with the Agg backend so that no
display is needed.
"""

from __future__ import annotations

import csv
import datetime as _dt
import importlib
import io
import json
import os
from pathlib import Path

from .env import device_slug


def require_extra(module: str, extra: str = "bench"):
    """Import an optional dependency, or raise an ImportError naming the pip fix."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed for this; install it with "
                          f'`pip install -e ".[{extra}]"` from a clone of mixstack') from exc


def run_folder(device: dict, purpose: str = "bench", base: str | os.PathLike | None = None,
               when: _dt.datetime | None = None) -> Path:
    """``<base>/<date>-<device>-<purpose>/`` (the naming of ``results/``), the date with the time of
    day so that two runs on one day do not overwrite each other.  ``device``: an
    ``env.device_info`` record; ``base``: the user results folder (``core.config.results_dir``)
    unless given; ``when``: now unless given."""
    from ..core import config
    stamp = (when or _dt.datetime.now()).strftime("%Y-%m-%d-%H%M%S")
    return Path(config.results_dir() if base is None else base) / f"{stamp}-{device_slug(device)}-{purpose}"


def header_lines(record: dict) -> list[str]:
    """Device, versions, date, git revision, command and roofs, one fact per line."""
    e = record["env"]
    dev = e["device"]
    roof = record.get("roof") or {}
    lines = [
        f"device: {dev['name']}" + (f" (sm {dev['capability']}, {dev['sm_count']} SMs, "
                                    f"{dev['memory_gib']} GiB)" if dev["type"] == "cuda" else
                                    f" ({dev.get('threads')} threads)"),
        f"software: mixstack {e['mixstack']}, torch {e['torch']}, Triton {e['triton']}, "
        f"CUDA {e['cuda'] or '—'}, driver {e['driver'] or '—'}, Python {e['python']}",
        f"date: {e['date']}; git: {e['git_revision'] or '—'}",
        f"command: {record.get('command') or '—'}",
    ]
    if roof:
        lines.append(f"roofs measured in this run: fp32 matmul {roof['fp32_matmul_n']}^3 "
                     f"(TF32 off) {roof['fp32_tflops']:.3g} TFLOP/s; copy {roof['copy_gbps']:.4g} GB/s")
    return lines


# Columns every long-format CSV row starts with: where and with what it was measured.
CSV_ENV_COLUMNS = ("date", "gpu", "torch", "triton", "cuda", "mixstack", "git")


def env_columns(record: dict) -> dict:
    """The ``CSV_ENV_COLUMNS`` values of a bench record."""
    e = record["env"]
    return {"date": e["date"], "gpu": e["device"]["name"], "torch": e["torch"], "triton": e["triton"],
            "cuda": e["cuda"], "mixstack": e["mixstack"], "git": e["git_revision"]}


def timing_rows(base: dict, timing: dict | None, metric: str) -> list[dict]:
    """Long-format rows of one timing (``median_ms``, ``p20_ms``, ``p80_ms``) as ``metric_<stat>``."""
    if not timing:
        return []
    return [{**base, "metric": f"{metric}_{stat}", "value": timing[f"{stat}_ms"], "unit": "ms"}
            for stat in ("median", "p20", "p80")]


def quality_rows(base: dict, variant: dict) -> list[dict]:
    """Long-format rows of one variant's peak memory (``peak_mib``) and float64 errors (``rel_error``)."""
    rows = []
    if variant.get("peak_mib") is not None:
        rows.append({**base, "metric": "peak_memory", "value": variant["peak_mib"], "unit": "MiB"})
    for name, err in (variant.get("rel_error") or {}).items():
        rows.append({**base, "metric": f"rel_error_{name}", "value": err, "unit": "1"})
    return rows


def replace_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, then
    ``os.replace``, so that a run killed while writing leaves the previous file, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_csv(rows: list[dict], path: str | os.PathLike) -> Path:
    """``rows`` (dicts; a key some rows lack is a blank cell there) as a CSV file with a header
    line, the columns in the order they first appear (written whole: ``replace_text``)."""
    text = io.StringIO(newline="")
    if rows:
        writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    return replace_text(path, text.getvalue())


def markdown_table(rows: list[dict]) -> str:
    """``rows`` (dicts with the same keys) as a Markdown table."""
    if not rows:
        return "(none)\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def not_run_section(record: dict) -> str:
    """The Markdown "Not run" section of a bench's results: skipped variants with why, and the
    config's notes (empty when there are none)."""
    extra = [f"{s['variant']} skipped: {s['reason']}" for s in record["skipped"]] + record["notes"]
    return "\n## Not run\n\n" + "\n".join(f"- {x}" for x in extra) + "\n" if extra else ""


def save_figure(fig, plt, record: dict, title: str, path: str | os.PathLike, *, rect=(0, 0.08, 1, 0.94),
                dpi: int = 120, title_size: int = 11, foot_size: int = 7) -> Path:
    """A bench figure's title (``title`` and the device), its footer (software, date, command),
    then saved to ``path`` and closed."""
    head = header_lines(record)
    fig.suptitle(title + " — " + head[0].removeprefix("device: "), fontsize=title_size)
    fig.text(0.01, 0.005, head[1] + "\n" + head[2], fontsize=foot_size, va="bottom")
    fig.tight_layout(rect=rect)
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def write(record: dict, out_dir: str | os.PathLike, *, names: tuple[str, str, str], render_markdown,
          render_rows, render_plot=None, with_plot: bool = True) -> dict[str, Path]:
    """Write a record's JSON, Markdown, CSV and (optionally) plot into ``out_dir``: ``names``
    (JSON, Markdown, plot; the CSV is named after the JSON) and the bench's renderers.

    The JSON, Markdown and CSV are written first, so a missing matplotlib (the
    ImportError from the plot) never loses the measurements; each whole or not at all
    (``replace_text``), so a bench may write its partial record as it goes.
    """
    json_name, md_name, plot_name = names
    to_markdown, to_plot, to_rows = render_markdown, render_plot, render_rows
    with_plot = with_plot and render_plot is not None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / json_name, "markdown": out / md_name}
    replace_text(paths["json"], json.dumps(record, indent=1) + "\n")
    replace_text(paths["markdown"], to_markdown(record))
    paths["csv"] = write_csv(to_rows(record), out / (Path(json_name).stem + ".csv"))
    if with_plot:
        paths["plot"] = to_plot(record, out / plot_name)
    return paths


def fmt(x, spec: str = ".2e") -> str:
    """A table cell: ``x`` formatted with ``spec``, or an em dash where there is no value."""
    return "—" if x is None else format(x, spec)
