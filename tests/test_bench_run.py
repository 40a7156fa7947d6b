"""The CPU bench end to end: results files, skipped levels, accuracy, failures, progress."""

import csv
import json
import sys

import pytest
import torch

from mixstack.bench import stack_bench
from mixstack.bench import stack_report as report
from mixstack.measure import counts
from mixstack.measure.shapes import SMALL, BenchShape, make_inputs

TINY = BenchShape("tiny", edges=37, focus=2, focus_dim=16, lmax=2, layers=3)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _config(**kw):
    base = dict(shapes=(TINY,), variants=("0",), rounds=2, warmup=1, device="cpu", roof_n=128)
    base.update(kw)
    return stack_bench.BenchConfig(**base)


@pytest.fixture(scope="module")
def record():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        return stack_bench.run_bench(_config(variants=("0", "1", "2", "3")), command="mixstack bench test")


def test_results_folder_holds_json_markdown_and_png(record, tmp_path):
    paths = report.write(record, tmp_path / "out")
    assert set(paths) == {"json", "markdown", "csv", "plot"}
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == stack_bench.SCHEMA and data["command"] == "mixstack bench test"
    for key in ("date", "mixstack", "git_revision", "python", "torch", "triton", "cuda", "driver",
                "device", "float32_matmul_precision", "triton_levels", "active_level"):
        assert key in data["env"], key
    assert data["env"]["device"]["type"] == "cpu"
    assert data["roof"]["fp32_tflops"] > 0 and data["roof"]["copy_gbps"] > 0
    assert [t["pass"] for t in data["timings"]] == ["fwd", "bwd", "both"]
    for t in data["timings"]:
        assert t["variant"] == "L0-eager" and t["shape"] == "tiny"
        assert len(t["samples_ms"]) == t["rounds"] == 2
        assert t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]
        assert t["flops"] == counts.flops(TINY, t["pass"])
        assert t["min_bytes"] == counts.min_bytes(TINY, t["pass"])
        assert t["tflops"] == pytest.approx(t["flops"] / (t["median_ms"] / 1e3) / 1e12)
        assert 0 < t["fp32_roof_fraction"]
    md = paths["markdown"].read_text()
    assert "| shape | variant | fwd ms | bwd ms | fwd+bwd ms | peak MiB |" in md
    assert "| tiny | L0-eager |" in md
    assert "| tiny | L0-eager | bwd |" in md
    assert data["env"]["torch"] in md and data["env"]["date"] in md
    assert paths["plot"].read_bytes()[:8] == PNG_MAGIC
    rows = list(csv.DictReader(paths["csv"].open()))
    medians = {r["metric"]: float(r["value"]) for r in rows if r["metric"].startswith("time_median_")}
    assert medians == pytest.approx({f"time_median_{t['pass']}": t["median_ms"] for t in data["timings"]})
    assert {"rel_error_out", "rel_error_grad_u0"} <= {r["metric"] for r in rows}   # (peak memory: CUDA only)
    for r in rows:                      # every measurement carries where and with what it was made
        assert r["date"] == data["env"]["date"] and r["torch"] == data["env"]["torch"]
        assert r["gpu"] == data["env"]["device"]["name"] and r["case"] == "tiny" and r["bench"] == "stack"


def test_gpu_levels_are_skipped_on_cpu_with_the_reason(record):
    skipped = {s["variant"]: s["reason"] for s in record["skipped"]}
    assert set(skipped) == {"L1", "L2", "L3"}
    assert all("CUDA" in r and "TRITON_INTERPRET" in r for r in skipped.values())
    assert {t["variant"] for t in record["timings"]} == {"L0-eager"}
    assert "L1 skipped" in report.markdown(record)


def test_probe_records_paths_errors_and_no_memory_on_cpu(record):
    (v,) = record["shapes"][0]["variants"]
    assert v["dispatch"] == {"fwd:reference": 1, "bwd:reference": 1}
    assert set(v["rel_error"]) == {"out", "grad_u0", "grad_alpha"}
    assert all(0 < e < 1e-5 for e in v["rel_error"].values())
    assert v["peak_mib"] is None and v["failed"] is None
    assert record["shapes"][0]["check_edges"] == TINY.edges


def test_accuracy_check_catches_a_wrong_variant(monkeypatch):
    real = stack_bench.forward_fn

    def perturbed(key, shape, inp):
        fwd = real(key, shape, inp)
        return lambda u0, alpha: fwd(u0, alpha) * (1 + 1e-3)

    monkeypatch.setattr(stack_bench, "forward_fn", perturbed)
    rec = stack_bench.run_bench(_config(passes=("fwd",), rounds=1, warmup=0))
    err = rec["shapes"][0]["variants"][0]["rel_error"]
    assert err["out"] == pytest.approx(1e-3, rel=1e-2)
    assert err["grad_u0"] == pytest.approx(1e-3, rel=1e-2)


def test_a_failing_variant_is_recorded_and_the_others_still_run(monkeypatch):
    real = stack_bench.forward_fn

    def broken(key, shape, inp):
        if key == "0c":
            def fail(u0, alpha):
                raise RuntimeError("compiler said no")
            return fail
        return real(key, shape, inp)

    monkeypatch.setattr(stack_bench, "forward_fn", broken)
    rec = stack_bench.run_bench(_config(variants=("0", "0c"), passes=("bwd",), rounds=1, warmup=0))
    by_name = {v["variant"]: v for v in rec["shapes"][0]["variants"]}
    assert by_name["L0-compile"]["failed"] == "RuntimeError: compiler said no"
    assert by_name["L0-eager"]["failed"] is None
    assert {t["variant"] for t in rec["timings"]} == {"L0-eager"}
    assert "compiler said no" in report.markdown(rec)


def test_progress_steps_add_up_to_the_announced_total():
    cfg = _config(passes=("fwd", "bwd"), rounds=2, warmup=1)
    steps = []
    stack_bench.run_bench(cfg, on_step=steps.append)
    assert len(steps) == stack_bench.total_steps(cfg)


def test_the_run_is_exact_fp32_and_restores_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        rec = stack_bench.run_bench(_config(passes=("fwd",), rounds=1, warmup=0))
        assert rec["env"]["float32_matmul_precision"] == "highest"
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_plot_without_matplotlib_names_the_pip_fix(record, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[bench\]"` from a clone'):
        report.write(record, tmp_path)
    assert (tmp_path / report.JSON_NAME).exists() and (tmp_path / report.MARKDOWN_NAME).exists()


def test_parse_variants_accepts_keys_and_names():
    assert stack_bench.parse_variants("0,0c,1,2") == ("0", "0c", "1", "2")
    assert stack_bench.parse_variants("L0-eager, L0-compile,l3") == ("0", "0c", "3")
    assert stack_bench.parse_variants("1,1") == ("1",)
    with pytest.raises(ValueError, match="unknown level"):
        stack_bench.parse_variants("0,9")


def test_cpu_defaults_are_small_level_zero_and_say_what_they_leave_out():
    cfg = stack_bench.default_config("cpu")
    assert cfg.shapes == tuple(SMALL.values())
    keys, skipped = stack_bench.plan(cfg)
    assert keys == ["0"]
    assert {s["variant"] for s in skipped} == {"L1", "L2", "L2-fused", "L3"}
    assert any("L0-compile" in n for n in cfg.notes)
    assert stack_bench.default_config("cpu", quick=True).shapes == (SMALL["C1"],)


def test_inputs_are_reproducible_nonzero_and_scaled_like_the_module():
    a, b = make_inputs(TINY, "cpu", seed=3), make_inputs(TINY, "cpu", seed=3)
    assert torch.equal(a.u0, b.u0) and torch.equal(a.w1, b.w1) and torch.equal(a.grad_out, b.grad_out)
    assert not torch.equal(a.u0, make_inputs(TINY, "cpu", seed=4).u0)
    assert (a.alpha > 0).all() and torch.allclose(a.alpha.sum(-1), torch.ones(TINY.edges))
    assert (a.u0 != 0).all() and not a.w0.requires_grad
    big = make_inputs(BenchShape("w", 1, 2, 32, 3, 4), "cpu")
    assert big.w0.std().item() == pytest.approx((128 * 4) ** -0.5, rel=0.05)
    assert big.gw.std().item() == pytest.approx(32 ** -0.5, rel=0.05)


def test_a_pass_that_fails_while_timed_is_recorded_and_the_others_still_run(monkeypatch):
    real = stack_bench.pass_task

    def broken(pass_, *args):
        if pass_ == "bwd":
            def fail():
                raise RuntimeError("out of memory, pretend")
            return stack_bench.Task(run=fail)
        return real(pass_, *args)

    monkeypatch.setattr(stack_bench, "pass_task", broken)
    rec = stack_bench.run_bench(_config(passes=("fwd", "bwd"), rounds=1, warmup=0))
    assert rec["shapes"][0]["failed_passes"] == {"bwd": "RuntimeError: out of memory, pretend"}
    assert [t["pass"] for t in rec["timings"]] == ["fwd"]
    assert "bwd: timing failed: RuntimeError: out of memory, pretend" in report.markdown(rec)


def test_results_files_are_replaced_whole_and_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    from mixstack.measure import report as results
    path = results.replace_text(tmp_path / "r.json", "old\n")
    results.replace_text(path, "new\n")
    assert path.read_text() == "new\n"

    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(results.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        results.replace_text(path, "half")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_csv_rows_may_lack_columns_the_others_have(tmp_path):
    from mixstack.measure import report as results
    path = results.write_csv([{"a": 1}, {"a": 2, "b": 3}], tmp_path / "r.csv")
    assert list(csv.reader(path.open())) == [["a", "b"], ["1", ""], ["2", "3"]]
