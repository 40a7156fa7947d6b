"""`mixstack info` and `mixstack bench` through `mixstack.cli.main`: what they print and write,
and how bad input ends.  The command's shape (help, version, targets, option types) is
tests/test_cli_shape.py."""

import json

import pytest
import torch

from mixstack.cli import main

TINY_ARGS = ["--edges", "29", "--focus", "1", "--focus-dim", "16", "--lmax", "1", "--layers", "2",
             "--repeats", "2", "--warmup", "0", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)


def test_info_reports_versions_level_interpreter_and_tables(capsys):
    assert main(["info", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    assert "Triton " in out and "CUDA " in out
    assert "device: cpu" in out
    assert "TRITON_INTERPRET: not set" in out
    assert "Triton levels (1-3): cannot run here" in out
    assert "tuning table (built-in):" in out and "tuning table (user):" in out


def test_info_counts_the_valid_entries_of_the_user_table(capsys, monkeypatch, tmp_path):
    from mixstack import tuning
    from mixstack.tuning import validity
    monkeypatch.setenv("MIXSTACK_CACHE_DIR", str(tmp_path))
    key = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
    entry = dict(validity.current("stack_bwd_fused"), device="cpu", config=None, date="2026-11-30")
    tuning.record("stack_bwd_fused", key, entry, device_name="cpu")
    assert main(["info", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"tuning table (user): {tmp_path}" in out and "stack_bwd_fused 1" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU default level")
def test_info_says_where_the_level_comes_from(capsys, monkeypatch):
    main(["info"])
    assert "level: 0, from the default" in capsys.readouterr().out
    monkeypatch.setenv("MIXSTACK_LEVEL", "2")
    main(["info"])
    out = capsys.readouterr().out
    assert "level: 2, from the MIXSTACK_LEVEL environment variable" in out
    assert "calls run level 0 here" in out


def test_info_sees_the_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    main(["info", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "TRITON_INTERPRET: set" in out
    assert "Triton levels (1-3): can run here" in out


def test_info_json_is_the_environment_record(capsys):
    assert main(["info", "--json", "--device", "cpu"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["torch"] == torch.__version__
    assert record["triton_levels"]["available"] is False
    assert record["active_level"]["source"] in {"default", "set_level", "use_level", "MIXSTACK_LEVEL"}


def test_bench_writes_results_and_says_the_gpu_levels_were_skipped(capsys, tmp_path):
    out_dir = tmp_path / "res"
    rc = main(["bench", *TINY_ARGS, "--levels", "0,1,2,3", "--pass", "bwd", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "skipped L1, L2, L3 (GPU levels):" in out
    assert "| custom | L0-eager |" in out                  # the summary table (plain: not a tty)
    data = json.loads((out_dir / "bench.json").read_text())
    assert data["command"].startswith("mixstack bench --edges 29")
    assert data["config"]["passes"] == ["bwd"] and data["config"]["rounds"] == 2
    assert [t["pass"] for t in data["timings"]] == ["bwd"]
    assert (out_dir / "bench.md").exists()
    assert (out_dir / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_rejects_unknown_shapes_passes_and_levels(capsys, tmp_path):
    assert main(["bench", "--shape", "S9", "--out", str(tmp_path)]) == 2
    assert "unknown shape 'S9'" in capsys.readouterr().err
    assert main(["bench", *TINY_ARGS, "--pass", "sideways", "--out", str(tmp_path)]) == 2
    assert "--pass takes fwd, bwd, both" in capsys.readouterr().err
    assert main(["bench", *TINY_ARGS, "--levels", "7", "--out", str(tmp_path)]) == 2
    assert "unknown level" in capsys.readouterr().err
    assert main(["bench", *TINY_ARGS, "--lmax", "9", "--out", str(tmp_path)]) == 2
    assert "lmax must be in 1..6" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_bench_with_only_skipped_levels_runs_nothing(capsys, tmp_path):
    assert main(["bench", *TINY_ARGS, "--levels", "1", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "skipped L1 (GPU levels)" in captured.out
    assert "nothing to run" in captured.err


def test_bench_exits_nonzero_when_a_variant_fails(capsys, tmp_path, monkeypatch):
    from mixstack.bench import stack_bench

    def broken(key, shape, inp):
        def fail(u0, alpha):
            raise RuntimeError("kernel refused")
        return fail

    monkeypatch.setattr(stack_bench, "forward_fn", broken)
    assert main(["bench", *TINY_ARGS, "--levels", "0", "--out", str(tmp_path)]) == 1
    assert "FAILED L0-eager on custom: RuntimeError: kernel refused" in capsys.readouterr().err
    assert (tmp_path / "bench.json").exists()


def test_python_dash_m_runs_the_cli():
    """``scripts/gpu_check.sh`` runs ``python -m mixstack.cli``: the module must call main."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "mixstack", "info", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "device: cpu" in done.stdout


@pytest.mark.parametrize("argv, says", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([], "choose a command"),
    (["info", "--device", "banana"], "unknown device 'banana'"),
    (["bench", "--device", "tpu"], "unknown device 'tpu'"),
    (["bench", "--device", "meta"], "device meta is not supported"),
    (["bench", "--repeats", "0"], "argument --repeats: must be an integer >= 1, got '0'"),
    (["bench", "--warmup", "-1"], "argument --warmup: must be an integer >= 0, got '-1'"),
    (["bench", "--edges", "-5"], "argument --edges: must be an integer >= 1, got '-5'"),
    (["bench", "--edges", "0"], "argument --edges: must be an integer >= 1, got '0'"),
    (["bench", "--focus", "2"], "--focus: sizes of a custom shape; give its --edges too"),
    (["bench", "--out", "x", "model"], "unrecognized arguments: model"),
    (["bench", "model", "--atoms", "0"], "argument --atoms: must be an integer >= 1, got '0'"),
    (["bench", "model", "--lmax", "9"], "--lmax must be in 1..6"),
    (["bench", "model", "--cutoff", "0"], "argument --cutoff: must be a number > 0, got '0'"),
    (["bench", "grid", "--focus-dim", "16,x"], "argument --focus-dim: must be integers >= 1 separated by commas"),
    (["bench", "train", "--cell", "graphite"], "--cell graphite: unknown cell"),
    (["freeze", "x.pt2", "--structure", "no/such/file.xyz"], "--structure no/such/file.xyz: no such file"),
    (["freeze", "x.pt2", "--checkpoint", "nosuch.pt"], "--checkpoint nosuch.pt: no such file"),
    (["tune", "--rounds", "0"], "argument --rounds: must be an integer >= 1, got '0'"),
    (["md", "--structure", "no/such/file.xyz"], "--structure no/such/file.xyz: no such file"),
    (["md", "--model", "nosuch.pt"], "--model nosuch.pt: no such file"),
    (["md", "--atoms", "0"], "argument --atoms: must be an integer >= 1, got '0'"),
    (["md", "--timestep", "0"], "argument --timestep: must be a number > 0, got '0'"),
    (["md", "--json", "/proc/nope/run.json"], "--json /proc/nope/run.json: cannot write /proc/nope"),
    (["scaling", "--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["scaling", "--strong", "", "--weak", ""], "--strong and --weak are both empty"),
    (["scaling", "--levels", "2,7", "--device", "cpu"], "--levels takes 0, 1, 2, 3 or default; got 7"),
    (["scaling", "--report", "nowhere"], "--report nowhere: no points/ folder"),
    (["md", "--engine", "ase", "--ensemble", "npt"], "--engine ase runs nve and nvt"),
    (["md", "--device", "tpu"], "unknown device 'tpu'"),
    (["bench", "deepmd", "--atoms", "0"], "argument --atoms: must be an integer >= 1, got '0'"),
    (["bench", "deepmd", "--systems", "water,graphene"], "argument --systems: takes water, rocksalt"),
    (["bench", "deepmd", "--configs", "dpa3"], "argument --configs: takes water, two_stream, default"),
    (["bench", "deepmd", "--rest-level", "4"], "argument --rest-level: invalid choice: 4"),
    (["bench", "deepmd", "--md-dt", "0"], "argument --md-dt: must be a number > 0, got '0'"),
    (["bench", "deepmd", "--variants", "dp0,ms4"], "--variants: variant must be dpN or msN"),
])
def test_bad_input_ends_with_one_line_that_names_it_and_no_traceback(capsys, tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_bench_deepmd_without_deepmd_kit_names_the_extra(capsys, tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "deepmd", None)
    monkeypatch.setitem(sys.modules, "deepmd.pt", None)
    assert main(["bench", "deepmd", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'mixstack bench: error: mixstack.deepmd needs deepmd-kit' in err and 'pip install -e ".[deepmd]"' in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_a_gpu_shape_on_a_cpu_is_announced_as_minutes_long():
    from mixstack.bench import stack_bench
    from mixstack.cli.bench.stack import cpu_warnings
    from mixstack.measure import shapes
    cfg = stack_bench.default_config("cpu")
    assert cpu_warnings(cfg, torch.device("cpu")) == []                       # the CPU sizes
    big = [shapes.shape_by_name("S1")]
    from dataclasses import replace
    (line,) = cpu_warnings(replace(cfg, shapes=tuple(big)), torch.device("cpu"))
    assert "S1" in line and "minutes" in line
    assert cpu_warnings(replace(cfg, shapes=tuple(big)), torch.device("meta")) == []


def test_rounds_that_disagree_are_reported():
    from mixstack.bench.stack_report import consistency_warnings
    row = dict(shape="S1", variant="L2", median_ms=10.0, rel_spread=0.01)
    quiet = {"timings": [dict(row, **{"pass": "bwd"}), dict(row, **{"pass": "both"}, median_ms=18.0)]}
    assert consistency_warnings(quiet) == []
    noisy = {"timings": [dict(row, **{"pass": "bwd"}, rel_spread=0.3),
                         dict(row, **{"pass": "both"}, median_ms=9.0)]}
    lines = consistency_warnings(noisy)
    assert len(lines) == 2
    assert "spread 30%" in lines[0] and "slower than forward + backward" in lines[1]
