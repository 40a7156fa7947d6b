"""Read a LAMMPS log: the thermo table, the loop time and the timing breakdown of the last run.

LAMMPS writes these on rank 0 after every ``run``: the thermo lines (one
header, then numbers), ``Loop time of T on P procs for N steps with A atoms``,
``Performance: ...`` and the ``Section | min time | avg time | max time``
table (Pair, Neigh, Comm, Output, Modify, Other), whose average times say
where the wall time went.
"""

from __future__ import annotations

import re

_LOOP = re.compile(r"^Loop time of (\S+) on (\d+) procs for (\d+) steps with (\d+) atoms")


def _numbers(line: str) -> list[float] | None:
    try:
        return [float(t) for t in line.split()]
    except ValueError:
        return None


def parse(text: str) -> dict:
    """The last run of a log: ``{"thermo": {column: [values]}, "loop_seconds", "procs", "steps",
    "atoms", "performance", "sections": {name: avg seconds}}`` (keys absent when not found)."""
    lines = text.splitlines()
    loops = [i for i, line in enumerate(lines) if _LOOP.match(line)]
    if not loops:
        return {}
    end = loops[-1]
    seconds, procs, steps, atoms = _LOOP.match(lines[end]).groups()
    out: dict = {"loop_seconds": float(seconds), "procs": int(procs), "steps": int(steps), "atoms": int(atoms)}
    start = end - 1                                    # the thermo block sits right above the loop line
    while start >= 0 and _numbers(lines[start]) is not None:
        start -= 1
    if start >= 0 and start + 1 < end:
        header = lines[start].split()
        rows = [_numbers(line) for line in lines[start + 1:end]]
        rows = [r for r in rows if r is not None and len(r) == len(header)]
        out["thermo"] = {h: [r[k] for r in rows] for k, h in enumerate(header)}
    sections: dict[str, float] = {}
    for line in lines[end:]:
        if line.startswith("Performance:"):
            out["performance"] = line.partition(":")[2].strip()
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 6 and parts[0] and parts[0] != "Section":
            try:
                sections[parts[0]] = float(parts[2]) if parts[2] else float(parts[1] or 0.0)
            except ValueError:
                continue
        if line.startswith("Nlocal:"):
            break
    if sections:
        out["sections"] = sections
    return out


def read(path: str) -> dict:
    """``parse`` of the log file at ``path``."""
    with open(path, errors="replace") as fh:
        return parse(fh.read())
