"""``mixstack bench deepmd`` runs on a CPU at a tiny size and writes its results."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from deepmd_cases import one_torch_thread, require_deepmd  # noqa: F401

from mixstack.bench import deepmd_bench as bench
from mixstack.cli import main

require_deepmd()


TINY = ["bench", "deepmd", "--atoms", "6", "--configs", "water", "--systems", "water", "--variants", "dp0,ms0",
        "--rcut", "3.0", "--rounds", "2", "--warmup", "1", "--device", "cpu"]


def test_the_bench_writes_json_markdown_and_csv_with_two_variants(tmp_path, capsys):
    assert main(["bench", "deepmd", "--atoms", "6", "--configs", "water", "--systems", "water", "--variants",
                 "dp0,ms0", "--rcut", "3.0", "--rounds", "2", "--warmup", "1", "--breakdown", "--breakdown-rounds", "1",
                 "--md-steps", "2", "--md-warmup", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    (case,) = record["cases"]
    assert (case["config"], case["system"], case["atoms"]) == ("water", "water", 6)
    dp0, ms0 = case["variants"]["dp0"], case["variants"]["ms0"]
    assert dp0["accelerated"] is None and ms0["accelerated"] == ["mixstack", "mixstack"]
    for v in (dp0, ms0):
        assert len(v["time"]["samples_ms"]) == 2 and v["time"]["median_ms"] > 0
        assert v["accuracy"]["force_max_abs"] < 1e-4 and v["accuracy"]["force_rel"] < 1e-4
        assert v["peak_memory_bytes"] is None and v["device_memory_bytes"] is None    # measured on CUDA only
        stages = v["breakdown"]["stages"]
        assert stages["value_path"]["forward_ms"] > 0 and stages["value_path"]["backward_ms"] > 0
    for v, accelerated in ((dp0, None), (ms0, ["mixstack", "mixstack"])):           # NVE through deepmd's ASE calculator
        md = v["md"]
        assert md["steps"] == 2 and md["atoms"] == 6 and md["steps_per_s"] > 0 and md["accelerated"] == accelerated
        assert md["ns_per_day"] == pytest.approx(md["steps_per_s"] * 0.5 * 86400 / 1e6)
    assert dp0["breakdown"]["stages"]["wigner"]["forward_ms"] > 0                      # deepmd builds them
    assert ms0["breakdown"]["stages"]["wigner"] == {"forward_ms": 0.0, "backward_ms": 0.0}  # mixstack skips them
    assert record["env"]["deepmd_kit"] and record["command"].startswith("mixstack bench deepmd --atoms 6")
    markdown = (tmp_path / "deepmd_bench.md").read_text()
    assert "| peak MiB | device MiB |" in markdown
    assert "| water | water | 6 | ms0 |" in markdown and "| wigner | value path | rest of convolution |" in markdown
    assert markdown.count("| water | water | 6 | ms0 |") == 2                         # the frame row, the stage row
    assert (tmp_path / "deepmd_bench.csv").read_text().count("\n") == 3
    assert not {"running", "failed", "stopped"} & set(record) and "## Not run" not in markdown
    said = capsys.readouterr().out
    for step in ("float64 reference frame: ", "dp0: built + first frame: ", "ms0: built + first frame: ",
                 "timing 2 rounds (after 1 warm-up) x 2 variants: ", "breakdown dp0: ", "breakdown ms0: ",
                 "MD dp0: ", "MD ms0: "):                                             # a line each, as it ends
        assert said.count(f" s] {step}") == 1, step
    assert "(force max abs " in said and " steps/s)" in said


def test_out_of_time_the_bench_runs_nothing_writes_its_files_and_exits_0(tmp_path, capsys):
    assert main([*TINY, "--md-steps", "2", "--seconds", "0.001", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    why = "out of time (--seconds 0.001)"
    assert record["stopped"] == why and record["seconds"] == 0.001
    (case,) = record["cases"]
    assert case["not_run"] == why and case["variants"] == {"dp0": {"not_run": why}, "ms0": {"not_run": why}}
    assert f"- water / water / 6 atoms: {why}" in (tmp_path / "deepmd_bench.md").read_text()
    assert (tmp_path / "deepmd_bench.csv").read_text().count(why) == 2
    assert f"stopped: {why}" in capsys.readouterr().out


def test_the_record_is_on_disk_as_each_step_starts_and_a_budget_spent_midway_stops_the_rest(tmp_path, monkeypatch):
    real = bench.time_interleaved
    seen = {}

    def timing(*args, **kwargs):                # the record on disk names the step it is in, and what came before
        seen.update(json.loads((tmp_path / "deepmd_bench.json").read_text()))
        out = real(*args, **kwargs)
        monkeypatch.setattr(bench.Progress, "out_of_time", lambda self: self.record.setdefault("stopped", "spent"))
        return out
    monkeypatch.setattr(bench, "time_interleaved", timing)
    assert main([*TINY, "--breakdown", "--md-steps", "2", "--out", str(tmp_path)]) == 0
    assert seen["running"]["step"] == "timing 2 rounds (after 1 warm-up) x 2 variants"
    assert set(seen["cases"][0]["variants"]) == {"dp0", "ms0"} and "time" not in seen["cases"][0]["variants"]["dp0"]
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    assert record["stopped"] == "spent" and "running" not in record
    for v in record["cases"][0]["variants"].values():
        assert v["time"]["median_ms"] > 0 and v["steps_not_run"] == {"breakdown": "spent", "md": "spent"}
    assert "- water / water / 6 atoms, ms0: breakdown, MD: spent" in (tmp_path / "deepmd_bench.md").read_text()


def test_a_step_that_fails_leaves_the_steps_before_it_on_disk(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("profiler broke")
    monkeypatch.setattr(bench, "_stage_times", broken)
    with pytest.raises(RuntimeError, match="profiler broke"):
        main([*TINY, "--breakdown", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    assert record["failed"] == {"step": "breakdown dp0", "error": "RuntimeError: profiler broke"}
    for v in record["cases"][0]["variants"].values():                      # built, checked and timed before it
        assert v["accuracy"]["force_max_abs"] < 1e-4 and v["time"]["median_ms"] > 0
    assert "- failed in breakdown dp0: RuntimeError: profiler broke" in (tmp_path / "deepmd_bench.md").read_text()


def test_md_without_ase_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ase", None)
    assert main([*TINY, "--md-steps", "2", "--out", str(tmp_path)]) == 2
    assert 'pip install -e ".[deepmd]"' in capsys.readouterr().err and not (tmp_path / "deepmd_bench.json").exists()


def test_progress_times_steps_writes_around_them_and_stops_at_the_budget():
    now = [0.0]
    said, written = [], []
    record = {}
    progress = bench.Progress(record, seconds=10, start=0.0, on_step=said.append,
                              on_write=lambda r: written.append(json.dumps(r)), clock=lambda: now[0])
    with progress.step("one") as notes:
        now[0] = 2.5
        notes.append("fine")
    assert said == ["one: 2.5 s (fine)"] and [json.loads(w).get("running") for w in written] == [
        {"step": "one", "from_s": 0.0}, None]
    assert progress.out_of_time() is None
    now[0] = 10.0
    assert progress.out_of_time() == record["stopped"] == "out of time (--seconds 10)"
    with pytest.raises(ValueError), progress.step("two"):
        raise ValueError("bad\nmore")
    assert record["failed"] == {"step": "two", "error": "ValueError: bad"} and "running" not in record


@pytest.mark.parametrize("key, parsed", [("dp0", ("dp", 0, False, False, False, "exact")),
                                         ("ms3g", ("ms", 3, False, False, True, "exact")),
                                         ("dp2c", ("dp", 2, True, False, False, "exact")),
                                         ("dp2ct", ("dp", 2, True, True, False, "exact")),
                                         ("ms3cg", ("ms", 3, True, False, True, "exact")),
                                         ("ms3cpg", ("ms", 3, True, False, True, "compensated")),
                                         ("ms3ckg", ("ms", 3, True, False, True, "kernel")),
                                         ("ms3cpfg", ("ms", 3, True, False, True, "compensated", "fused")),
                                         ("ms3cf", ("ms", 3, True, False, False, "exact", "fused"))])
def test_variant_names(key, parsed):
    assert bench.parse_variant(key) == (parsed if len(parsed) == 7 else (*parsed, "deepmd"))


@pytest.mark.parametrize("key", ["ms4", "xx2", "dp", "ms2gg", "ms2gc", "dp2tc", "ms2x",
                                 "dp3cp", "ms3p", "ms3pc", "ms3cpk", "dp2ck", "dp2cf", "ms3f", "ms3cfp"])
def test_a_bad_variant_is_named(key):
    with pytest.raises(ValueError, match=repr(key)):
        bench.parse_variant(key)


def test_a_frame_runner_variant_runs_eagerly_on_a_cpu_with_md_through_its_calculator(tmp_path):
    assert main([*TINY[:9], "dp0,ms0g", *TINY[10:], "--breakdown", "--breakdown-rounds", "1", "--md-steps", "2",
                 "--md-warmup", "1", "--skin", "0.5", "--out", str(tmp_path)]) == 0
    (case,) = json.loads((tmp_path / "deepmd_bench.json").read_text())["cases"]
    v = case["variants"]["ms0g"]
    assert v["accelerated"] == ["mixstack", "mixstack"] and v["accuracy"]["force_max_abs"] < 1e-4
    assert v["time"]["median_ms"] > 0 and "replay_vs_eager" not in v            # no graph on a CPU
    assert all(set(w["run_to_run"]) == {"energy", "force", "virial"} and min(w["run_to_run"].values()) >= 0
               for w in case["variants"].values())
    assert v["breakdown"]["stages"]["edges"]["forward_ms"] > 0                  # the runner's packing
    assert v["md"]["steps"] == 2 and v["md"]["rebuilds"] >= 1 and v["md"]["captures"] == 0
    assert case["variants"]["dp0"]["breakdown"]["stages"]["edges"]["forward_ms"] > 0   # deepmd-kit's list
    markdown = (tmp_path / "deepmd_bench.md").read_text()
    assert "x fastest dp is against dp0" in markdown


def test_frames_that_are_not_bitwise_are_named_in_the_notes():
    case = {"config": "water", "atoms": 30, "variants": {
        "dp2c": {"run_to_run": {"energy": 0.0, "force": 3e-8, "virial": 0.0}},
        "ms3cg": {"run_to_run": {"energy": 0.0, "force": 0.0, "virial": 0.0},
                  "replay_vs_eager": {"energy": 1e-9, "force": 2.5e-8, "virial": 0.0}}}}
    assert bench._determinism_notes({"cases": [case]}) == [
        "- water / 30 atoms: frames not bitwise run to run (force max abs): dp2c 3.0e-08",
        "- water / 30 atoms: frames not bitwise replayed against eager (force max abs): ms3cg 2.5e-08"]
    case["variants"]["dp2c"]["run_to_run"]["force"] = 0.0
    case["variants"]["ms3cg"]["replay_vs_eager"] = {"energy": 0.0, "force": 0.0, "virial": 0.0}
    assert bench._determinism_notes({"cases": [case]}) == []


def test_a_variant_that_fails_to_build_is_marked_and_the_others_run(tmp_path, monkeypatch):
    real = bench.build_variant

    def build(key, *args, **kwargs):
        if key == "ms0":
            raise RuntimeError("no such kernel\nmore")
        return real(key, *args, **kwargs)
    monkeypatch.setattr(bench, "build_variant", build)
    assert main([*TINY, "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    (case,) = record["cases"]
    assert case["variants"]["ms0"]["not_run"] == "failed in ms0: built + first frame: RuntimeError: no such kernel"
    assert case["variants"]["dp0"]["time"]["median_ms"] > 0 and "failed" not in record


def test_the_anchor_is_the_fastest_deepmd_variant_at_float32_accuracy():
    def v(ms, err):
        return {"time": {"median_ms": ms}, "accuracy": {"force_max_abs": err}}

    case = {"variants": {"dp2c": v(35.0, 7.8e-7), "dp3c": v(30.0, 3.2e-5), "ms3cg": v(25.0, 7.7e-7)}}
    assert bench.fastest_deepmd(case) == ("dp2c", 35.0)              # dp3c: 40x the error, not the anchor
    case["variants"]["dp3c"]["accuracy"]["force_max_abs"] = 1.5e-6
    assert bench.fastest_deepmd(case) == ("dp3c", 30.0)              # within the band: it is
    assert bench.fastest_deepmd({"variants": {"ms3cg": v(25.0, 7.7e-7)}}) is None


def test_each_variant_is_set_against_deepmd_kit_by_frame_gpu_time_and_md(monkeypatch):
    """``x fastest dp`` against the anchor's frame, ``x dp busy`` against its GPU-busy time (the frame
    without the host's gap), ``x dp MD`` against the fastest MD of deepmd-kit's variants in the
    float32 band: a faster variant outside the band is not the anchor of any of them."""
    def v(ms, busy, md, err):
        return {"time": {"median_ms": ms, "p20_ms": ms, "p80_ms": ms}, "breakdown": {"busy_ms": busy},
                "md": {"steps_per_s": md}, "accuracy": {"force_max_abs": err}}

    case = {"variants": {"dp2c": v(35.0, 31.5, 25.0, 7.8e-7), "dp3c": v(35.1, 31.4, 26.0, 7.8e-7),
                         "dp2ct": v(20.0, 18.0, 40.0, 5e-5), "ms3cpg": v(27.0, 27.2, 33.8, 7.7e-7)}}
    ratios = bench.against_deepmd(case)
    assert ratios["ms3cpg"]["frame"] == pytest.approx(35.0 / 27.0)          # dp2c: the faster frame
    assert ratios["ms3cpg"]["busy"] == pytest.approx(31.5 / 27.2)           # dp2c's busy time, not dp3c's
    assert ratios["ms3cpg"]["md"] == pytest.approx(33.8 / 26.0)             # dp3c: the faster calculator
    assert ratios["dp2c"]["frame"] == 1.0 and ratios["dp2ct"]["md"] == pytest.approx(40.0 / 26.0)
    del case["variants"]["dp2c"]["breakdown"]
    assert bench.against_deepmd(case)["ms3cpg"]["busy"] is None             # no breakdown: no busy ratio
    monkeypatch.setattr(bench.report, "header_lines", lambda record: [])         # no run's env here
    monkeypatch.setattr(bench.report, "env_columns", lambda record: {})
    record = {"cases": [{"config": "water", "system": "water", "atoms": 9, **case}]}
    assert [r["x_dp_md"] for r in bench.long_rows(record)][-1] == pytest.approx(33.8 / 26.0)
    table = bench.markdown(record)
    header, _, *rows = [line for line in table.splitlines() if line.startswith("| ")][:6]
    assert "x dp busy" in header and "x dp MD" in header
    ms = next(r for r in rows if "| ms3cpg |" in r).split(" | ")
    cols = header.split(" | ")
    assert ms[cols.index("x fastest dp")] == "1.30" and ms[cols.index("x dp MD")] == "1.30"


def test_a_float64_reference_the_device_cannot_hold_runs_on_the_cpu_and_says_so(tmp_path, monkeypatch):
    """The float64 frame's first try runs out of device memory: it is computed again on the CPU, the
    variants are judged against it as usual, and the record and the table say where it ran."""
    real, tries = bench._reference_frame, []

    def reference_frame(model, frame, device):
        tries.append(str(device))
        if len(tries) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real(model, frame, device)
    monkeypatch.setattr(bench, "_reference_frame", reference_frame)
    assert main([*TINY, "--variants", "dp0", "--out", str(tmp_path)]) == 0
    assert tries == ["cpu", "cpu"]
    (case,) = json.loads((tmp_path / "deepmd_bench.json").read_text())["cases"]
    assert case["reference_device"].startswith("cpu (the float64 frame did not fit")
    assert case["variants"]["dp0"]["accuracy"]["force_max_abs"] < 1e-4
    assert "the float64 reference frame ran on the cpu" in (tmp_path / "deepmd_bench.md").read_text()


def test_each_config_runs_its_own_variants_in_one_run(tmp_path, capsys):
    assert main(["bench", "deepmd", "--atoms", "6", "--configs", "water,two_stream", "--systems", "water",
                 "--variants", "dp0,ms0", "--variants-for", "two_stream=dp0,ms0g", "--rcut", "3.0",
                 "--seconds", "0.001", "--device", "cpu", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    assert [(c["config"], list(c["variants"])) for c in record["cases"]] == [
        ("water", ["dp0", "ms0"]), ("two_stream", ["dp0", "ms0g"])]
    assert "variants dp0, ms0 (two_stream: dp0, ms0g)" in capsys.readouterr().out


@pytest.mark.parametrize("given, said", [("rocksalt=dp0", "takes CONFIG=LIST"), ("two_stream", "takes CONFIG=LIST"),
                                         ("two_stream=dp9", "--variants-for: "),
                                         ("default=dp0", "--variants-for: default is not among --configs")])
def test_a_bad_variants_for_is_named(tmp_path, capsys, given, said):
    code = None
    try:
        code = main([*TINY, "--variants-for", given, "--out", str(tmp_path / "out")])
    except SystemExit as exc:                   # argparse: the option's own type refused it
        code = exc.code
    assert code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()      # refused before anything was created


def test_md_throughputs_before_runs_once_after_the_warm_up():
    """The runner's counters are read as the timed steps begin, not again at their end."""
    from ase import Atoms
    from ase.calculators.lj import LennardJones

    from mixstack.bench.deepmd_md import md_throughput

    class Counting(LennardJones):
        computed = 0

        def calculate(self, *args, **kwargs):
            Counting.computed += 1
            super().calculate(*args, **kwargs)

    seen = []
    atoms = Atoms("Ar4", positions=[[0, 0, 0], [1.2, 0, 0], [0, 1.2, 0], [0, 0, 1.2]])
    md_throughput(Counting(sigma=1.0, epsilon=0.01, rc=3.0), atoms, steps=3, warmup=2, dt_fs=0.5, device="cpu",
                  before=lambda: seen.append(Counting.computed))
    assert len(seen) == 1 and 0 < seen[0] < Counting.computed          # after the warm-up, before the timed steps


def test_the_md_line_splits_the_captures_host_time():
    from mixstack.bench.deepmd_bench import _md_line

    md = {"steps_per_s": 12.3, "md_rebuilds": 5, "md_rebuild_s": 0.03, "md_captures": 2, "md_capture_s": 0.30,
          "md_events": [{"what": "rebuild", "seconds": 0.006},
                        {"what": "capture", "seconds": 0.16, "before_s": 0.02, "enter_s": 0.01, "record_s": 0.05,
                         "instantiate_s": 0.08},
                        {"what": "capture", "seconds": 0.14, "before_s": 0.02, "enter_s": 0.01, "record_s": 0.04,
                         "instantiate_s": 0.07}]}
    line = _md_line(md)
    assert ("2 capture(s) 0.30 s (warm-ups and pools 0.04, entering 0.02, recording 0.09, instantiating 0.15)"
            in line) and "pools" not in line.split(")")[-1]            # no pool kinds recorded: none said
    md["md_events"][1]["pool"], md["md_events"][2]["pool"] = "kept", "scaled"
    assert _md_line(md).endswith("; pools kept, scaled")
    del md["md_events"][1:]                                   # a record from before the split: no split
    assert _md_line(md).endswith("2 capture(s) 0.30 s")


def test_the_drift_is_the_least_squares_slope_with_its_standard_error():
    import numpy as np

    from mixstack.bench.deepmd_bench import _drift_cell
    from mixstack.bench.md_bench import drift

    t = np.arange(101) * 5e-4                                  # 100 steps of 0.5 fs, in ps
    slope, se = drift(t, 2e-6 * t - 400.0)                     # eV/atom: a straight line, 2e-3 meV/atom/ps
    assert slope == pytest.approx(2e-3, rel=1e-6) and se < 1e-9
    noisy = 2e-6 * t + np.random.default_rng(0).normal(0.0, 1e-9, t.size)
    slope, se = drift(t, noisy - 400.0)                        # the offset changes nothing
    fit, cov = np.polyfit(t, noisy * 1e3, 1, cov=True)         # numpy's own slope and its standard error
    assert slope == pytest.approx(fit[0], rel=1e-6) and se == pytest.approx(np.sqrt(cov[0, 0]), rel=1e-3)
    assert se > 0 and all(np.isnan(drift(t[:2], noisy[:2])))
    assert _drift_cell({"drift_mev_atom_ps": 1.02e-3, "drift_se_mev_atom_ps": 4.1e-5}) == "0.00102 ± 4.1e-05"
    assert _drift_cell({"drift_mev_atom_ps": 1.02e-3}) == "0.00102"   # a record without the error


def test_the_drift_notes_tell_a_larger_drift_from_noise():
    from mixstack.bench.deepmd_bench import _drift_notes

    def case(ms_drift):
        md = lambda d: {"md": {"drift_mev_atom_ps": d, "drift_se_mev_atom_ps": 1e-5}}   # noqa: E731
        return {"config": "water", "atoms": 4000,
                "variants": {"dp2c": md(-0.99e-3), "dp3c": md(0.98e-3), "ms3cpg": md(ms_drift), "ms3ckg": {}}}

    same, larger, smaller = (_drift_notes({"cases": [case(d)]}) for d in (1.0e-3, 1.2e-3, -0.5e-3))
    assert len(same) == 1 and "against dp3c's 0.00098" in same[0] and same[0].endswith("within two standard errors")
    assert larger[0].endswith("larger by 15.6 standard errors")
    assert smaller[0].endswith("no larger")
    assert _drift_notes({"cases": [{"config": "water", "atoms": 4, "variants": {"ms3cpg": {}}}]}) == []
