"""The scaling report: one row per point, parallel efficiency, where a step goes; JSON, Markdown,
a long CSV and a plot (``measure.report``'s writer and environment columns).

Per point: steps per second; parallel efficiency against the fewest ranks of
the same system (strong: ``s_R / (s_b * R / R_b)``; weak, per atom:
``(s_R * N_R / R) / (s_b * N_b / R_b)``); a step's milliseconds split into
LAMMPS's own sections, averaged over ranks (``neigh``: neighbour lists;
``comm``: sending positions to ghosts and ghost forces back, and waiting for
the slowest rank; ``other``: integration and output) and the pair style's
share (``pair``), itself split by the model calls' phases, averaged over
ranks (``copy``: host to device and back; ``graph``: the rank's graph on the
device; ``model``: energy and forces; ``host``: the rest: the plugin's pair
list, the Python callback, adding forces); peak device memory per GPU (the
ranks on one GPU added up) and per evaluated edge.  A run with more ranks
than GPUs is a dry run of the procedure, flagged as such.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from ..measure.report import CSV_ENV_COLUMNS, env_columns, markdown_table, require_extra, write

log = logging.getLogger(__name__)

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "scaling.json", "scaling.md", "scaling.png"
SCHEMA = "mixstack-scaling/1"
SLOW_CALL_RATIO = 3.0          # a timed model call this many times the mean is reported
PHASE_COLUMNS = ("step_ms", "pair_ms", "model_ms", "graph_ms", "copy_ms", "host_ms", "neigh_ms", "comm_ms",
                 "other_ms")


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def point_row(record: dict) -> dict:
    """The figures of one point record (efficiency is filled in by ``rows``)."""
    p = record["scaling_point"]
    calls = record.get("model_calls") or []
    steps = record["config"]["steps"]
    sps = record.get("steps_per_second")
    sections = record.get("lammps_sections") or {}
    gpu_devices = sorted({(c.get("host"), c.get("device")) for c in calls
                          if str(c.get("device", "")).startswith("cuda")})
    row = {"series": p["series"], "structure": p["structure"], "atoms": record["atoms"],
           "atoms_per_rank": record["atoms"] / record["ranks"], "system_atoms": p["atoms"],
           "model": p["model"], "level": p["level"], "ranks": record["ranks"], "gpus": len(gpu_devices),
           "ranks_per_gpu": record["ranks"] / len(gpu_devices) if gpu_devices else None,
           "device": (record.get("env") or {}).get("device", {}).get("name"),
           "steps": steps, "steps_per_s": sps, "atom_steps_per_s": sps * record["atoms"] if sps else None,
           "step_ms": 1e3 / sps if sps else None}

    def section(*names):
        return 1e3 * sum(sections.get(n, 0.0) for n in names) / steps if sections and steps else None

    row.update(pair_ms=section("Pair"), neigh_ms=section("Neigh"), comm_ms=section("Comm"),
               other_ms=section("Modify", "Output", "Other"))
    if calls:
        def phase(name):
            return 1e3 * _mean(c["seconds_per_call"][name] for c in calls)
        row.update(model_ms=phase("model"), graph_ms=phase("graph"), copy_ms=phase("to_device") + phase("to_host"))
        if row["pair_ms"] is not None:
            row["host_ms"] = row["pair_ms"] - row["model_ms"] - row["graph_ms"] - row["copy_ms"]
        row.update(
            rank_local_atoms=max(c.get("local_atoms_per_call", 0) for c in calls),
            rank_edges=max(c["edges_per_call"] for c in calls),
            ghost_per_local=_mean((c["lammps_atoms_per_call"] - c["local_atoms_per_call"]) / c["local_atoms_per_call"]
                                  for c in calls if c.get("local_atoms_per_call")),
            h2d_MB=max(c["h2d_bytes_per_call"] for c in calls) / 1e6,
            d2h_MB=max(c["d2h_bytes_per_call"] for c in calls) / 1e6)
        peaks: dict = {}
        for c in calls:
            if c.get("peak_memory_bytes"):
                key = (c.get("host"), c.get("device"))
                peaks[key] = peaks.get(key, 0) + c["peak_memory_bytes"]
        if peaks:
            row["peak_GiB_per_gpu"] = max(peaks.values()) / 2**30
            row["peak_bytes_per_edge"] = max(c["peak_memory_bytes"] / c["edges_per_call"] for c in calls
                                             if c.get("peak_memory_bytes") and c["edges_per_call"])
        row["rank_devices"] = ", ".join(f"{c.get('rank')}:{c.get('device')}" for c in calls)
        row["paths"] = ", ".join(f"{k}×{n}" for k, n in (calls[0].get("paths") or {}).items()) or None
        mean_call = 1e-3 * (row["model_ms"] + row["graph_ms"] + row["copy_ms"])
        row["slowest_call_ms"] = 1e3 * max(c.get("slowest_call_seconds", 0.0) for c in calls)
        row["slowest_call_ratio"] = row["slowest_call_ms"] / (1e3 * mean_call) if mean_call > 0 else None
    return row


def system_key(row: dict) -> tuple:
    return (row["series"], row["structure"], row["system_atoms"], row["model"], row["level"])


def rows(records: list[dict]) -> list[dict]:
    """One row per point, sorted by system then ranks, with speed-up and parallel efficiency."""
    out = [point_row(r) for r in records]
    out.sort(key=lambda r: (r["series"] != "strong", str(r["level"]), r["structure"], r["system_atoms"],
                            r["model"], r["ranks"]))
    bases: dict = {}
    for r in out:
        if r["steps_per_s"] and system_key(r) not in bases:
            bases[system_key(r)] = r
    for r in out:
        b = bases.get(system_key(r))
        if not b or not r["steps_per_s"]:
            continue
        r["base_ranks"] = b["ranks"]
        r["speedup"] = r["steps_per_s"] / b["steps_per_s"]
        if r["series"] == "strong":
            r["efficiency"] = r["speedup"] * b["ranks"] / r["ranks"]
        else:
            r["efficiency"] = (r["steps_per_s"] * r["atoms"] / r["ranks"]) / (b["steps_per_s"] * b["atoms"] / b["ranks"])
    return out


def is_dry_run(table: list[dict]) -> bool:
    """More ranks than GPUs anywhere, or no GPU at all: the figures are not scaling figures."""
    return any(r["gpus"] == 0 or (r["ranks_per_gpu"] or 1) > 1 for r in table)


def report_doc(records: list[dict], checks: list[dict], plan: dict) -> dict:
    """The JSON document behind every view."""
    env = next((r["env"] for r in records if r.get("env")), None)
    table = rows(records)
    models = {}
    for r in records:
        models.setdefault(r["scaling_point"]["model"], r["model"])
    outcome = (plan or {}).get("outcome") or {}
    return {"schema": SCHEMA, "env": env, "lammps": (env or {}).get("lammps"), "dry_run": is_dry_run(table),
            "command": (plan or {}).get("command"), "models": models, "rows": table, "checks": checks,
            "not_done": {k: v for k, v in outcome.items() if v.get("status") != "done"}, "plan": plan}


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


TABLE_COLUMNS = ("structure", "atoms", "atoms_per_rank", "model", "level", "ranks", "gpus", "steps_per_s", "speedup", "efficiency",
                 *PHASE_COLUMNS, "rank_edges", "ghost_per_local", "peak_GiB_per_gpu", "peak_bytes_per_edge", "paths")


def markdown(doc: dict) -> str:
    """The report as Markdown."""
    env = doc.get("env") or {}
    dev = env.get("device", {})
    table = doc["rows"]
    lines = ["# mixstack md in LAMMPS: scaling over GPUs", ""]
    if doc["dry_run"]:
        lines += ["**DRY RUN**: more MPI ranks than GPUs (ranks share GPUs round robin) or no GPU. This checks "
                  "the procedure; its steps/s and efficiencies are not scaling figures.", ""]
    lines += [f"- device: {dev.get('name')} ×{max((r['gpus'] for r in table), default=0)} used; "
              f"torch {env.get('torch')}, Triton {env.get('triton')}, CUDA {env.get('cuda') or '—'}, "
              f"LAMMPS {doc.get('lammps')}, Python {env.get('python')}",
              f"- date: {env.get('date')}; git: {env.get('git_revision')}",
              f"- command: {doc.get('command') or '—'}"]
    for name, cfg in doc["models"].items():
        lines.append(f"- model {name}: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "seed"))
    lines += ["- steps_per_s: timed NVE steps after untimed warm-up steps; speedup and efficiency against the "
              "fewest ranks of the same system (weak: per atom); ms per step: LAMMPS's sections averaged over "
              "ranks (pair, neigh, comm, other) and the pair style's model calls averaged over ranks (model, "
              "graph, copy = host-device copies, host = the rest of pair); rank_edges: edges the busiest rank "
              "evaluates; ghost_per_local: ghost atoms LAMMPS hands over per local atom; peak memory: the ranks "
              "of one GPU added up; paths: what the stack ran on rank 0 in the timed steps (`dispatch_log`)", ""]
    for series, title in (("strong", "Strong scaling"), ("weak", "Weak scaling")):
        part = [r for r in table if r["series"] == series]
        if part:
            lines += [f"## {title}", "",
                      markdown_table([{c: _fmt(r.get(c)) for c in TABLE_COLUMNS} for r in part]), ""]
    outliers = [r for r in table if (r.get("slowest_call_ratio") or 0) > SLOW_CALL_RATIO]
    if outliers:
        lines += ["## Outliers", ""] + [
            f"- {r['series']} {r['structure']} {r['atoms']} L{r['level']} x{r['ranks']}: one model call took "
            f"{r['slowest_call_ms']:.3g} ms, {r['slowest_call_ratio']:.1f}x the mean (most likely a kernel "
            f"compiled for a new edge count inside the timed steps; its steps/s is pessimistic)" for r in outliers]
        lines.append("")
    if doc["checks"]:
        lines += ["## Step-0 energy and forces against the fewest ranks", "",
                  "force_rel: max |F_R - F_base| / max |F_base| over atoms (by atom ID) and components; "
                  "energy_rel: |E_R - E_base| / |E_base|; both must stay within the float32 tolerance.", "",
                  markdown_table([{k: _fmt(c[k]) for k in ("structure", "atoms", "model", "level", "base_ranks",
                                                           "ranks", "energy_rel", "energy_diff_per_atom",
                                                           "force_rel", "force_tolerance", "ok")}
                                  for c in doc["checks"]]), ""]
    if doc["not_done"]:
        lines += ["## Not measured", ""]
        for name, o in doc["not_done"].items():
            why = (o.get("why") or "").strip().splitlines()
            lines.append(f"- {name}: {o['status']}" + (f": {why[0]}" if why else ""))
        lines.append("")
    return "\n".join(lines)


def long_rows(doc: dict) -> list[dict]:
    """One CSV row per figure: the environment columns, the point, metric, value, unit."""
    head = env_columns(doc) if doc.get("env") else dict.fromkeys(CSV_ENV_COLUMNS)
    units = {"steps_per_s": "1/s", "atom_steps_per_s": "1/s", "speedup": "1", "efficiency": "1",
             **dict.fromkeys(PHASE_COLUMNS, "ms"), "slowest_call_ms": "ms", "rank_edges": "1", "ghost_per_local": "1",
             "h2d_MB": "MB", "d2h_MB": "MB", "peak_GiB_per_gpu": "GiB", "peak_bytes_per_edge": "B"}
    out = []
    for r in doc["rows"]:
        base = {**head, "bench": "scaling", "series": r["series"], "structure": r["structure"],
                "atoms": r["atoms"], "model": r["model"], "level": r["level"], "ranks": r["ranks"],
                "gpus": r["gpus"], "dry_run": doc["dry_run"]}
        for metric, unit in units.items():
            if r.get(metric) is not None:
                out.append({**base, "metric": metric, "value": r[metric], "unit": unit})
    for c in doc["checks"]:
        base = {**head, "bench": "scaling", "series": c["series"], "structure": c["structure"], "atoms": c["atoms"],
                "model": c["model"], "level": c["level"], "ranks": c["ranks"], "gpus": None,
                "dry_run": doc["dry_run"]}
        for metric in ("energy_rel", "energy_diff_per_atom", "force_rel"):
            out.append({**base, "metric": f"check_{metric}", "value": c[metric],
                        "unit": "eV/atom" if metric == "energy_diff_per_atom" else "1"})
    return out


def plot(doc: dict, path) -> Path:
    """Steps per second (strong) and efficiency (strong and weak) against ranks."""
    matplotlib = require_extra("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    curves: dict = {}
    for r in doc["rows"]:
        curves.setdefault(system_key(r), []).append(r)
    for key, pts in curves.items():
        pts = [p for p in pts if p.get("steps_per_s")]
        if not pts:
            continue
        series, structure, atoms, model, level = key
        label = f"{series} {structure} {atoms} {Path(model).stem} L{level}"
        xs = [p["ranks"] for p in pts]
        if series == "strong":
            (line,) = ax1.plot(xs, [p["steps_per_s"] for p in pts], "o-", label=label)
            b = pts[0]
            ax1.plot(xs, [b["steps_per_s"] * x / b["ranks"] for x in xs], "--", color=line.get_color(), alpha=0.4)
        ax2.plot(xs, [p.get("efficiency") for p in pts], "o-" if series == "strong" else "s:", label=label)
    ticks = sorted({r["ranks"] for r in doc["rows"]})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("MPI ranks (one GPU each)" if not doc["dry_run"] else "MPI ranks (sharing GPUs: dry run)")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("steps/s (dashed: ideal)")
    ax1.set_title("strong scaling")
    ax2.set_ylabel("parallel efficiency")
    ax2.set_title("efficiency (strong: o-, weak per atom: s:)")
    ax2.axhline(1.0, color="k", lw=0.5)
    for ax in (ax1, ax2):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    env = doc.get("env") or {}
    fig.suptitle(f"mixstack md in LAMMPS — {(env.get('device') or {}).get('name')}"
                 + (" — DRY RUN, not scaling figures" if doc["dry_run"] else ""), fontsize=11)
    fig.text(0.01, 0.005, f"torch {env.get('torch')}, Triton {env.get('triton')}, LAMMPS {doc.get('lammps')}; "
             f"{env.get('date')}; git {env.get('git_revision')}", fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(out_dir, records: list[dict], checks: list[dict], plan: dict, *, with_plot: bool = True) -> dict:
    """``scaling.json``, ``scaling.md``, ``scaling.csv`` and (with matplotlib) ``scaling.png`` in ``out_dir``."""
    doc = report_doc(records, checks, plan)
    paths = write(doc, out_dir, with_plot=False, names=(JSON_NAME, MARKDOWN_NAME, PLOT_NAME),
                  render_markdown=markdown, render_rows=long_rows)
    if with_plot and doc["rows"]:
        try:
            paths["plot"] = plot(doc, Path(out_dir) / PLOT_NAME)
        except ImportError as exc:              # the tables are written; the plot needs the [bench] extra
            log.warning("no scaling plot: %s", exc)
    return paths
