"""``mixstack info``: device, versions, the active level and why, and the tuning tables."""

from __future__ import annotations

import json

LEVEL_SOURCES = {
    "use_level": "a mixstack.use_level(...) scope",
    "set_level": "mixstack.set_level(...)",
    "MIXSTACK_LEVEL": "the MIXSTACK_LEVEL environment variable",
    "default": "the default: 2 where CUDA is available, else 0",
}

HELP = "device, versions, active level, and whether the Triton levels can run"


def add_arguments(p) -> None:
    p.add_argument("--device", help="device to report on: cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--package", metavar="PT2",
                   help="instead: the GPU kernels compiled into an AOTInductor package (.pt2), mixstack's by "
                        "name, read from the archive without loading it")


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
    level_line = f"level: {lvl['level']}, from {LEVEL_SOURCES.get(lvl['source'], lvl['source'])}"
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
    """One line per tuning table: where it is and what it covers."""
    head = f"tuning table ({table['source']}): {table['path']}"
    if not table["exists"]:
        return head + ": none"
    counts = ", ".join(f"{fam} {n}" for fam, n in sorted(table["valid_entries"].items()))
    text = f"{head}: valid entries: {counts or 'none'}"
    if table["problems"]:
        text += " (" + "; ".join(table["problems"]) + ")"
    return text


def _package(args) -> int:
    from ..packages import package_kernels
    from .common import existing_file

    try:
        found = package_kernels(existing_file("--package", args.package))
    except ValueError as err:
        raise ValueError(f"--package: {err}") from None
    if args.json:
        print(json.dumps({"path": found.path, "members": found.members, "metadata": found.metadata,
                          "mixstack": dict(found.mixstack), "inductor": dict(found.inductor),
                          "sources": dict(found.sources)}, indent=1))
    else:
        print("\n".join(found.lines()))
    return 0


def run(args, argv=None) -> int:
    if args.package:
        return _package(args)
    from ..measure import env
    from ..tuning import store, validity
    record = env.collect(args.device)
    device = record["device"]
    table_device = device["name"] if device["type"] == "cuda" else validity.device_name(None)
    record["tuning_tables"] = store.coverage(table_device)
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print("\n".join(info_lines(record)))
    return 0
