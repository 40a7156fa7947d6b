"""``mixstack bench deepmd --processes``: each variant built in a process of its own, timed by the
coordinator in interleaved rounds; a build that fails or a process that dies is marked, not fatal;
a budget spent while building stops the workers."""

from __future__ import annotations

import json
import os

import pytest
from deepmd_cases import one_torch_thread, require_deepmd  # noqa: F401

from mixstack.bench import deepmd_bench as bench
from mixstack.bench import deepmd_workers as workers
from mixstack.cli import main

require_deepmd()

TINY = ["bench", "deepmd", "--atoms", "6", "--configs", "water", "--systems", "water", "--rcut", "3.0",
        "--rounds", "2", "--warmup", "1", "--device", "cpu"]


@pytest.mark.slow
def test_the_variants_build_in_their_own_processes_and_report_as_in_one(tmp_path, monkeypatch, capsys):
    """A build in this process would fail (``build_variant`` raises here), so every result comes
    from the workers: timed, broken down and run in MD as in one process, each step said."""
    def refuse(*args, **kwargs):
        raise AssertionError("built in the coordinator")
    monkeypatch.setattr(bench, "build_variant", refuse)
    assert main([*TINY, "--variants", "dp0,ms0g", "--processes", "--breakdown", "--breakdown-rounds", "1",
                 "--md-steps", "2", "--md-warmup", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    (case,) = record["cases"]
    for key in ("dp0", "ms0g"):
        v = case["variants"][key]
        assert "not_run" not in v, v.get("not_run")
        assert len(v["time"]["samples_ms"]) == 2 and v["time"]["median_ms"] > 0
        assert v["accuracy"]["force_max_abs"] < 1e-4
        assert v["breakdown"]["stages"]["value_path"]["forward_ms"] > 0
        assert v["md"]["steps"] == 2 and v["md"]["steps_per_s"] > 0
    assert case["variants"]["ms0g"]["accelerated"] == ["mixstack", "mixstack"]
    assert case["variants"]["ms0g"]["md"]["rebuilds"] >= 1
    said = capsys.readouterr().out
    for step in ("dp0: built + first frame: ", "ms0g: built + first frame: ", "timing 2 rounds (after 1 warm-up) x 2",
                 "breakdown dp0: ", "MD ms0g: "):
        assert said.count(f" s] {step}") == 1, step


def _payload(**change):
    from mixstack.cli import build_parser
    args = build_parser().parse_args([*TINY, "--variants", "dp0"])
    payload = {"build": bench.build_in_worker, "device": "cpu", "args": args, "config": {}, "state": {}, "inputs": (),
               "ref": {}}
    payload.update(change)
    return payload


def build_or_die(key, entry, payload, on_step):
    """The bench's build, except that ``dp3``'s process ends without a word (as one killed for
    memory would)."""
    if key == "dp3":
        on_step(f"{key}: about to die")
        os._exit(3)
    return bench.build_in_worker(key, entry, payload, on_step)


@pytest.mark.slow
def test_a_build_that_fails_or_a_process_that_dies_is_marked_and_the_others_are_kept():
    """A worker whose build raised reports the step and error; one whose process died before
    answering is named with its exit code; neither stops ``build_all``, and the steps a worker
    said before are passed on."""
    case = {"variants": {}}
    said = []
    progress = bench.Progress({}, on_step=said.append)
    # an empty config: deepmd-kit's model cannot be built from it; dp3's worker dies
    assert workers.build_all(["dp0", "dp3"], case, _payload(build=build_or_die), progress) == {}
    assert case["variants"]["dp0"]["not_run"].startswith("failed in dp0: built + first frame: ")
    assert case["variants"]["dp3"]["not_run"] == \
        "failed while building: its process exited without answering (exit code 3)"
    assert said == ["dp3: about to die"]


def test_a_budget_spent_while_building_stops_the_workers():
    case = {"variants": {}}
    progress = bench.Progress({}, seconds=0.01)
    assert workers.build_all(["dp0"], case, _payload(), progress, poll=0.05) == {}
    assert case["variants"]["dp0"]["not_run"] == "out of time (--seconds 0.01), while building"


@pytest.mark.parametrize("value", [None, "3"])
def test_each_worker_gets_its_share_of_the_compile_pool_unless_the_caller_set_one(monkeypatch, value):
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 16)
    if value is None:
        monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", value)
    with workers._compile_threads(6):
        inside = workers.os.environ["TORCHINDUCTOR_COMPILE_THREADS"]
    assert inside == (value or "2")
    assert workers.os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") == value


def test_a_worker_keeps_the_current_gpu_unless_its_device_names_one(monkeypatch):
    """``build_in_worker`` on "cuda" leaves the current device (``set_device`` refuses a device
    without an index: every worker failed so on a GPU once); "cuda:1" selects it."""
    import torch

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(Exception):                # the empty config fails later, on purpose
            bench.build_in_worker("dp0", {}, _payload(device=device), lambda text: None)
    assert chosen == [torch.device("cuda:1")]



class _Closing:
    def __init__(self, said, name):
        self.said, self.name = said, name

    def close(self, wait=None):
        self.said.append(("close", self.name))


def test_build_ahead_builds_every_case_before_any_is_timed(monkeypatch):
    """Every reference, then every case's builds started, all collected, and only then each case
    timed; the compile threads shared among all the workers."""
    said = []
    cases = [({"variants": {}, "name": name}, ["dp0", "ms0"], name) for name in ("water", "two_stream")]

    def prepare(case, variants, args, device, progress):
        said.append(("reference", case["name"]))
        return bench.Prepared({}, None, {}, {}, (), [], ())

    def start(keys, payload, *, share):
        said.append(("start", tuple(keys), share))
        return {key: _Closing(said, key) for key in keys}

    def collect(started, case, progress):
        said.append(("collect", case["name"]))
        return started

    monkeypatch.setattr(bench, "prepare_case", prepare)
    monkeypatch.setattr(workers, "start", start)
    monkeypatch.setattr(workers, "collect", collect)
    monkeypatch.setattr(bench, "run_built", lambda case, *a: said.append(("timed", case["name"])))
    bench.run_cases_built_ahead(cases, None, "cpu", bench.Progress({}), on_case=lambda label: None)
    assert said == [("reference", "water"), ("reference", "two_stream"),
                    ("start", ("dp0", "ms0"), 4), ("start", ("dp0", "ms0"), 4),
                    ("collect", "water"), ("collect", "two_stream"), ("timed", "water"), ("timed", "two_stream")]


def test_build_ahead_closes_every_worker_when_a_collect_fails(monkeypatch):
    said = []
    cases = [({"variants": {}, "name": name}, ["dp0"], name) for name in ("water", "two_stream")]
    monkeypatch.setattr(bench, "prepare_case", lambda *a: bench.Prepared({}, None, {}, {}, (), [], ()))
    monkeypatch.setattr(workers, "start", lambda keys, payload, *, share: {k: _Closing(said, k) for k in keys})

    def collect(started, case, progress):
        if case["name"] == "two_stream":
            raise KeyboardInterrupt
        return started

    monkeypatch.setattr(workers, "collect", collect)
    with pytest.raises(KeyboardInterrupt):
        bench.run_cases_built_ahead(cases, None, "cpu", bench.Progress({}))
    assert said == [("close", "dp0")]               # the first case's built worker (a failed collect closes its own)

def test_build_ahead_needs_processes(capsys):
    assert main([*TINY, "--variants", "dp0", "--build-ahead"]) != 0
    assert "--build-ahead builds the variants in processes of their own: add --processes" in capsys.readouterr().err
