"""The grid's regression guard: a grid run's keys against a committed grid, naming every key and
level that got slower by more than its noise.

Each key record holds, per variant, the median and the 20th / 80th percentiles of its timed
rounds.  A measurement's noise is its relative spread, ``(p80 - p20) / median``; a comparison's
noise is the larger of the two runs' spreads, and a variant counts as slower when its median grew by
more than ``noise_factor`` times that noise and by more than ``margin`` (runs on different days
differ by a few per cent in clocks alone).  Keys or variants that only one side measured are listed,
not judged.  Pure functions of the records: the CPU tests run the guard on the committed grid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .grid import SCHEMA, key_name, load_records

MARGIN = 0.05              # a slow-down under 5% is not flagged whatever the spread
NOISE_FACTOR = 3.0         # nor one under three times the larger relative spread of the two runs


@dataclass(frozen=True)
class Change:
    """One variant at one key: the baseline's and the new median (ms), the bar it was held to."""

    key: str
    variant: str
    pass_: str
    old_ms: float
    new_ms: float
    bar: float

    @property
    def ratio(self) -> float:
        return self.new_ms / self.old_ms

    @property
    def slower(self) -> bool:
        return self.ratio - 1 > self.bar

    def line(self) -> str:
        return (f"{self.key} {self.variant} ({self.pass_}): {self.old_ms:.3g} -> {self.new_ms:.3g} ms "
                f"({100 * (self.ratio - 1):+.1f}%, bar {100 * self.bar:.1f}%)")


@dataclass(frozen=True)
class Verdict:
    """The comparison of two grids: every variant compared, what only one side measured, and the
    keys measured at another edge count on each side (times of different sizes are not compared)."""

    changes: list[Change]
    only_old: list[str]
    only_new: list[str]
    other_edges: list[str]

    @property
    def slower(self) -> list[Change]:
        return [c for c in self.changes if c.slower]

    def report(self) -> str:
        slower = self.slower
        lines = [f"grid check: {len({c.key for c in self.changes})} keys, {len(self.changes)} measurements "
                 f"compared; {len(slower)} slower than their noise"]
        lines += [f"  SLOWER {c.line()}" for c in sorted(slower, key=lambda c: -c.ratio)]
        if self.changes:
            worst = max(self.changes, key=lambda c: c.ratio)
            lines.append(f"  largest change: {worst.line()}")
        if self.only_old:
            lines.append(f"  not measured in the new grid: {len(self.only_old)} ({', '.join(self.only_old[:12])}"
                         + (", ..." if len(self.only_old) > 12 else "") + ")")
        if self.other_edges:
            lines.append(f"  not compared (another edge count): {len(self.other_edges)} "
                         f"({', '.join(self.other_edges[:12])}" + (", ..." if len(self.other_edges) > 12 else "") + ")")
        if self.only_new:
            lines.append(f"  not in the baseline: {len(self.only_new)} ({', '.join(self.only_new[:12])}"
                         + (", ..." if len(self.only_new) > 12 else "") + ")")
        return "\n".join(lines)


def spread(row: dict) -> float:
    """A timing row's relative spread, ``(p80 - p20) / median``."""
    return max(0.0, row["p80_ms"] - row["p20_ms"]) / row["median_ms"]


def _name(rec: dict) -> str:
    return key_name(rec["key"]["focus_dim"], rec["key"]["lmax"], rec["key"]["focus"])


def _rows(records: list[dict]) -> dict[tuple[str, str, str], dict]:
    out = {}
    for rec in records:
        for t in rec["timings"]:
            if t.get("median_ms"):
                out[(_name(rec), t["variant"], t["pass"])] = t
    return out


def compare(baseline: list[dict], new: list[dict], *, margin: float = MARGIN,
            noise_factor: float = NOISE_FACTOR) -> Verdict:
    """Every (key, variant, pass) timed in both ``baseline`` and ``new`` (grid key records)."""
    old_rows, new_rows = _rows(baseline), _rows(new)
    edges_old = {_name(r): r["key"]["edges"] for r in baseline}
    edges_new = {_name(r): r["key"]["edges"] for r in new}
    other = sorted(k for k in edges_old.keys() & edges_new.keys() if edges_old[k] != edges_new[k])
    changes = []
    for ident in sorted(old_rows.keys() & new_rows.keys()):
        if ident[0] in other:
            continue
        old, cur = old_rows[ident], new_rows[ident]
        bar = max(margin, noise_factor * max(spread(old), spread(cur)))
        changes.append(Change(*ident, old["median_ms"], cur["median_ms"], bar))
    names = lambda rows: {i[0] for i in rows}                       # noqa: E731
    return Verdict(changes, sorted(names(old_rows) - names(new_rows)), sorted(names(new_rows) - names(old_rows)),
                   other)


def load(path: str | Path) -> list[dict]:
    """Key records from a grid folder (its ``keys/*.json``, or its ``grid.json``) or a ``grid.json``;
    ``ValueError`` naming the path where it holds none."""
    path = Path(path)
    if path.is_dir() and (path / "keys").is_dir():
        records = load_records(path)
    else:
        file = path / "grid.json" if path.is_dir() else path
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--check: cannot read a grid from {path}: {exc}") from None
        if data.get("schema") != SCHEMA:
            raise ValueError(f"--check: {file} is not a grid ({SCHEMA}) file")
        records = data["keys"]
    if not records:
        raise ValueError(f"--check: no grid key records in {path}")
    return records
