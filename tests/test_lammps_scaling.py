"""The scaling driver: plan, memory estimate, force check and report on synthetic records (fast);
then the whole measurement on the CPU under mpirun, a failing point included (slow)."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from mixstack.lammps import scaling
from mixstack.lammps.scaling import Point, make_plan, parse_list, parse_systems, processor_grid
from mixstack.lammps.scaling_report import is_dry_run, markdown, report_doc, rows, write_report

# ------------------------------------------------------------------ plan and estimate


def test_parse_lists_and_systems_name_the_bad_option():
    assert parse_list("1, 2,4,2") == (1, 2, 4)
    assert parse_systems("diamond:50000,cu-bcc:500000:small", "scaling", "--strong") == [
        ("diamond", 50000, "scaling"), ("cu-bcc", 500000, "small")]
    assert parse_systems("", "scaling", "--weak") == []
    for text, match in (("fcc:10", "structure"), ("diamond", "STRUCTURE:ATOMS"), ("diamond:x", "integer"),
                        ("diamond:0", "positive")):
        with pytest.raises(ValueError, match=f"--strong.*{match}|{match}"):
            parse_systems(text, "scaling", "--strong")
    with pytest.raises(ValueError, match="--ranks"):
        parse_list("1,two")


def test_the_plan_holds_every_system_level_and_rank_count():
    plan = make_plan([4, 1, 2], [("diamond", 500, "scaling")], [("cu-bcc", 100, "small")], [2, 3])
    assert len(plan) == 2 * 2 * 3
    names = [p.name for p in plan]
    assert len(set(names)) == len(names) and "strong-diamond-500-scaling-L2-r1" in names
    weak4 = next(p for p in plan if p.series == "weak" and p.ranks == 4)
    assert weak4.total_atoms == 400 and weak4.system == ("weak", "cu-bcc", 100, "small", 2)
    assert next(p for p in plan if p.series == "strong" and p.ranks == 4).total_atoms == 500
    with pytest.raises(ValueError, match="ranks"):
        make_plan([0, 1], [("diamond", 8, "scaling")], [], [2])


def test_processor_grid_is_lammps_least_surface_grid():
    assert processor_grid((10, 10, 10), 8) == (2, 2, 2)
    assert sorted(processor_grid((10, 10, 10), 2)) == [1, 1, 2]
    assert processor_grid((40, 10, 10), 4) == (4, 1, 1)          # a long box: slabs across its length
    assert processor_grid((10, 10, 10), 1) == (1, 1, 1)


def test_the_memory_estimate_shrinks_with_ranks_and_grows_with_sharing():
    lengths, epa = (100.0, 100.0, 100.0), 28.0
    est = {r: scaling.estimate_memory(Point("strong", "diamond", 80000, "scaling", 2, r), r, lengths=lengths,
                                      epa=epa) for r in (1, 2, 4)}
    assert est[1]["edges_per_rank"] > 80000 * epa                               # the ghost shell
    assert est[1]["bytes_per_gpu"] > est[2]["bytes_per_gpu"] > est[4]["bytes_per_gpu"]
    shared = scaling.estimate_memory(Point("strong", "diamond", 80000, "scaling", 2, 4), 1, lengths=lengths, epa=epa)
    assert shared["bytes_per_gpu"] == pytest.approx(4 * est[4]["bytes_per_gpu"])   # four ranks on one GPU
    assert scaling.estimate_memory(Point("strong", "diamond", 8, "/some/model.pt", 2, 1), 1, lengths=lengths,
                                   epa=epa) is None


def test_triage_skips_what_cannot_fit_and_keeps_the_rest():
    pytest.importorskip("ase")
    plan = make_plan([1, 2], [("cu-bcc", 500, "scaling")], [], [2])
    run, outcome = scaling.triage(plan, 2, memory_limit=1e12)
    assert run == plan and all(o["status"] == "not run" for o in outcome.values())
    limit = 0.75 * outcome[plan[0].name]["estimate"]["bytes_per_gpu"]    # one rank over it, two below
    run, outcome = scaling.triage(plan, 2, memory_limit=limit)
    assert run == plan[1:]
    assert outcome[plan[0].name]["status"] == "skipped" and "GiB per GPU" in outcome[plan[0].name]["why"]
    assert scaling.triage(plan, 2, memory_limit=None) == (plan, {})


def test_level3_points_are_skipped_where_level3_would_run_level2(monkeypatch, request, tmp_path):
    from mixstack.tuning import policy, registry, shape_key, validity
    request.addfinalizer(policy.forget_verdicts)
    monkeypatch.setattr(validity, "device_name", lambda device=None: "NVIDIA H200")
    table = {}                                                   # no table entry: the policy decides
    monkeypatch.setattr(registry, "find", lambda family, key, device_name=None: table.get(key.short()))
    # the small model's key (Cf 16 lmax 2 F 2) with a grid verdict of 1.01x level 2: below the margin
    cfg = scaling.model_config("small")
    small = shape_key(focus_dim=cfg["focus_dim"], lmax=cfg["lmax"], n_focus=cfg["n_focus"], apply_alpha=True)
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(json.dumps({"device": "NVIDIA H200", "verdicts": {str(small): {"speedup": 1.01}}}))
    monkeypatch.setattr(policy, "verdicts_path", lambda device: str(verdicts))
    policy.forget_verdicts()
    assert "grid measured level 3 at 1.01x" in scaling.level3_runs_level2("small", "cuda")
    verdicts.write_text(json.dumps({"device": "NVIDIA H200", "verdicts": {str(small): {"speedup": 1.5}}}))
    policy.forget_verdicts()
    assert scaling.level3_runs_level2("small", "cuda") is None                    # measured faster: it engages
    monkeypatch.setattr(policy, "verdicts_path", lambda device: os.devnull + ".none")   # no verdicts: the rule
    policy.forget_verdicts()
    assert scaling.level3_runs_level2("scaling", "cuda") is None                  # a row of 224 floats
    assert "row of 128" in scaling.level3_runs_level2("scaling-lite", "cuda")
    assert "16-wide" in scaling.level3_runs_level2("small", "cuda")
    assert "no GPU" in scaling.level3_runs_level2("scaling", "cpu")
    table["Cf32 l2 F1 alpha"] = ("user", {"config": None})                       # measured: level 2 wins
    assert "entry" in scaling.level3_runs_level2("scaling", "cuda")
    table["Cf32 l1 F1 alpha"] = ("builtin", {"config": {"BLOCK_M": 64}})          # measured: level 3 wins
    assert scaling.level3_runs_level2("scaling-lite", "cuda") is None
    table.clear()
    plan = make_plan([1], [("diamond", 64, "scaling"), ("diamond", 64, "scaling-lite")], [], [2, 3])
    run, outcome = scaling.triage(plan, 1, None, "cuda")
    assert [p.name for p in run] == ["strong-diamond-64-scaling-L2-r1", "strong-diamond-64-scaling-lite-L2-r1",
                                     "strong-diamond-64-scaling-L3-r1"]
    assert "level 3 runs level 2" in outcome["strong-diamond-64-scaling-lite-L3-r1"]["why"]


# ------------------------------------------------------------------ the force check


def test_compare_single_points_measures_energy_and_force_deviation():
    rng = np.random.default_rng(0)
    f = rng.standard_normal((50, 3))
    same = scaling.compare_single_points({"energy": 10.0, "forces": f}, {"energy": 10.0, "forces": f.copy()})
    assert same["force_rel"] == 0 and same["energy_rel"] == 0
    g = f.copy()
    g[7, 1] += 1e-3 * np.abs(f).max()
    got = scaling.compare_single_points({"energy": 10.0, "forces": f}, {"energy": 10.001, "forces": g})
    assert got["force_rel"] == pytest.approx(1e-3) and got["energy_rel"] == pytest.approx(1e-4)
    assert got["energy_diff_per_atom"] == pytest.approx(1e-3 / 50)
    with pytest.raises(ValueError, match="shape"):
        scaling.compare_single_points({"energy": 1.0, "forces": f}, {"energy": 1.0, "forces": f[:-1]})


def test_the_tolerance_is_float32_rounding_growing_with_the_box():
    small, large = scaling.force_tolerance(10.0, 4.0), scaling.force_tolerance(150.0, 4.0)
    assert 2e-5 < small < 3e-5 and small < large < 1.2e-4


def _record(series="strong", structure="diamond", atoms=1000, ranks=1, level=2, sps=10.0, devices=None,
            peak=2**30, steps=10, model="scaling"):
    devices = devices or [f"cuda:{r}" for r in range(ranks)]
    point = Point(series, structure, atoms, model, level, ranks).to_dict()
    n = atoms * ranks if series == "weak" else atoms
    calls = [{"rank": r, "host": "h", "device": devices[r], "local_rank": r, "local_rank_source": "MPI_LOCALRANKID",
              "calls": steps, "local_atoms_per_call": n / ranks, "lammps_atoms_per_call": 1.5 * n / ranks,
              "atoms_per_call": 1.2 * n / ranks, "edges_per_call": 30 * n / ranks, "pairs_per_call": 40 * n / ranks,
              "h2d_bytes_per_call": 1e6, "d2h_bytes_per_call": 5e5, "h2d_copies_per_call": 3,
              "d2h_copies_per_call": 2, "slowest_call_seconds": 0.9 / sps,
              "seconds_per_call": {"to_device": 0.01 / sps, "graph": 0.1 / sps, "model": 0.6 / sps,
                                   "to_host": 0.01 / sps}, "peak_memory_bytes": peak}
             for r in range(ranks)]
    loop = steps / sps
    return {"scaling_point": point, "atoms": n, "ranks": ranks, "config": {"steps": steps},
            "steps_per_second": sps, "model_calls": calls, "cell_lengths": [30.0, 30.0, 30.0],
            "model": {"cutoff": 3.3, "lmax": 1}, "lammps_sections": {
                "Pair": 0.8 * loop, "Neigh": 0.05 * loop, "Comm": 0.1 * loop, "Modify": 0.03 * loop,
                "Output": 0.01 * loop, "Other": 0.01 * loop},
            "env": {"date": "2026-12-01T00:00:00+00:00", "device": {"name": "GPU-X", "type": "cuda"},
                    "torch": "2.x", "triton": "3.x", "cuda": "13.0", "mixstack": "0.1", "git_revision": "abc",
                    "python": "3.12", "lammps": "2025"}}


def test_rows_give_efficiency_and_split_a_step():
    recs = [_record(ranks=1, sps=10.0), _record(ranks=2, sps=18.0), _record(ranks=4, sps=30.0),
            _record(series="weak", atoms=500, ranks=1, sps=20.0), _record(series="weak", atoms=500, ranks=2, sps=19.0)]
    table = {(r["series"], r["ranks"]): r for r in rows(recs)}
    assert table["strong", 2]["efficiency"] == pytest.approx(0.9)
    assert table["strong", 4]["efficiency"] == pytest.approx(0.75)
    assert table["strong", 4]["speedup"] == pytest.approx(3.0)
    assert table["weak", 2]["efficiency"] == pytest.approx(0.95)          # per atom: 1000 atoms on 2 ranks
    r = table["strong", 2]
    assert r["step_ms"] == pytest.approx(1e3 / 18)
    assert r["pair_ms"] + r["neigh_ms"] + r["comm_ms"] + r["other_ms"] == pytest.approx(r["step_ms"])
    assert r["model_ms"] + r["graph_ms"] + r["copy_ms"] + r["host_ms"] == pytest.approx(r["pair_ms"])
    assert r["gpus"] == 2 and r["ranks_per_gpu"] == 1 and r["peak_GiB_per_gpu"] == pytest.approx(1.0)
    assert not is_dry_run(list(table.values()))


def test_the_fewest_ranks_that_ran_are_the_base():
    table = rows([_record(ranks=2, sps=5.0), _record(ranks=4, sps=8.0)])           # one rank did not fit
    four = next(r for r in table if r["ranks"] == 4)
    assert four["base_ranks"] == 2 and four["efficiency"] == pytest.approx(0.8)


def test_ranks_sharing_a_gpu_are_a_dry_run_with_their_memory_added():
    rec = _record(ranks=4, devices=["cuda:0"] * 4, peak=2**30)
    (row,) = rows([rec])
    assert row["gpus"] == 1 and row["ranks_per_gpu"] == 4 and row["peak_GiB_per_gpu"] == pytest.approx(4.0)
    doc = report_doc([rec], [], {})
    assert doc["dry_run"] and "DRY RUN" in markdown(doc)
    assert not report_doc([_record(ranks=2)], [], {})["dry_run"]


def test_a_slow_call_is_reported_as_an_outlier():
    rec = _record(ranks=1)
    assert "Outliers" not in markdown(report_doc([rec], [], {}))
    rec["model_calls"][0]["slowest_call_seconds"] = 5.0
    assert "Outliers" in markdown(report_doc([rec], [], {}))


def test_check_points_compares_rank_counts_by_atom_id(tmp_path):
    rng = np.random.default_rng(1)
    f = rng.standard_normal((1000, 3))
    recs = [_record(ranks=r) for r in (1, 2, 4)]
    noise = {1: 0.0, 2: 1e-7, 4: 1e-3}                          # rank 4 is off by far more than rounding
    for rec in recs:
        r = rec["ranks"]
        np.savez(tmp_path / f"{rec['scaling_point']['name']}.forces.npz", energy=np.float64(-100.0),
                 forces=f + noise[r] * np.abs(f).max() * (np.arange(3000).reshape(1000, 3) == 5))
    checks = scaling.check_points(str(tmp_path), recs)
    by_ranks = {c["ranks"]: c for c in checks}
    assert set(by_ranks) == {2, 4} and all(c["base_ranks"] == 1 for c in checks)
    assert by_ranks[2]["ok"] and by_ranks[2]["force_rel"] == pytest.approx(1e-7)
    assert not by_ranks[4]["ok"] and by_ranks[4]["force_rel"] == pytest.approx(1e-3)
    assert not list(tmp_path.glob("*.npz"))                      # removed once compared


def test_write_report_writes_json_markdown_csv(tmp_path):
    recs = [_record(ranks=1), _record(ranks=2, sps=19.0)]
    checks = [{"series": "strong", "structure": "diamond", "atoms": 1000, "model": "scaling", "level": 2,
               "ranks": 2, "base_ranks": 1, "energy_rel": 1e-9, "energy_diff_per_atom": 1e-9, "force_rel": 1e-6,
               "force_tolerance": 3e-5, "ok": True}]
    plan = {"command": "x", "outcome": {"strong-diamond-500000-scaling-L2-r1": {"status": "skipped",
                                                                               "why": "estimated 214 GiB"}}}
    paths = write_report(tmp_path, recs, checks, plan, with_plot=False)
    doc = json.loads(paths["json"].read_text())
    assert doc["schema"] == "mixstack-scaling/1" and len(doc["rows"]) == 2 and not doc["dry_run"]
    text = paths["markdown"].read_text()
    assert "## Strong scaling" in text and "GPU-X" in text and "estimated 214 GiB" in text
    with open(paths["csv"]) as fh:
        table = list(csv.DictReader(fh))
    assert {"date", "gpu", "torch", "triton", "cuda", "mixstack", "git"} <= set(table[0])
    eff = [r for r in table if r["metric"] == "efficiency" and r["ranks"] == "2"]
    assert len(eff) == 1 and float(eff[0]["value"]) == pytest.approx(0.95)
    assert any(r["metric"] == "check_force_rel" for r in table)


# ------------------------------------------------------------------ launches


def test_a_launch_that_dies_is_started_again_after_the_point_that_killed_it(tmp_path, monkeypatch):
    """A fake mpirun that runs a plan's points in order, dies at one, and stops at the deadline."""
    plan = make_plan([1, 2], [("diamond", 64, "a.pt"), ("diamond", 40, "bad.pt")], [("cu-bcc", 16, "a.pt")], [2])
    launches = []

    def fake_launch(ranks, plan_path, log_path, timeout, device):
        doc = json.loads(open(plan_path).read())
        launches.append((ranks, [p["name"] for p in doc["points"]]))
        for p in doc["points"]:
            if p["model"] == "bad.pt":
                with open(log_path, "a") as fh:
                    fh.write("ValueError: model: 'bad.pt' is neither a checkpoint file nor one of small\n")
                return 1, False
            (tmp_path / "points" / f"{p['name']}.json").write_text("{}")
        return 0, False

    monkeypatch.setattr(scaling, "_launch", fake_launch)
    monkeypatch.setattr("mixstack.lammps.build.plugin_path", lambda: "plugin.so")
    outcome = scaling.run_plan(plan, str(tmp_path), device="cpu", budget=60)
    assert [o["status"] for o in outcome.values()].count("done") == 4
    bad = [n for n, o in outcome.items() if o["status"] == "failed"]
    assert sorted(bad) == ["strong-diamond-40-bad-L2-r1", "strong-diamond-40-bad-L2-r2"]
    assert "neither a checkpoint" in outcome[bad[0]]["why"]
    # per rank count: smallest first, the bad point kills the launch, the rest runs in a second one
    assert launches[0] == (1, ["weak-cu-bcc-16-a-L2-r1", "strong-diamond-40-bad-L2-r1", "strong-diamond-64-a-L2-r1"])
    assert launches[1] == (1, ["strong-diamond-64-a-L2-r1"])
    assert [r for r, _ in launches] == [1, 1, 2, 2]
    # no time left: nothing is launched and every point says why
    launches.clear()
    outcome = scaling.run_plan(plan, str(tmp_path), device="cpu", budget=1)
    assert not launches and {o["status"] for o in outcome.values()} == {"not run"}


@pytest.mark.slow          # two mpirun launches of a tiny model (about 25 s on a 2-core CPU)
def test_the_whole_measurement_runs_on_the_cpu_under_mpirun(tmp_path):
    from lammps_helpers import require_lammps
    require_lammps()
    import torch

    from mixstack.potential import SO2Potential
    model = tmp_path / "tiny.pt"
    SO2Potential(lmax=1, focus_dim=8, n_focus=1, n_blocks=2, n_layers=2, radial_hidden=16, cutoff=3.0,
                 energy_scale=10.0, seed=3, dtype=torch.float32).save(model)
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--ranks", "1,2", "--levels", "0", "--strong", f"diamond:64:{model}",
            "--weak", f"cu-bcc:16:{model}", "--steps", "2", "--warmup", "1", "--budget", "300", "--no-plot",
            "--out", str(out)]
    from mixstack.cli import main
    rc = main(["scaling", *argv])             # in this process: the ranks are mpirun's
    assert rc == 0, (out / "launch.log").read_text()[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert {o["status"] for o in plan["outcome"].values()} == {"done"} and len(plan["outcome"]) == 4
    doc = json.loads((out / "scaling.json").read_text())
    assert doc["dry_run"] and len(doc["rows"]) == 4
    (check,) = doc["checks"]
    assert check["ranks"] == 2 and check["ok"] and check["force_rel"] < check["force_tolerance"]
    two = next(r for r in doc["rows"] if r["series"] == "strong" and r["ranks"] == 2)
    assert two["rank_devices"] == "0:cpu, 1:cpu" and two["steps_per_s"] > 0 and two["comm_ms"] is not None
    rec = json.loads((out / "points" / "strong-diamond-64-tiny-L0-r2.json").read_text())
    assert [c["local_rank_source"] for c in rec["model_calls"]] == ["MPI_LOCALRANKID"] * 2
    assert [c["calls"] for c in rec["model_calls"]] == [2, 2]           # the timed steps' calls alone
    assert "## Weak scaling" in (out / "scaling.md").read_text() and (out / "scaling.csv").exists()


def test_a_launch_runs_the_points_through_the_mixstack_command(tmp_path, monkeypatch):
    """Each MPI rank of a launch runs ``python -m mixstack scaling --worker PLAN`` (the command
    the worker lives behind), in its own process group."""
    seen = {}

    class FakePopen:
        def __init__(self, cmd, **kwargs):
            seen["cmd"], seen["env"] = cmd, kwargs["env"]
            self.pid = 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(scaling.runtime, "mpi_tool", lambda name: "/usr/bin/mpirun")
    monkeypatch.setattr(scaling.subprocess, "Popen", FakePopen)
    assert scaling._launch(2, "plan.json", str(tmp_path / "launch.log"), 10.0, "cpu") == (0, False)
    assert seen["cmd"][:3] == ["/usr/bin/mpirun", "-np", "2"]
    assert seen["cmd"][4:] == ["-m", "mixstack", "scaling", "--worker", "plan.json"]
    from mixstack.cli import parse_args
    assert parse_args(seen["cmd"][6:]).worker == "plan.json"


def test_scaling_report_again_from_a_folder_of_points(tmp_path, capsys):
    """``mixstack scaling --report DIR`` rewrites the report of DIR's finished points."""
    from mixstack.cli import main
    (tmp_path / "points").mkdir()
    assert main(["scaling", "--report", str(tmp_path), "--no-plot"]) == 0
    assert (tmp_path / "scaling.md").exists() and "scaling.json" in capsys.readouterr().out
