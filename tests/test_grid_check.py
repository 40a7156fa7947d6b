"""The grid's regression guard (``mixstack bench grid --check``) on the committed H200 grid: the
grid against itself passes; a copy with one key's level made slower names exactly that key; a
change inside the noise or the margin, a key measured at another edge count, and keys only one
side has are not judged slower; the CLI exits 1 on a slower key and names it."""

import copy
import json
import shutil
from pathlib import Path

import pytest

from mixstack.bench import grid, grid_check
from mixstack.cli import main

COMMITTED = sorted(Path(__file__).resolve().parents[1].glob("results/*-h200-grid"))[-1]


@pytest.fixture(scope="module")
def committed():
    return grid_check.load(COMMITTED)


def _timings(records, key, variant):
    """The timing rows of ``variant`` at ``key`` in ``records``."""
    for rec in records:
        if grid.key_name(rec["key"]["focus_dim"], rec["key"]["lmax"], rec["key"]["focus"]) == key:
            yield from (t for t in rec["timings"] if t["variant"] == variant)


def _slow_down(records, key, variant, factor):
    out = copy.deepcopy(records)
    for t in _timings(out, key, variant):
        for stat in ("median_ms", "p20_ms", "p80_ms"):
            t[stat] *= factor
    return out


def test_the_committed_grid_against_itself_has_nothing_slower(committed):
    verdict = grid_check.compare(committed, committed)
    assert len({c.key for c in verdict.changes}) == len(committed) >= 10
    assert verdict.slower == [] and not verdict.only_old and not verdict.only_new
    assert "0 slower than their noise" in verdict.report()


def test_one_level_made_slower_at_one_key_is_named_and_nothing_else(committed):
    key = grid.key_name(committed[3]["key"]["focus_dim"], committed[3]["key"]["lmax"], committed[3]["key"]["focus"])
    verdict = grid_check.compare(committed, _slow_down(committed, key, "L2", 1.25))
    assert [(c.key, c.variant) for c in verdict.slower] == [(key, "L2")]
    assert f"SLOWER {key} L2" in verdict.report()


def _with_spread(records, key, variant, spread):
    """``records`` with ``variant``'s p20 and p80 at ``key`` set ``spread`` apart around its median."""
    out = copy.deepcopy(records)
    for t in _timings(out, key, variant):
        t["p20_ms"], t["p80_ms"] = (1 - spread / 2) * t["median_ms"], (1 + spread / 2) * t["median_ms"]
    return out


def test_a_change_inside_the_margin_or_the_noise_is_not_flagged(committed):
    key = grid.key_name(committed[0]["key"]["focus_dim"], committed[0]["key"]["lmax"], committed[0]["key"]["focus"])
    quiet = _with_spread(committed, key, "L1", 0.02)                  # a 2% spread on both sides
    assert grid_check.compare(quiet, _slow_down(quiet, key, "L1", 1.04)).slower == []      # inside the 5% margin
    assert [(c.key, c.variant) for c in grid_check.compare(quiet, _slow_down(quiet, key, "L1", 1.12)).slower] \
        == [(key, "L1")]
    noisy = _with_spread(_slow_down(quiet, key, "L1", 1.12), key, "L1", 0.2)              # a 20% spread
    assert grid_check.compare(quiet, noisy).slower == []


def test_other_edge_counts_and_missing_keys_are_listed_not_judged(committed):
    new = _slow_down(committed[1:], grid.key_name(committed[2]["key"]["focus_dim"], committed[2]["key"]["lmax"],
                                                  committed[2]["key"]["focus"]), "L2", 2.0)
    new[1]["key"]["edges"] += 2
    verdict = grid_check.compare(committed, new)
    assert verdict.slower == [] and verdict.other_edges and len(verdict.only_old) == 1
    assert "another edge count" in verdict.report() and "not measured in the new grid" in verdict.report()


def test_the_cli_compares_without_measuring_and_exits_1_on_a_slower_key(tmp_path, committed, capsys):
    (tmp_path / "new" / "keys").mkdir(parents=True)
    for path in (COMMITTED / "keys").glob("*.json"):        # a variant that failed there exits 1 by itself
        if not any(v["failed"] for v in json.loads(path.read_text())["shape"]["variants"]):
            shutil.copy(path, tmp_path / "new" / "keys")
    args = ["bench", "grid", "--device", "cpu", "--levels", "0", "--seconds", "0", "--no-plot",
            "--out", str(tmp_path / "new"), "--check", str(COMMITTED)]
    assert main(args) == 0
    assert "0 slower than their noise" in capsys.readouterr().out
    victim = sorted((tmp_path / "new" / "keys").glob("*.json"))[0]
    rec = json.loads(victim.read_text())
    for t in rec["timings"]:
        if t["variant"] == "L0-compile":
            t["median_ms"] *= 1.3
    victim.write_text(json.dumps(rec))
    assert main(args) == 1
    assert f"SLOWER {victim.stem} L0-compile" in capsys.readouterr().out


def test_a_baseline_that_is_not_a_grid_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{}")
    assert main(["bench", "grid", "--device", "cpu", "--seconds", "0", "--out", str(tmp_path / "o"),
                 "--check", str(tmp_path / "x.json")]) == 2
    assert "--check" in capsys.readouterr().err and not (tmp_path / "o").exists()
