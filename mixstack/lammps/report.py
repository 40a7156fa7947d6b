"""A table of ``mixstack md`` records: steps per second against the ASE path, and where a step goes.

    python -m mixstack.lammps.report DIR      # reads DIR/*.json, writes DIR/lammps.json and DIR/lammps.md

Per run: engine and ranks, atoms, model, steps per second and the speed-up
over the ASE run of the same structure and model; per model call (the
slowest rank's): atoms and edges the rank evaluates, milliseconds to the
device, building the graph, in the model (energy and forces) and back,
megabytes and copies each way, peak device memory; LAMMPS's own seconds per
step outside the pair style (neighbour lists, communication, integration).
"""

from __future__ import annotations

import glob
import json
import os
import sys

SUMMARY_JSON, SUMMARY_MD = "lammps.json", "lammps.md"


def _key(record: dict) -> tuple:
    cfg = record["config"]
    return (cfg["structure"], record["atoms"], cfg["model"], record.get("model_dtype"))


def _slowest(calls: list[dict] | None) -> dict | None:
    if not calls:
        return None
    return max(calls, key=lambda c: sum(c["seconds_per_call"].values()))


def rows(records: list[dict]) -> list[dict]:
    """One row per record, with the speed-up over the ASE record of the same structure and model."""
    ase = {_key(r): r for r in records if r["config"]["engine"] == "ase"}
    out = []
    for r in sorted(records, key=lambda r: (r["atoms"], r["config"]["model"], r["config"]["engine"] != "ase",
                                            r["ranks"])):
        cfg, sps = r["config"], r.get("steps_per_second")
        base = ase.get(_key(r))
        row = {"run": f"{cfg['engine']} x{r['ranks']}", "structure": cfg["structure"], "atoms": r["atoms"],
               "model": cfg["model"], "device": (r.get("env") or {}).get("device", {}).get("name"),
               "steps": cfg["steps"], "steps_per_s": sps,
               "vs_ase": sps / base["steps_per_second"] if sps and base and base.get("steps_per_second") else None,
               "drift_eV_per_atom": r.get("max_energy_drift_per_atom")}
        call = _slowest(r.get("model_calls"))
        if call:
            ms = {k: 1e3 * v for k, v in call["seconds_per_call"].items()}
            row.update({"rank_atoms": call["atoms_per_call"], "rank_edges": call["edges_per_call"],
                        **{f"{k}_ms": v for k, v in ms.items()},
                        "h2d_MB": call["h2d_bytes_per_call"] / 1e6, "d2h_MB": call["d2h_bytes_per_call"] / 1e6,
                        "copies": call["h2d_copies_per_call"] + call["d2h_copies_per_call"],
                        "peak_GiB": (max(c["peak_memory_bytes"] or 0 for c in r["model_calls"]) / 2**30)
                        if any(c.get("peak_memory_bytes") for c in r["model_calls"]) else None})
        sections = r.get("lammps_sections")
        if sections and cfg["steps"]:
            row["lammps_outside_pair_ms"] = 1e3 * sum(v for k, v in sections.items() if k != "Pair") / cfg["steps"]
        out.append(row)
    return out


COLUMNS = ("run", "atoms", "model", "steps_per_s", "vs_ase", "rank_atoms", "rank_edges", "to_device_ms",
           "graph_ms", "model_ms", "to_host_ms", "h2d_MB", "d2h_MB", "copies", "peak_GiB",
           "lammps_outside_pair_ms", "drift_eV_per_atom")


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def markdown(records: list[dict]) -> str:
    """The table, with the environment of the first record."""
    table = rows(records)
    env = next((r["env"] for r in records if r.get("env")), {})
    lammps = next((r["env"].get("lammps") for r in records if (r.get("env") or {}).get("lammps")), None)
    dev = env.get("device", {})
    lines = ["# mixstack md: LAMMPS and ASE", "",
             f"- device: {dev.get('name')}; torch {env.get('torch')}, Triton {env.get('triton')}, "
             f"LAMMPS {lammps}, Python {env.get('python')}",
             f"- date: {env.get('date')}; git: {env.get('git_revision')}",
             "- per model call, the slowest rank: atoms and edges it evaluates (local and ghost), milliseconds "
             "per phase, megabytes host to device and back; `lammps_outside_pair_ms`: LAMMPS's own time per "
             "step (neighbour lists, communication including waiting for the slowest rank, integration, "
             "output)", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in table:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def summarize(directory: str) -> tuple[str, str]:
    """Read ``directory/*.json`` records, write the summary JSON and Markdown; return their paths."""
    records = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if os.path.basename(path) == SUMMARY_JSON:
            continue
        with open(path) as fh:
            doc = json.load(fh)
        if doc.get("schema", "").startswith("mixstack-md/"):
            records.append(doc)
    out_json, out_md = os.path.join(directory, SUMMARY_JSON), os.path.join(directory, SUMMARY_MD)
    with open(out_json, "w") as fh:
        json.dump({"rows": rows(records), "records": records}, fh, indent=1)
    with open(out_md, "w") as fh:
        fh.write(markdown(records))
    return out_json, out_md


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: python -m mixstack.lammps.report DIR (a folder of mixstack md --json records)")
    summarize(sys.argv[1])
