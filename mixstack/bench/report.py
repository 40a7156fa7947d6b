"""Results files of ``mixstack bench``: JSON, a Markdown table, a long-format CSV and a PNG plot.

The JSON record (``runner.run_bench``) holds every sample; the Markdown, the
CSV (one row per measurement, for tidy analysis) and the plot are views of it,
and each carries the device, the software versions and the date, as
docs/contract.md §8 asks of every figure.  matplotlib is an optional
dependency (the ``[bench]`` extra), imported only when a plot is drawn, with
the Agg backend so that no display is needed.
"""

from __future__ import annotations

import csv
import datetime as _dt
import importlib
import json
import math
import os
from pathlib import Path

from .env import device_slug
from .runner import PASS_LABELS

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench.json", "bench.md", "bench.png"


def require_extra(module: str, extra: str = "bench"):
    """Import an optional dependency, or raise an ImportError naming the pip fix."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed for this; install it with "
                          f'`pip install -e ".[{extra}]"` from a clone of mixstack') from exc


def default_dir(record: dict, base: str | os.PathLike = "results", purpose: str = "bench") -> Path:
    """``results/<date>-<device>-<purpose>/`` (the naming of ``results/``), the date with the
    time of day so that two runs on one day do not overwrite each other."""
    stamp = _dt.datetime.fromisoformat(record["env"]["date"]).strftime("%Y-%m-%d-%H%M%S")
    return Path(base) / f"{stamp}-{device_slug(record['env']['device'])}-{purpose}"


def _num(x: float) -> str:
    """Three significant digits, never in exponent form below a million."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ms(row: dict | None) -> str:
    if row is None:
        return "—"
    return f"{_num(row['median_ms'])} [{_num(row['p20_ms'])}–{_num(row['p80_ms'])}]"


def _sci(x) -> str:
    return "—" if x is None else f"{x:.1e}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


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


def summary_rows(record: dict) -> list[dict]:
    """One row per (shape, variant): time of each pass, peak memory, errors, paths."""
    timing = {(t["shape"], t["variant"], t["pass"]): t for t in record["timings"]}
    passes = record["config"]["passes"]
    rows = []
    for shape in record["shapes"]:
        for v in shape["variants"]:
            err = v["rel_error"]
            row = {"shape": shape["name"], "variant": v["variant"]}
            for p in passes:
                row[f"{PASS_LABELS[p]} ms"] = _ms(timing.get((shape["name"], v["variant"], p)))
            row.update({
                "peak MiB": "—" if v["peak_mib"] is None else f"{v['peak_mib']:.0f}",
                "err out": _sci(err.get("out")), "err grad_u0": _sci(err.get("grad_u0")),
                "err grad_alpha": _sci(err.get("grad_alpha")),
                "paths": ", ".join(f"{k}×{n}" for k, n in v["dispatch"].items()) or "—",
                "note": v["failed"] or v["note"] or "",
            })
            rows.append(row)
    return rows


# Rounds whose p20-p80 spread exceeds this fraction of the median are flagged as noisy.
NOISY_SPREAD = 0.10


def consistency_warnings(record: dict) -> list[str]:
    """Figures that contradict themselves: rounds spread beyond ``NOISY_SPREAD`` of the
    median, or a backward alone slower than forward + backward (a busy machine).  Such
    figures should be measured again on an idle machine."""
    out = []
    by_key = {}
    for t in record["timings"]:
        by_key[(t["shape"], t["variant"], t["pass"])] = t
        if t["rel_spread"] > NOISY_SPREAD:
            out.append(f"{t['variant']} {PASS_LABELS[t['pass']]} on {t['shape']}: the rounds spread "
                       f"{100 * t['rel_spread']:.0f}% of the median; measure again on an idle machine")
    for (shape, variant, pass_), t in by_key.items():
        both = by_key.get((shape, variant, "both"))
        if pass_ == "bwd" and both and t["median_ms"] > both["median_ms"]:
            out.append(f"{variant} on {shape}: the backward alone ({t['median_ms']:.3g} ms) measured "
                       f"slower than forward + backward ({both['median_ms']:.3g} ms); measure again "
                       "on an idle machine")
    return out


def detail_rows(record: dict) -> list[dict]:
    """One row per (shape, variant, pass): statistics, rates and roof fractions."""
    return [{
        "shape": t["shape"], "variant": t["variant"], "pass": PASS_LABELS[t["pass"]],
        "median ms": f"{t['median_ms']:.4g}", "p20 ms": f"{t['p20_ms']:.4g}",
        "p80 ms": f"{t['p80_ms']:.4g}", "rounds": str(t["rounds"]),
        "GFLOP": f"{t['flops'] / 1e9:.4g}", "TFLOP/s": f"{t['tflops']:.3g}",
        "of fp32 roof": _pct(t["fp32_roof_fraction"]), "min MB": f"{t['min_bytes'] / 1e6:.4g}",
        "GB/s": f"{t['gbps']:.4g}", "of copy roof": _pct(t["copy_roof_fraction"]),
    } for t in record["timings"]]


# Columns every long-format CSV row starts with: where and with what it was measured.
CSV_ENV_COLUMNS = ("date", "gpu", "torch", "triton", "cuda", "mixstack", "git")


def env_columns(record: dict) -> dict:
    """The ``CSV_ENV_COLUMNS`` values of a bench record."""
    e = record["env"]
    return {"date": e["date"], "gpu": e["device"]["name"], "torch": e["torch"], "triton": e["triton"],
            "cuda": e["cuda"], "mixstack": e["mixstack"], "git": e["git_revision"]}


def long_rows(record: dict) -> list[dict]:
    """One row per measurement of a ``mixstack bench`` record: timings (median, p20, p80 in
    ms, per pass), peak memory and the float64 errors, each with its environment."""
    head = env_columns(record)
    rows = []
    for t in record["timings"]:
        for stat in ("median", "p20", "p80"):
            rows.append({**head, "bench": "stack", "case": t["shape"], "variant": t["variant"],
                         "metric": f"time_{stat}_{t['pass']}", "value": t[f"{stat}_ms"], "unit": "ms"})
    for shape in record["shapes"]:
        for v in shape["variants"]:
            base = {**head, "bench": "stack", "case": shape["name"], "variant": v["variant"]}
            if v["peak_mib"] is not None:
                rows.append({**base, "metric": "peak_memory", "value": v["peak_mib"], "unit": "MiB"})
            for name, err in v["rel_error"].items():
                rows.append({**base, "metric": f"rel_error_{name}", "value": err, "unit": "1"})
    return rows


def write_csv(rows: list[dict], path: str | os.PathLike) -> Path:
    """``rows`` (dicts with the same keys) as a CSV file with a header line."""
    path = Path(path)
    with path.open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


def markdown_table(rows: list[dict]) -> str:
    """``rows`` (dicts with the same keys) as a Markdown table."""
    if not rows:
        return "(none)\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def markdown(record: dict) -> str:
    """The Markdown report: header, summary table, detail table, skipped variants."""
    parts = ["# mixstack bench\n", "\n".join(f"- {line}" for line in header_lines(record)) + "\n"]
    shapes = "; ".join(f"{s['name']}: E={s['edges']} F={s['focus']} Cf={s['focus_dim']} "
                       f"lmax={s['lmax']} layers={s['layers']}" + ("" if s["apply_alpha"] else " no-alpha")
                       for s in record["shapes"])
    parts.append(f"Shapes: {shapes}.\n")
    parts.append(
        "## Summary\n\nTimes: median [p20–p80] in ms over the timed rounds, variants interleaved "
        "in rotating order. bwd = the backward alone (forward untimed), gradients of u0 and "
        "alpha. Peak MiB: device memory of one fwd+bwd above the inputs. err: ‖x − x64‖/‖x64‖ "
        "against a float64 reference on the first check_edges edges. paths: what "
        "`mixstack.dispatch_log` recorded for one fwd+bwd.\n")
    parts.append(markdown_table(summary_rows(record)))
    parts.append("\n## Rates\n\nTFLOP/s from counted matrix-product FLOPs; GB/s from the "
                 "minimum bytes of the contract (see `mixstack/bench/counts.py`).\n")
    parts.append(markdown_table(detail_rows(record)))
    extra = [f"{s['variant']} skipped: {s['reason']}" for s in record["skipped"]] + record["notes"]
    extra += [f"{s['name']} {PASS_LABELS[p]}: timing failed: {why}" for s in record["shapes"]
              for p, why in s.get("failed_passes", {}).items()]
    if extra:
        parts.append("\n## Not run\n\n" + "\n".join(f"- {x}" for x in extra) + "\n")
    warnings = consistency_warnings(record)
    if warnings:
        parts.append("\n## Warnings\n\n" + "\n".join(f"- {x}" for x in warnings) + "\n")
    return "\n".join(parts)


def plot(record: dict, path: str | os.PathLike) -> Path:
    """Time per variant per shape (bars: median; whiskers: p20–p80), one panel per shape."""
    matplotlib = require_extra("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [s["name"] for s in record["shapes"]]
    passes = record["config"]["passes"]
    timing = {(t["shape"], t["variant"], t["pass"]): t for t in record["timings"]}
    ncols = min(len(shapes), 2) or 1
    nrows = max(1, math.ceil(len(shapes) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
    width = 0.8 / max(len(passes), 1)
    for ax, shape in zip(axes.flat, record["shapes"]):
        variants = [v["variant"] for v in shape["variants"]]
        for j, p in enumerate(passes):
            xs, meds, lo, hi = [], [], [], []
            for i, v in enumerate(variants):
                t = timing.get((shape["name"], v, p))
                if t is None:
                    continue
                xs.append(i + (j - (len(passes) - 1) / 2) * width)
                meds.append(t["median_ms"])
                lo.append(t["median_ms"] - t["p20_ms"])
                hi.append(t["p80_ms"] - t["median_ms"])
            if xs:                                   # one colour per pass, in every panel
                ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=PASS_LABELS[p],
                       color=f"C{list(PASS_LABELS).index(p)}")
        ax.set_xticks(range(len(variants)), variants)
        ax.set_ylabel("ms (median, p20–p80)")
        ax.set_title(f"{shape['name']}: E={shape['edges']} F={shape['focus']} "
                     f"Cf={shape['focus_dim']} lmax={shape['lmax']}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    return save_figure(fig, plt, record, "mixstack bench", path, rect=(0, 0.06, 1, 0.95))


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


def write(record: dict, out_dir: str | os.PathLike, *, with_plot: bool = True,
          names: tuple[str, str, str] | None = None, render_markdown=None,
          render_plot=None, render_rows=None) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.md``, ``bench.csv`` and (optionally) ``bench.png`` into
    ``out_dir``.

    The JSON, Markdown and CSV are written first, so a missing matplotlib (the
    ImportError from ``plot``) never loses the measurements.  ``names`` (JSON,
    Markdown, plot; the CSV is named after the JSON), ``render_markdown``,
    ``render_plot`` and ``render_rows``: another bench's file names and renderers.
    """
    json_name, md_name, plot_name = names or (JSON_NAME, MARKDOWN_NAME, PLOT_NAME)
    to_markdown = render_markdown or markdown
    to_plot = render_plot or plot
    to_rows = render_rows or long_rows
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / json_name, "markdown": out / md_name}
    paths["json"].write_text(json.dumps(record, indent=1) + "\n")
    paths["markdown"].write_text(to_markdown(record))
    paths["csv"] = write_csv(to_rows(record), out / (Path(json_name).stem + ".csv"))
    if with_plot:
        paths["plot"] = to_plot(record, out / plot_name)
    return paths


def fmt(x, spec: str = ".2e") -> str:
    """A table cell: ``x`` formatted with ``spec``, or an em dash where there is no value."""
    return "—" if x is None else format(x, spec)
