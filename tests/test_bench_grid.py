"""``mixstack bench grid`` on the CPU at tiny sizes: per-key records written as they finish,
resume, the time bound, one compile of the reference per (Cf, lmax) and F class, the outputs
(JSON, long CSV with environment columns, Markdown, heat map, level-3 verdicts) and the CLI."""

import csv
import json

import pytest
import torch

from mixstack.bench import grid
from mixstack.cli import main

TINY = dict(focus_dims=(16,), lmaxes=(1,), focus=(1, 2, 4), variants=("0c", "0"), edges=65, rounds=1,
            warmup=0, check_edges=16, device="cpu", compile_backend="eager")


def test_edges_hold_a_fixed_number_of_row_floats():
    assert grid.grid_edges(2, 32, 3) == 2 ** 18 + 1                     # the tuner's set at S1's width
    assert grid.grid_edges(1, 16, 1) == 2 ** 18 * 10 + 1                 # the narrowest key: 2.6 M edges
    assert grid.grid_edges(4, 128, 6) == 2 ** 18 * 640 // (4 * 19 * 128) | 1
    assert all(grid.grid_edges(f, c, l) % 2 for f in (1, 2, 4) for c in (16, 48, 128) for l in (1, 6))
    assert grid.grid_edges(2, 32, 3, 0.25) == 2 ** 16 + 1                # a quarter of the row floats
    assert grid.GridConfig(edge_scale=0.25).shape(32, 3, 2).edges == 2 ** 16 + 1


@pytest.mark.slow
def test_a_tiny_grid_compiles_the_reference_once_per_f_class_and_resumes(tmp_path):
    cfg = grid.GridConfig(**TINY)
    events = []
    done = grid.run_grid(cfg, tmp_path, on_key=lambda *e: events.append(e[:2]))
    assert done["measured"] == ["Cf16-l1-F1", "Cf16-l1-F2", "Cf16-l1-F4"]
    recs = grid.load_records(tmp_path)
    assert [r["compile"]["graphs"] for r in recs] == [1, 1, 0]      # F 4 reuses F 2's dynamic graph
    for r in recs:
        names = {t["variant"] for t in r["timings"]}
        assert names == {"L0-compile", "L0-eager"} and r["env"]["torch"] and r["roof"]
        assert all(v["rel_error"]["out"] < 1e-5 for v in r["shape"]["variants"])
        assert r["shape"]["reference64_s"] >= 0 and all(v["setup_s"] >= 0 for v in r["shape"]["variants"])
        assert set(r["triton_compiles"]) == {"compiled", "compiled_seconds", "loaded"}
    again = grid.run_grid(grid.GridConfig(**TINY, resume=True), tmp_path)
    assert again["skipped"] == done["measured"] and again["measured"] == []

    paths = grid.write_outputs(tmp_path, with_plot=True)
    doc = json.loads(paths["json"].read_text())
    assert len(doc["keys"]) == 3
    rows = list(csv.DictReader(paths["csv"].open()))
    assert {"date", "gpu", "torch", "triton", "git", "case", "focus_dim", "metric", "value"} <= set(rows[0])
    assert {r["metric"] for r in rows} >= {"time_median_both", "speedup_vs_compiled_both", "rel_error_out",
                                         "first_call", "setup"}
    assert "Cf16-l1-F4" in paths["markdown"].read_text() and paths["plot"].stat().st_size > 10_000
    assert json.loads(paths["level3"].read_text())["verdicts"] == {}     # no L3 measured


def test_seconds_stops_before_a_key_that_would_not_fit(tmp_path):
    t = [0.0]

    def now():
        t[0] += 40.0                                    # every look at the clock: 40 s later
        return t[0]
    done = grid.run_grid(grid.GridConfig(**{**TINY, "variants": ("0",)}, seconds=100), tmp_path, now=now)
    assert done["measured"] and done["stopped"] and len(done["measured"]) + len(done["stopped"]) == 3
    assert len(grid.load_records(tmp_path)) == len(done["measured"])


def _record(cf, lmax, f, l2, l3, compensated):
    variants = [{"variant": "L3", "failed": None, "dispatch": {"fwd:compensated" if compensated else "fwd:triton": 1}}]
    timings = [{"variant": "L2", "pass": "both", "median_ms": l2}, {"variant": "L3", "pass": "both", "median_ms": l3},
               {"variant": "L0-compile", "pass": "both", "median_ms": 10.0}]
    return {"key": {"focus_dim": cf, "lmax": lmax, "focus": f, "edges": 1}, "shape": {"variants": variants},
            "timings": timings}


def test_level3_verdicts_and_the_summary_read_what_ran():
    recs = [_record(32, 3, 2, 10.0, 5.0, True), _record(16, 1, 1, 4.0, 4.0, False)]
    verdicts = grid.level3_verdicts(recs)
    assert list(verdicts) == ["focus_dim=32;lmax=3;n_focus=2;apply_alpha=1"]
    assert verdicts["focus_dim=32;lmax=3;n_focus=2;apply_alpha=1"]["speedup"] == 2.0
    s = grid.summary(recs[1])
    assert s["L3_vs_compiled"] == 2.5 and s["level3_compensated"] is False and s["L1_ms"] is None


def test_the_cli_runs_a_grid_slice_and_refuses_foreign_options(tmp_path, capsys):
    args = ["bench", "grid", "--focus-dim", "16", "--lmax", "1", "--focus", "1", "--edges", "33", "--levels", "0",
            "--repeats", "1", "--warmup", "0", "--check-edges", "8", "--no-plot", "--device", "cpu",
            "--out", str(tmp_path)]
    assert main(args) == 0
    assert "measured 1, skipped 0" in capsys.readouterr().out
    assert main(args + ["--resume"]) == 0
    assert "measured 0, skipped 1" in capsys.readouterr().out
    (tmp_path / "grid.md").unlink()
    assert main(args[:6] + ["--focus", "1,2", "--seconds", "0", "--out", str(tmp_path), "--no-plot"]) == 0
    assert "measured 0, skipped 1 (done before), left 1" in capsys.readouterr().out   # outputs rebuilt only
    assert (tmp_path / "grid.md").exists()
    assert main(["bench", "grid", "--focus-dim", "40", "--out", str(tmp_path)]) == 2
    assert "outside the supported grid: Cf 40" in capsys.readouterr().err
    assert main(["bench", "--focus-dim", "16,32", "--edges", "10"]) == 2
    assert "argument --focus-dim: must be an integer >= 1, got '16,32'" in capsys.readouterr().err
    assert main(["bench", "grid", "--quick"]) == 2
    assert "unrecognized arguments: --quick" in capsys.readouterr().err


def _rule_record(cf, lmax, f, l2, l3, l3_rule):
    rec = _record(cf, lmax, f, l2, l3, False)
    rec["shape"]["variants"].append({"variant": "L3-rule", "failed": None, "dispatch": {"fwd:compensated": 1}})
    rec["timings"].append({"variant": "L3-rule", "pass": "both", "median_ms": l3_rule})
    from mixstack.measure import env
    rec.update(env=env.collect(torch.device("cpu")), compile={"graphs": 0, "first_call_s": None})
    return rec


def test_where_level3_ran_level2_the_forced_rule_config_gives_the_verdict():
    recs = [_rule_record(80, 3, 1, 10.0, 10.0, 6.0), _rule_record(16, 1, 1, 4.0, 4.0, 5.0)]
    verdicts = grid.level3_verdicts(recs)
    win = verdicts["focus_dim=80;lmax=3;n_focus=1;apply_alpha=1"]
    assert win["speedup"] == 10.0 / 6.0 and win["measured_by"] == "L3-rule"
    assert verdicts["focus_dim=16;lmax=1;n_focus=1;apply_alpha=1"]["speedup"] == 0.8   # measured, loses
    text = grid.markdown(recs)
    assert "faster than level 2 at 1 keys; level 3 ran them by itself at 0 of them (0%)" in text
    assert "1.67 (rule)" in text


def _shipped_record(cf, lmax, f, l1, l2, l1b, l2b, l3, l3_rule=None):
    rec = _rule_record(cf, lmax, f, l2, l3, l3_rule) if l3_rule else _record(cf, lmax, f, l2, l3, False)
    rec["timings"] += [{"variant": v, "pass": "both", "median_ms": t}
                       for v, t in (("L1", l1), ("L1-blas", l1b), ("L2-blas", l2b)) if t is not None]
    if "env" not in rec:
        from mixstack.measure import env
        rec.update(env=env.collect(torch.device("cpu")), compile={"graphs": 0, "first_call_s": None})
    return rec


def test_the_shipped_view_takes_the_route_and_level3_where_this_runs_verdicts_send_them():
    recs = [_shipped_record(112, 4, 1, 11.0, 11.0, 10.0, 10.0, 11.0, l3_rule=6.0),   # route wins; L3 engages
            _shipped_record(80, 2, 1, 9.0, 9.0, 9.5, 9.5, 9.0, l3_rule=8.99),        # Triton stays; L3 does not
            _shipped_record(32, 3, 2, 8.0, 8.0, None, None, 5.0)]                     # no route measured
    recs[2]["shape"]["variants"][0]["dispatch"] = {"fwd:compensated": 1}            # level 3 ran them itself
    shipped = grid.as_shipped(recs)
    assert shipped["Cf112-l4-F1"] == {"L1": 10.0, "L2": 10.0, "L3": 6.0, "compensated": True}
    assert shipped["Cf80-l2-F1"] == {"L1": 9.0, "L2": 9.0, "L3": 9.0, "compensated": False}
    assert shipped["Cf32-l3-F2"] == {"L1": 8.0, "L2": 8.0, "L3": 5.0, "compensated": True}
    text = grid.markdown(recs)
    # compiled 10 ms: 10/11 = 0.91 misses the bar on Triton's products, the route's 1.0 does not
    assert "- L1: more than 5% slower than the compiled reference at 1 keys (Cf112-l4-F1)" in text
    assert "L1 more than 5% slower than the compiled reference at 0 keys (none)" in text
    assert "level 3 on compensated kernels at 2 of 3 keys" in text
    assert "| 1/1/1.67 |" in text


def test_the_forced_variant_runs_only_where_level3_would_run_level2():
    cfg = grid.GridConfig(device="cpu")
    unsure, engaged = cfg.shape(80, 3, 1), cfg.shape(128, 3, 1)            # 16-wide K tiles; the rule's region
    assert grid.level3_unsure(unsure, "cpu") and not grid.level3_unsure(engaged, "cpu")
    assert "3r" in cfg.bench_config(unsure).variants and "3r" not in cfg.bench_config(engaged).variants


def test_a_keys_record_says_where_its_seconds_went_before_the_timed_runs():
    rec = {"shape": {"reference64_s": 0.1, "variants": [
        {"variant": "L1", "setup_s": 0.01, "first_call_s": 3.2},
        {"variant": "L2", "setup_s": 0.01, "first_call_s": 0.01},
        {"variant": "L3-rule", "setup_s": 8.5, "first_call_s": 0.4},
        {"variant": "L0-compile", "setup_s": None, "first_call_s": None}]}}
    assert grid.first_uses(rec) == "; setup + first call: L1 3.2 s, L3-rule 8.9 s"
    rec["triton_compiles"] = {"compiled": [{"kernel": "gate_kernel", "seconds": 0.4}], "compiled_seconds": 0.4,
                              "loaded": 12}
    assert grid.first_uses(rec).endswith("; Triton compiled 1 kernels here (0.4 s), loaded 12")
    assert grid.first_uses({"shape": {"variants": []}}) == ""
