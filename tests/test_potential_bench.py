"""``mixstack bench model`` on the CPU: the tiny run, its results files, skips and failures."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ase")
from mixstack.bench import model_bench  # noqa: E402
from mixstack.cli import main  # noqa: E402

TINY = ["bench", "model", "--atoms", "8", "--lmax", "1", "--focus-dim", "16", "--layers", "2",
        "--blocks", "1", "--cutoff", "3.0", "--repeats", "2", "--warmup", "0", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)


def test_bench_model_writes_results_and_says_the_gpu_levels_were_skipped(capsys, tmp_path):
    out = tmp_path / "res"
    assert main([*TINY, "--levels", "0,1,2,3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "skipped L1, L2, L3 (GPU levels):" in printed
    assert "| diamond-8 |" in printed and "| cu-bcc-8 |" in printed
    data = json.loads((out / model_bench.JSON_NAME).read_text())
    assert data["schema"] == model_bench.SCHEMA and data["command"].startswith("mixstack bench model")
    assert [s["variant"] for s in data["skipped"]] == ["L1", "L2", "L3"]
    for cell in data["cells"]:
        (v,) = cell["variants"]
        assert cell["baseline"] == "L0-eager" and v["deviation"]["energy_per_atom"] == 0.0
        assert len(v["timing"]["samples_ms"]) == 2 and v["dispatch"]["fwd:reference"] >= 1
        assert cell["band"]["force_max"] < 1e-6 and cell["edges"] > 0
        assert v["deviation_f64"]["force_rel"] < 1e-4          # float32 rounding against the float64 copy
    assert (out / model_bench.MARKDOWN_NAME).read_text().startswith("# mixstack bench model")
    assert (out / model_bench.PLOT_NAME).read_bytes()[:4] == b"\x89PNG"


def test_deviation_from_the_baseline_catches_a_wrong_variant(monkeypatch):
    real = model_bench.frame_fn

    def perturbed(key, model):
        fn = real(key, model)
        if key == "0":
            return fn
        return lambda inp: tuple(1.001 * t for t in fn(inp))          # 0.1% off: far outside the band

    monkeypatch.setattr(model_bench, "frame_fn", perturbed)
    cfg = model_bench.ModelBenchConfig(cells=("cu-bcc",), atoms=(8,), variants=("0", "3"), rounds=1, warmup=0,
                                       model=dict(lmax=1, focus_dim=16, n_blocks=1, n_layers=2, cutoff=3.0),
                                       device="cpu")
    monkeypatch.setattr(model_bench, "skip_reason", lambda key, device: None)   # run "L3" here (as level 3)
    (cell,) = model_bench.run_model_bench(cfg)["cells"]
    base, other = cell["variants"]
    assert base["deviation"]["force_rel"] == 0.0
    assert other["deviation"]["force_rel"] == pytest.approx(1e-3, rel=1e-3)
    assert other["deviation"]["force_max"] > 100 * cell["band"]["force_max"]
    # the float64 reference sees it too, and sees the baseline right
    assert base["deviation_f64"]["force_rel"] < 1e-4
    assert other["deviation_f64"]["force_rel"] == pytest.approx(1e-3, rel=0.1)


def test_a_failing_variant_is_recorded_and_exits_nonzero(monkeypatch, capsys, tmp_path):
    def broken(key, model):
        def fail(inp):
            raise RuntimeError("kernel refused")
        return fail

    monkeypatch.setattr(model_bench, "frame_fn", broken)
    assert main([*TINY, "--cell", "cu-bcc", "--levels", "0", "--out", str(tmp_path)]) == 1
    assert "FAILED L0-eager on cu-bcc-8: RuntimeError: kernel refused" in capsys.readouterr().err
    assert (tmp_path / model_bench.JSON_NAME).exists()


def test_a_run_cut_off_keeps_the_cells_it_finished(monkeypatch, capsys, tmp_path):
    """A run killed mid-way (a time limit) must not lose the cells already measured: each is
    written when it finishes."""
    real, calls = model_bench._run_cell, []

    def cut_off(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt                      # the second cell never finishes
        return real(*args, **kwargs)

    monkeypatch.setattr(model_bench, "_run_cell", cut_off)
    with pytest.raises(KeyboardInterrupt):
        main([*TINY, "--levels", "0", "--out", str(tmp_path), "--md-steps", "0"])
    assert "diamond-8 done (1 of 2 cells)" in capsys.readouterr().out
    data = json.loads((tmp_path / model_bench.JSON_NAME).read_text())
    assert [c["label"] for c in data["cells"]] == ["diamond-8"]


def test_bench_model_rejects_operator_options_and_unknown_cells(capsys, tmp_path):
    assert main(["bench", "model", "--shape", "S1", "--out", str(tmp_path)]) == 2
    assert "unrecognized arguments: --shape S1" in capsys.readouterr().err
    assert main([*TINY, "--cell", "graphite", "--out", str(tmp_path)]) == 2
    assert "--cell graphite: unknown cell" in capsys.readouterr().err
    assert main([*TINY, "--lmax", "9", "--out", str(tmp_path)]) == 2
    assert "lmax must be in 1..6" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cells_come_close_to_the_asked_atom_counts():
    counts = {(name, n): len(model_bench.build_cell(name, n)) for name in model_bench.CELLS
              for n in model_bench.SIZES}
    assert counts[("cu-bcc", 2000)] == 2000 and counts[("diamond", 500)] == 512
    for (name, n), got in counts.items():
        assert abs(got - n) / n < 0.1, (name, n, got)


def test_cpu_defaults_are_small_and_say_what_they_leave_out():
    cfg = model_bench.default_config("cpu", quick=True)
    assert cfg.atoms == (64,) and cfg.variants[0] == "0" and "0c" not in cfg.variants
    assert any("L0-compile" in n for n in cfg.notes)
    assert model_bench.plan(cfg)[0] == ["0"]


def test_compiled_variants_are_parsed_and_compile_their_own_copy_of_the_energy():
    assert model_bench.parse_variants("0c,0,1c,L2-compile,3") == ("0c", "0", "1c", "2c", "3")
    with pytest.raises(ValueError, match="unknown level"):
        model_bench.parse_variants("4c")

    def energy(x):
        return x + 1

    a, b = model_bench.own_copy(energy, "1c"), model_bench.own_copy(energy, "2c")
    assert a.__code__ is not b.__code__ and a.__code__ is not energy.__code__   # one compile cache each
    assert a(1) == b(1) == 2


def test_graph_variants_are_parsed_and_skipped_without_cuda():
    assert model_bench.parse_variants("2g,L3-graph") == ("2g", "3g")
    assert model_bench.skip_reason("3g", "cpu") == "CUDA graphs need a CUDA device"
    assert model_bench.skip_reason("0", "cpu") is None
