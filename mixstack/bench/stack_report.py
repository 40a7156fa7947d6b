"""The stack bench's views of its record (``stack_bench.run_bench``): the summary and rate tables,
the long-format rows, the Markdown report and the plot, written by ``measure.report.write``."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..measure import report
from ..measure.report import env_columns, header_lines, markdown_table, quality_rows, require_extra, save_figure
from .stack_bench import PASS_LABELS

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench.json", "bench.md", "bench.png"


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
            rows += quality_rows({**head, "bench": "stack", "case": shape["name"], "variant": v["variant"]}, v)
    return rows


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
                 "minimum bytes of the contract (see `mixstack/measure/counts.py`).\n")
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


def write(record: dict, out_dir: str | os.PathLike, *, with_plot: bool = True) -> dict[str, Path]:
    """``bench.json``, ``bench.md``, ``bench.csv`` and (optionally) ``bench.png`` in ``out_dir``."""
    return report.write(record, out_dir, names=(JSON_NAME, MARKDOWN_NAME, PLOT_NAME), render_markdown=markdown,
                        render_rows=long_rows, render_plot=plot, with_plot=with_plot)
