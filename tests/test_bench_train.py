"""``mixstack bench train`` on the CPU at tiny sizes: the record, its files, what it says about
compiling, the float64 errors (and that they catch a wrong gradient), the chunked reference."""

from __future__ import annotations

import json

import pytest
import torch

from mixstack.bench import train_bench
from mixstack.cli import main
from mixstack.measure.shapes import BenchShape

TINY_SHAPE = BenchShape("tiny", 37, 2, 16, 2, 3)
TINY_MODEL = dict(lmax=1, focus_dim=16, n_focus=2, n_layers=2, n_blocks=1, cutoff=2.6)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)


def _config(**kw):
    base = dict(shapes=(TINY_SHAPE,), atoms=(), model=dict(TINY_MODEL), variants=("0",), rounds=2, warmup=0,
                device="cpu")
    return train_bench.TrainBenchConfig(**{**base, **kw})


def test_the_stack_step_is_timed_and_every_gradient_checked_against_float64():
    (case,) = train_bench.run_train_bench(_config())["cases"]
    (eager,) = case["variants"]
    assert case["workload"] == "stack" and case["case"] == "tiny"
    assert set(eager["rel_error"]) == {"u0", "alpha", "w0", "w1", "gw"}
    assert 0 < eager["max_rel_error"] < 1e-5                      # float32 rounding
    assert len(eager["timing"]["samples_ms"]) == 2 and eager["time_vs_l0"] == 1.0
    assert eager["dispatch"] == {"fwd:reference": 1, "bwd:reference": 1}


@pytest.mark.slow
def test_the_compiled_baseline_says_pytorch_cannot_compile_a_double_backward():
    (case,) = train_bench.run_train_bench(_config(variants=("0", "0c")))["cases"]
    _, compiled = case["variants"]
    assert compiled["timing"] is None and not compiled["failed"]
    assert compiled["note"].startswith("PyTorch cannot compile this step") and "double backward" in compiled["note"]


def test_a_wrong_gradient_shows_in_the_float64_errors(monkeypatch):
    real = train_bench.StackStep.gradients

    def off(self):
        grads = real(self)
        if self.level == 3:
            grads["w1"] = grads["w1"] * (1 + 1e-3)
        return grads
    monkeypatch.setattr(train_bench.StackStep, "gradients", off)
    monkeypatch.setattr(train_bench, "skip_reason", lambda key, device: None)   # "L3" runs here (as level 0)
    (case,) = train_bench.run_train_bench(_config(variants=("0", "3")))["cases"]
    base, wrong = case["variants"]
    assert base["max_rel_error"] < 1e-5
    assert wrong["rel_error"]["w1"] == pytest.approx(1e-3, rel=1e-2) and wrong["rel_error"]["u0"] < 1e-5


def test_the_chunked_float64_reference_is_the_whole_one():
    inp = train_bench._stack_inputs(TINY_SHAPE, torch.device("cpu"), seed=3)
    whole = train_bench._stack_reference64(TINY_SHAPE, inp, chunk=1000)
    chunked = train_bench._stack_reference64(TINY_SHAPE, inp, chunk=10)
    assert whole.keys() == chunked.keys() == {"u0", "alpha", "w0", "w1", "gw"}
    for name, g in whole.items():
        assert g.dtype == torch.float64
        torch.testing.assert_close(chunked[name], g, rtol=1e-12, atol=1e-14, msg=name)


def test_bench_train_writes_results_for_the_potential_and_says_what_did_not_run(capsys, tmp_path):
    pytest.importorskip("ase")
    out = tmp_path / "res"
    args = ["bench", "train", "--atoms", "8", "--lmax", "1", "--focus-dim", "16", "--layers", "2", "--blocks", "1",
            "--cutoff", "2.6", "--repeats", "1", "--warmup", "0", "--device", "cpu", "--levels", "0,1,2,3",
            "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "skipped L1, L2, L3 (GPU levels):" in printed and "| diamond-8 |" in printed
    data = json.loads((out / train_bench.JSON_NAME).read_text())
    assert data["schema"] == train_bench.SCHEMA and data["command"].startswith("mixstack bench train")
    (case,) = data["cases"]
    (v,) = case["variants"]
    assert case["workload"] == "potential" and case["atoms"] == 8 and case["edges"] > 0
    assert v["variant"] == "L0-eager" and 0 < v["max_rel_error"] < 1e-4
    assert any(name.startswith("blocks.0.stack.") for name in v["rel_error"])
    assert (out / train_bench.MARKDOWN_NAME).read_text().startswith("# mixstack bench train")
    csv = (out / "bench_train.csv").read_text()
    assert "step_time_median" in csv and "rel_error_blocks.0.stack.w0" in csv
    assert (out / train_bench.PLOT_NAME).read_bytes()[:4] == b"\x89PNG"


def test_bench_train_rejects_unknown_cells_and_levels(capsys, tmp_path):
    assert main(["bench", "train", "--cell", "graphite", "--out", str(tmp_path)]) == 2
    assert "--cell graphite" in capsys.readouterr().err
    assert main(["bench", "train", "--levels", "0,2f", "--out", str(tmp_path)]) == 2
    assert "bench train takes the levels" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_variants_and_defaults():
    assert train_bench.parse_variants("0,0c,L1,2,3") == ("0", "0c", "1", "2", "3")
    with pytest.raises(ValueError, match="bench train takes the levels"):
        train_bench.parse_variants("0,2f")
    gpu = train_bench.default_config("cpu").__class__()          # the dataclass defaults: every level
    assert gpu.variants == tuple(train_bench.VARIANTS)
    cpu = train_bench.default_config("cpu", quick=True)
    assert cpu.atoms == (64,) and cpu.variants == ("0", "0c") and cpu.notes
