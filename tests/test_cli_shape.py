"""The shape of the ``mixstack`` command: help, version and argument errors without torch, the
bench targets and their own options, one validator for every count, the accepted ``--levels``
forms in the help, where results go, and progress without a terminal."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from mixstack.cli import build_parser, main, parse_args
from mixstack.cli.common import COUNT, COUNT0, LineProgress, count, count_list

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--edges", "29", "--focus", "1", "--focus-dim", "16", "--lmax", "1", "--layers", "2",
        "--repeats", "1", "--warmup", "0", "--device", "cpu", "--levels", "0", "--pass", "fwd", "--no-plot"]


def _subprocess(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args, "-c", code] if code else [sys.executable, *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


# ------------------------------------------------------------------ no torch before the work

HELP_LINES = [["--help"], ["--version"], ["bench", "--help"], ["bench", "stack", "--help"], ["bench", "model", "--help"],
              ["bench", "grid", "--help"], ["bench", "train", "--help"], ["bench", "deepmd", "--help"], ["info", "--help"],
              ["tune", "--help"], ["freeze", "--help"], ["md", "--help"], ["scaling", "--help"],
              ["bench", "--edges", "0"], ["bench", "model", "--shape", "S1"], ["bench", "deepmd", "--atoms", "0"],
              ["md", "--atoms", "x"], ["--bogus"], []]
HEAVY = ("torch", "triton", "numpy", "deepmd")


def test_help_version_and_argument_errors_do_not_import_torch():
    """Every ``--help``, ``--version`` and argument error answers before torch is imported
    (torch takes seconds to import; it used to make ``mixstack --help`` take 6.5 s)."""
    code = ("import json, sys\nfrom mixstack.cli import main\n"
            f"codes = [main(argv) for argv in {HELP_LINES!r}]\n"
            f"print(json.dumps([codes, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n")
    done = _subprocess(code)
    assert done.returncode == 0, done.stderr
    codes, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == [0] * 13 + [2] * 6
    assert heavy == []


DEEPMD_OPTIONS = ["--atoms", "--configs", "--systems", "--variants", "--variants-for", "--rest-level", "--processes", "--build-ahead", "--rounds", "--warmup",
                  "--breakdown", "--breakdown-rounds", "--md-steps", "--md-warmup", "--md-dt", "--skin", "--rcut", "--seconds", "--seed",
                  "--device", "--out"]


def test_the_deepmd_bench_help_lists_its_options_without_torch_or_deepmd_kit():
    code = ("import contextlib, io, json, sys\nfrom mixstack.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    code = main(['bench', 'deepmd', '--help'])\n"
            f"print(json.dumps([code, out.getvalue(), sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n")
    done = _subprocess(code)
    assert done.returncode == 0, done.stderr
    code, text, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0 and heavy == [] and text.startswith("usage: mixstack bench deepmd")
    for option in DEEPMD_OPTIONS:
        assert re.search(rf"^  {option}\b", text, re.M), option
    assert 'pip install -e ".[deepmd]"' in " ".join(text.split())


def test_python_dash_m_mixstack_help_imports_no_torch():
    done = _subprocess("", "-X", "importtime", "-m", "mixstack", "--help")
    assert done.returncode == 0 and "usage: mixstack" in done.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "mixstack.cli" in imported and not [m for m in imported if m.split(".")[0] in ("torch", "triton")]


def test_import_mixstack_imports_torch_on_the_first_use_of_a_name():
    code = ("import sys, mixstack\nassert 'torch' not in sys.modules\nprint(mixstack.__version__)\n"
            "assert 'torch' not in sys.modules\nfrom mixstack import mixing_stack\nimport torch\n"
            "assert torch.ops.mixstack.stack_forward is not None and 'mixing_stack' in dir(mixstack)\n"
            "assert mixstack.reference.mixing_stack is not mixing_stack\n")
    done = _subprocess(code)
    assert done.returncode == 0, done.stderr


def test_version_names_mixstack_torch_and_triton(capsys):
    from importlib import metadata

    import mixstack
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"mixstack {mixstack.__version__} (torch {metadata.version('torch')}, " \
                  f"Triton {metadata.version('triton')})"


# ------------------------------------------------------------------ the bench targets

@pytest.mark.parametrize("argv", [["bench"], ["bench", "--quick"], ["bench", "--shape", "S1"],
                                  ["bench", "stack", "--shape", "S1"], ["-v", "bench", "--levels", "0"]])
def test_bench_without_a_target_is_the_stack_bench(argv):
    args = parse_args(argv)
    assert args.command == "bench" and args.target == "stack"


def test_the_stack_bench_records_the_command_as_typed(tmp_path):
    assert main(["bench", *TINY, "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "bench.json").read_text())["command"].startswith("mixstack bench --edges 29")


def _parser_of(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _options(*path: str) -> set[str]:
    return {o for a in _parser_of(*path)._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def test_each_bench_target_takes_only_its_own_options():
    stack, model, grid, train = (_options("bench", t) for t in ("stack", "model", "grid", "train"))
    assert {"--shape", "--edges", "--no-alpha", "--pass", "--check-edges"} <= stack
    assert not stack & {"--cell", "--atoms", "--breakdown", "--md-steps", "--md-atoms", "--resume", "--seconds"}
    assert {"--cell", "--atoms", "--blocks", "--cutoff", "--breakdown", "--md-steps", "--md-atoms"} <= model
    assert not model & {"--shape", "--edges", "--pass", "--check-edges", "--no-alpha", "--resume"}
    assert {"--seconds", "--resume", "--warm-workers", "--pass", "--edges"} <= grid
    assert not grid & {"--quick", "--shape", "--cell", "--atoms", "--layers", "--breakdown", "--no-alpha"}
    assert {"--shape", "--atoms", "--cell", "--blocks"} <= train
    assert not train & {"--pass", "--breakdown", "--md-steps", "--edges", "--resume"}
    shared = {"--device", "--seed", "--repeats", "--warmup", "--out", "--no-plot", "--levels"}
    assert all(shared <= opts for opts in (stack, model, grid, train))
    assert _options("bench", "deepmd") == set(DEEPMD_OPTIONS)


@pytest.mark.parametrize("target, bench_module, help_text", [
    ("stack", "stack_bench", "STACK_LEVELS"), ("grid", "stack_bench", "STACK_LEVELS"),
    ("model", "model_bench", "MODEL_LEVELS"), ("train", "train_bench", "TRAIN_LEVELS")])
def test_the_levels_help_names_every_form_the_bench_accepts(target, bench_module, help_text):
    import importlib

    from mixstack.cli.bench import options
    variants = importlib.import_module(f"mixstack.bench.{bench_module}").VARIANTS
    text = " ".join(_parser_of("bench", target).format_help().split())
    for key, name in variants.items():
        assert f"{key} or {name}" in text, (key, name)
    named = re.findall(r"\b(\w+) or (L[\w-]+)", getattr(options, help_text))
    assert dict(named) == variants                       # and nothing the bench does not take


# ------------------------------------------------------------------ one validator per kind of value

def _all_actions(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_actions(sub, (*path, name))
        else:
            yield path, action


def test_no_option_parses_bare_integers_or_floats():
    """Every count goes through ``count`` (one wording), every real number through ``number``
    (a choice among integers, like ``md --level``, is a choice)."""
    bare = [f"{' '.join(path)} {a.option_strings}" for path, a in _all_actions(build_parser())
            if a.type in (int, float) and not a.choices]
    assert bare == ["md ['--pressure']"]                  # a pressure may be negative


@pytest.mark.parametrize("text", ["0", "-5", "x", "2.5"])
def test_every_count_says_the_same_about_a_bad_value(text):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"must be an integer >= 1, got {text!r}")):
        COUNT(text)
    assert COUNT0("0") == 0 and count(3)("3") == 3 and count_list(1)("16, 32") == (16, 32)


def test_edges_zero_and_negative_get_one_wording(capsys):
    errors = []
    for value in ("0", "-5"):
        assert main(["bench", "--edges", value]) == 2
        errors.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert errors == [f"mixstack bench stack: error: argument --edges: must be an integer >= 1, got '{v}'"
                      for v in ("0", "-5")]


# ------------------------------------------------------------------ where results go

def _refuse_to_run(monkeypatch):
    from mixstack.bench import grid, model_bench, stack_bench, train_bench

    def ran(*a, **k):
        raise AssertionError("the bench ran before its output folder was checked")
    for module, name in ((stack_bench, "run_bench"), (model_bench, "run_model_bench"),
                         (train_bench, "run_train_bench"), (grid, "run_grid")):
        monkeypatch.setattr(module, name, ran)


@pytest.mark.parametrize("argv", [["bench", "--quick"], ["bench", "model", "--quick"], ["bench", "train", "--quick"],
                                  ["bench", "grid", "--focus-dim", "16", "--lmax", "1", "--focus", "1", "--levels", "0"]])
def test_an_out_that_cannot_be_written_fails_before_any_work(argv, tmp_path, capsys, monkeypatch):
    _refuse_to_run(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*argv, "--device", "cpu", "--out", str(blocker / "results")]) == 2
    err = capsys.readouterr().err
    assert f"--out {blocker / 'results'}: cannot write results there" in err and "Traceback" not in err


def test_results_go_to_the_user_results_folder_not_the_working_tree(tmp_path, capsys, monkeypatch):
    home, work = tmp_path / "results-home", tmp_path / "clone"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MIXSTACK_RESULTS_DIR", str(home))
    assert main(["bench", *TINY]) == 0
    (folder,) = home.iterdir()
    assert folder.name.endswith("-cpu-bench") and (folder / "bench.json").exists()
    assert f"results in {folder}: bench.json" in capsys.readouterr().out
    assert list(work.iterdir()) == []


def test_the_results_folder_is_the_platforms_data_folder(monkeypatch, tmp_path):
    from mixstack.core import config
    monkeypatch.delenv("MIXSTACK_RESULTS_DIR", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert config.results_dir() == str(tmp_path / "data" / "mixstack" / "results")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.results_dir() == str(tmp_path / ".local" / "share" / "mixstack" / "results")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert config.results_dir() == str(tmp_path / "Library" / "Application Support" / "mixstack" / "results")
    monkeypatch.setenv("MIXSTACK_RESULTS_DIR", str(tmp_path / "mine"))
    assert config.results_dir() == str(tmp_path / "mine")
    config.set_results_dir(str(tmp_path / "python"))
    try:
        assert config.results_dir() == str(tmp_path / "python")
    finally:
        config.set_results_dir(None)


def test_the_results_folder_variable_is_documented():
    text = open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8").read()
    assert "`MIXSTACK_RESULTS_DIR`" in text and "set_results_dir" in text


# ------------------------------------------------------------------ progress

def test_progress_without_a_terminal_is_a_line_per_finished_step_now_and_then(capsys):
    now = iter([0.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0])
    step = LineProgress(6, interval=5.0, clock=lambda: next(now))
    for k in range(6):
        step(f"step {k}")
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  [1/6] step 0 (0 s)", "  [4/6] step 3 (6 s)", "  [6/6] step 5 (8 s)"]


def test_the_stack_bench_shows_progress_when_output_is_not_a_terminal(tmp_path, capsys):
    assert main(["bench", *TINY, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  \[1/\d+\] measuring the fp32 and copy roofs", out, re.M), out
    assert "\x1b[" not in out                                    # no terminal control codes


# ------------------------------------------------------------------ names spelled out for --help

def test_the_names_the_parsers_spell_out_are_the_librarys():
    """The parsers cannot import the modules that define these (they import torch)."""
    from mixstack.bench import deepmd_bench
    from mixstack.cli import md
    from mixstack.cli import scaling as scaling_cli
    from mixstack.cli.bench import deepmd, model
    from mixstack.deepmd import configs
    from mixstack.lammps import runs, scaling
    from mixstack.potential import cells
    assert (md.BUILDERS, md.ENSEMBLES, md.ENGINES, md.MODEL_NAMES) == (
        runs.BUILDERS, runs.ENSEMBLES, runs.ENGINES, runs.MODEL_NAMES)
    assert model.CELL_NAMES == " or ".join(cells.CELLS)
    assert float(scaling_cli.MEMORY_FRACTION_TEXT) == scaling.MEMORY_FRACTION
    assert (deepmd.CONFIG_NAMES, deepmd.SYSTEM_NAMES) == (tuple(configs.CONFIGS), tuple(deepmd_bench.SYSTEMS))
