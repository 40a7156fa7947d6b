"""Where a frame's time goes (``bench.breakdown``) and MD throughput (``bench.md``) on the CPU: the
attribution of forward and backward time to stages, the sums that must add up, and the CLI and
results files of ``mixstack bench model --breakdown --md-steps``."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("ase")
from mixstack.bench import breakdown, model_bench  # noqa: E402
from mixstack.cli import main  # noqa: E402
from mixstack.measure.timing import clock_for  # noqa: E402

TINY_MODEL = dict(lmax=1, focus_dim=16, n_focus=2, n_blocks=1, n_layers=2, cutoff=3.0)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)


def _profiled_toy():
    """Two stages: a big product in ``a`` (forward and backward), a sine in ``b``."""
    x = torch.randn(300, 300, requires_grad=True)
    with torch.profiler.profile() as prof:
        with torch.profiler.record_function(breakdown.STAGE_PREFIX + "a"):
            y = x @ x @ x
        with torch.profiler.record_function(breakdown.STAGE_PREFIX + "b"):
            z = y.sin().sum()
        torch.autograd.grad(z, x)
    return prof.events()


def test_backward_time_is_charged_to_the_stage_whose_forward_made_the_node():
    # Which stage each backward node's time goes to, not how long it took (times on a shared,
    # loaded core swap the two stages' sizes): the forward's events with one node's events alone.
    events = _profiled_toy()
    for node, stage, not_stage in (("MmBackward", "a", "b"), ("SinBackward", "b", "a")):
        kept = [e for e in events if (n := breakdown._stage_of(e)[1]) is None or node in n.name]
        times, _, _ = breakdown.attribute(kept, "cpu")
        assert times[(stage, "backward")] > 0 and (not_stage, "backward") not in times, node
    times, attributed, total = breakdown.attribute(events, "cpu")
    assert times[("a", "forward")] > 0 and times[("b", "forward")] > 0
    assert times[("a", "backward")] > 0 and times[("b", "backward")] > 0
    assert attributed == pytest.approx(sum(times.values())) and total == attributed


def test_without_the_sequence_numbers_backward_time_falls_to_other():
    """Negative control: the forward-backward link is what puts backward time in a stage."""
    events = _profiled_toy()
    for e in events:
        if e.name.startswith(breakdown.BACKWARD_PREFIX):
            e.sequence_nr = -7
    times, _, _ = breakdown.attribute(events, "cpu")
    assert ("a", "backward") not in times and times[(breakdown.OTHER, "backward")] > 0


def test_the_device_total_leaves_out_the_profilers_copies_of_the_stage_ranges():
    """Kineto lists each ``record_function`` range again on the GPU timeline, spanning the
    range's kernels; counted as kernels they more than doubled the busy time on the H200."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def device_event(name, us):
        return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_time=us)

    events = [device_event("gate_kernel", 5.0), device_event("void gemm<...>", 7.0),
              device_event(breakdown.STAGE_PREFIX + "stack", 12.0), device_event(breakdown.FRAME_RANGE, 13.0),
              SimpleNamespace(name="aten::mm", device_type=DeviceType.CPU, device_time=0.0)]
    assert breakdown.kernel_time(events) == 12.0


def test_a_frames_breakdown_names_every_stage_and_adds_up():
    from ase.build import bulk

    from mixstack.potential import SO2Potential, atoms_inputs, stages
    model = SO2Potential(**TINY_MODEL).eval().requires_grad_(False)
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=0)
    b = breakdown.measure(model, atoms_inputs(atoms, model.cutoff), "0", 0, "cpu", clock_for(torch.device("cpu")),
                          rounds=1, stage_order=stages.STAGES)
    level0 = [s for s in stages.STAGES if s != stages.ROTATE_OUT]
    assert list(b["stages"]) == level0 + [breakdown.OTHER]
    for name in (stages.RADIAL, stages.ROTATE_IN, stages.STACK, stages.NODE_UPDATE):
        assert b["stages"][name]["forward_ms"] > 0 and b["stages"][name]["backward_ms"] > 0, name
    total = sum(t["forward_ms"] + t["backward_ms"] for t in b["stages"].values()) + b["unattributed_ms"]
    assert total == pytest.approx(b["busy_ms"])
    assert b["busy_ms"] + b["idle_ms"] == pytest.approx(b["profiled_frame_ms"])
    assert b["staged_frame_ms"] > 0 and b["mode"] == "eager"


def test_md_reports_throughput_and_drift():
    from ase.build import bulk

    from mixstack.bench.md_bench import run_md
    from mixstack.potential import SO2Potential
    model = SO2Potential(**TINY_MODEL, energy_scale=10.0)
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
    res = run_md(model, atoms, 0, compiled=False, steps=4, warmup=1, skin=0.5)
    assert res["steps"] == 4 and res["atoms"] == 16 and res["steps_per_s"] > 0
    assert res["ns_per_day"] == pytest.approx(res["steps_per_s"] * 86400 * 1e-6)
    assert res["us_per_atom_step"] == pytest.approx(1e6 / res["steps_per_s"] / 16)
    assert abs(res["drift_mev_atom_ps"]) < 50 and res["max_excursion_mev_atom"] < 5
    assert len(atoms.calc.results if atoms.calc else []) == 0          # the caller's atoms are untouched


@pytest.mark.slow
def test_bench_model_breakdown_and_md_reach_the_results_files(tmp_path):
    out = tmp_path / "res"
    argv = ["bench", "model", "--cell", "cu-bcc", "--atoms", "8", "--lmax", "1", "--focus-dim", "16", "--layers",
            "2", "--blocks", "1", "--cutoff", "3.0", "--repeats", "1", "--warmup", "0", "--device", "cpu",
            "--levels", "0", "--breakdown", "--md-steps", "2", "--md-atoms", "8", "--out", str(out), "--no-plot"]
    assert main(argv) == 0
    data = json.loads((out / model_bench.JSON_NAME).read_text())
    (cell,) = data["cells"]
    (v,) = cell["variants"]
    assert v["breakdown"]["stages"]["stack"]["backward_ms"] > 0
    assert v["md"]["steps"] == 2 and v["md"]["steps_per_s"] > 0
    assert cell["neighbour_list"]["fresh_ms"] > 0 and cell["neighbour_list"]["kept_list_cut_ms"] > 0
    text = (out / model_bench.MARKDOWN_NAME).read_text()
    assert "## Where the time goes: cu-bcc-8" in text and "## Molecular dynamics" in text
    csv = (out / "bench_model.csv").read_text()
    assert "stage_backward_time" in csv and "us_per_atom_step" in csv and "neighbour_list_fresh_time" in csv


def test_the_operator_bench_refuses_the_model_only_options(capsys):
    assert main(["bench", "--breakdown", "--device", "cpu"]) == 2
    assert "unrecognized arguments: --breakdown" in capsys.readouterr().err


def test_the_md_table_says_how_many_frames_a_graphed_run_captured():
    common = dict(steps=100, dt_fs=1.0, warmup_steps=5, temperature_K=300.0, skin=1.0, steps_per_s=20.0,
                  ns_per_day=1.7, us_per_atom_step=11.0, drift_mev_atom_ps=1e-4, max_excursion_mev_atom=1e-4,
                  neighbour_rebuilds=2)
    record = {"cells": [{"label": "cu-bcc-4394", "variants": [
        {"variant": "L3-graph", "md": {**common, "graph_captures": 3}},
        {"variant": "L3", "md": {**common, "graph_captures": None}}]}]}
    graphed, eager = model_bench.md_rows(record)
    assert graphed["graph captures"] == "3" and eager["graph captures"] == "—"
    assert "graph captures" in model_bench.markdown_table([graphed, eager])
