"""The parts of ``scripts/gpu_check.sh`` run first time.  The ``grid`` part runs on the CPU at
level 0, a tiny slice, then a second slice that resumes from the first's key files
(``GRID_FROM``), as the lead runs it on the GPU.  (The ``retune`` part was run on the CPU
through the interpreter by hand: it takes minutes there.)  The ``breakdown``, ``md``, ``model``
and ``baseline`` parts run with a ``python3`` that records its arguments: every command they
would run is parsed by the CLI it calls (they ran end to end on the CPU with small
``BREAKDOWN_ARGS`` / ``MD_ARGS`` by hand, ~80 s)."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, **env):
    full = {**os.environ, "OUT": str(out), "BUDGET": "300", "PARTS": "grid", **env}
    full.pop("TRITON_INTERPRET", None)
    return subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_grid_part_runs_and_resumes_from_a_previous_slice(tmp_path):
    args = "--focus-dim 16 --lmax 1 --focus {} --edges 33 --levels 0 --repeats 1 --warmup 0 --check-edges 8 --no-plot"
    first = _run(tmp_path / "a", GRID_ARGS=args.format(1))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "bench grid rc=0: measured 1, skipped 0 (done before), left 0 in " in (tmp_path / "a" / "summary.txt").read_text()
    with tarfile.open(tmp_path / "a" / "gpu_check.tgz") as tgz:
        tgz.extractall(tmp_path / "a" / "x")
    keys = tmp_path / "a" / "x" / "grid" / "keys"
    assert [p.name for p in keys.iterdir()] == ["Cf16-l1-F1.json"]
    second = _run(tmp_path / "b", GRID_ARGS=args.format("1,2"), GRID_FROM=str(keys))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "measured 1, skipped 1" in (tmp_path / "b" / "summary.txt").read_text()
    redo = _run(tmp_path / "c", GRID_ARGS=args.format("1,2"), GRID_FROM=str(keys), GRID_REDO="Cf16-l1")
    assert redo.returncode == 0, redo.stdout + redo.stderr
    assert "measured 2, skipped 0" in (tmp_path / "c" / "summary.txt").read_text()


def _check_with_shim(tmp_path, parts: str, tool: str, body: str, **env) -> None:
    """Run ``scripts/gpu_check.sh``'s ``parts`` with a Python script ``body`` on ``PATH`` as ``tool``;
    the run must succeed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / tool
    shim.write_text(f"#!{sys.executable}\n{body}")
    shim.chmod(0o755)
    full = {**os.environ, "OUT": str(tmp_path / "out"), "BUDGET": "60", "PARTS": parts,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env}
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _recorded_commands(tmp_path, parts: str, **env) -> list[tuple[str, list[str]]]:
    """Run ``scripts/gpu_check.sh`` with a ``python3`` on ``PATH`` that only records its
    arguments (and ``MIXSTACK_CONV_KERNELS``): the commands a part would run, without running them."""
    log = tmp_path / "calls.jsonl"
    _check_with_shim(tmp_path, parts, "python3",
                     f"import json, os, sys\nwith open({str(log)!r}, 'a') as f:\n"
                     "    f.write(json.dumps([os.environ.get('MIXSTACK_CONV_KERNELS', ''), sys.argv[1:]]) + '\\n')\n",
                     **env)
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def _ncu_command(tmp_path, part: str, **env) -> tuple[list[str], str]:
    """Run ``scripts/gpu_check.sh``'s ``part`` with an ``ncu`` on ``PATH`` that records its command line and
    reports one section: ``(that command line, the run's summary.txt)``."""
    log = tmp_path / "ncu.jsonl"
    _check_with_shim(tmp_path, part, "ncu",
                     f"import json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                     "print('    Section: GPU Speed Of Light Throughput')\n", **env)
    (argv,) = map(json.loads, log.read_text().splitlines())
    return argv, (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_frame_parts_pass_options_the_model_bench_takes(tmp_path):
    """``breakdown`` (before: the convolution's kernels off; after), ``md`` and ``model``: every
    ``mixstack bench model`` command they run parses, with the variants, breakdown and MD settings
    the parts promise."""
    from mixstack.cli import parse_args
    from mixstack.cli.bench import model as bench_model

    calls = [(conv, argv[2:]) for conv, argv in _recorded_commands(tmp_path, "breakdown,md,model")
             if argv[:2] == ["-m", "mixstack"]]
    assert [argv[:2] for _, argv in calls] == [["bench", "model"]] * 4
    configs = [(conv, bench_model.config(parse_args(argv)), argv) for conv, argv in calls]
    (c0, before, a0), (c1, after, a1), (c2, md, _), (_, model, _) = configs
    assert c0 == "0" and c1 != "0"                           # before runs the PyTorch convolution
    assert before.breakdown and after.breakdown and not md.breakdown
    assert before.variants == ("2", "3") and after.variants == ("0c", "2", "3")
    assert before.md_steps == after.md_steps == model.md_steps == 0
    assert md.md_steps == 100 and md.md_atoms == (4400,) and md.cells == ("cu-bcc",)
    assert md.variants == ("2g", "3g", "2", "3", "0c") and model.variants == ("0c", "2c", "3c")
    assert {a0[a0.index("--out") + 1], a1[a1.index("--out") + 1]} == {
        str(tmp_path / "out" / "breakdown-before"), str(tmp_path / "out" / "breakdown-after")}


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_stackprobe_part_probes_the_wide_keys_on_both_product_routes(tmp_path):
    """``stackprobe``: ``scripts/stack_probe.py`` with arguments it parses, at grid keys, with the
    compiled reference and level 1 on Triton's and on the BLAS's products, the latter in the route's
    weight layouts and with plain weights (variants the bench knows)."""
    from helpers import load_script

    from mixstack.bench import stack_bench

    probe = load_script("stack_probe")
    (call,) = [argv for _, argv in _recorded_commands(tmp_path, "stackprobe") if argv[:1] == ["scripts/stack_probe.py"]]
    args = probe.parser().parse_args(call[1:])
    variants = args.variants.split(",")
    assert variants == ["0c", "1", "1b", "1bn"]
    assert [probe.split_variant(v) for v in variants] == [("0c", False), ("1", False), ("1b", False), ("1b", True)]
    assert set(v for v, _ in map(probe.split_variant, variants)) <= set(stack_bench.VARIANTS)
    assert [tuple(int(x) for x in k.split(",")) for k in args.key] == [(112, 4, 1), (128, 5, 1), (80, 4, 1)]
    assert args.out == str(tmp_path / "out" / "stackprobe")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_baseline_part_selects_the_strict_compiled_baseline_test(tmp_path):
    """``baseline`` runs the compiled level-0 frame's GPU test (its ``-k`` selects exactly the
    level-0 case of an existing test) and then the GPU reproducer candidates in ``repro/``."""
    calls = [argv for _, argv in _recorded_commands(tmp_path, "baseline")]
    pytest_call = next(a for a in calls if a[:2] == ["-m", "pytest"])
    k = pytest_call[pytest_call.index("-k") + 1]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                                "-p", "no:cacheprovider", pytest_call[2], "-k", k],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert ids == ["tests/gpu/test_gpu_potential.py::test_compiled_bench_frame_forces_match_float64[0c]"], \
        collected.stdout + collected.stderr
    repro = sorted(f"repro/{p}" for p in os.listdir(os.path.join(ROOT, "repro")) if p.startswith("inductor_gpu_"))
    assert repro and [a[0] for a in calls if a and a[0].startswith("repro/")] == repro


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_tune_and_grid_parts_pass_their_warm_up_workers(tmp_path):
    """``tune``, ``retune`` and ``grid`` give ``--warm-workers`` (auto, or TUNE_WARM_WORKERS /
    GRID_WARM_WORKERS) to commands that parse."""
    from mixstack.cli import parse_args
    from mixstack.cli.bench import grid as bench_grid
    from mixstack.measure import prewarm

    def _fresh(path):
        path.mkdir()
        return path

    def commands(**env):
        calls = [argv[2:] for _, argv in _recorded_commands(_fresh(tmp_path / str(len(env))), "tune,retune,grid", **env)
                 if argv[:2] == ["-m", "mixstack"]]
        assert [a[0] for a in calls] == ["tune", "tune", "bench"]
        return [parse_args(a) for a in calls]

    tune, retune, bench = commands()
    assert tune.warm_workers == retune.warm_workers == bench.warm_workers == "auto"
    assert bench_grid.config(bench).warm_workers == prewarm.auto_workers()
    tune, retune, bench = commands(TUNE_WARM_WORKERS="3", GRID_WARM_WORKERS="0")
    assert (tune.warm_workers, retune.warm_workers, bench_grid.config(bench).warm_workers) == ("3", "3", 0)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_grid_part_profiles_its_measuring_process_on_request(tmp_path):
    from mixstack.cli import parse_args

    def grid_call(name, **env):
        (tmp_path / name).mkdir()
        calls = [argv for _, argv in _recorded_commands(tmp_path / name, "grid", **env) if "grid" in argv]
        assert len(calls) == 1, calls
        return calls[0]

    plain, profiled = grid_call("a"), grid_call("b", GRID_PROFILE="1")
    assert plain[:4] == ["-m", "mixstack", "bench", "grid"]
    assert profiled[:3] == ["-m", "cProfile", "-o"] and profiled[3].endswith("grid.prof")
    def same(argv, folder):             # the output folder and the seconds left differ between runs
        argv = [a.replace(str(tmp_path / folder), "") for a in argv]
        i = argv.index("--seconds")
        return argv[:i + 1] + argv[i + 2:]

    assert same(profiled[4:], "b") == same(plain, "a")
    assert parse_args(profiled[6:]).command == "bench"


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_grid_part_measures_each_slice_of_grid_args_into_one_folder(tmp_path):
    from mixstack.cli import parse_args
    from mixstack.cli.bench import grid as bench_grid

    wide, narrow = "--focus-dim 112 --lmax 4 --levels 0c,1,2,1b,2b", "--focus-dim 16 --lmax 1 --focus 1"
    calls = [argv[2:] for _, argv in _recorded_commands(tmp_path, "grid", GRID_ARGS=f"{wide} | {narrow}")
             if argv[2:4] == ["bench", "grid"]]
    assert len(calls) == 2
    a, b = (bench_grid.config(parse_args(c)) for c in calls)
    assert (a.focus_dims, a.lmaxes, a.variants) == ((112,), (4,), ("0c", "1", "2", "1b", "2b"))
    assert (b.focus_dims, b.lmaxes, b.focus) == ((16,), (1,), (1,))
    outs = {c[c.index("--out") + 1] for c in calls}
    assert len(outs) == 1 and all("--resume" in c for c in calls)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_tma_part_benches_level_3_before_and_after_sweeping_the_tma_family_then_tests(tmp_path):
    """``tma``: bench, the sweep of ``stack_compensated_tma`` (level 3's own config first), bench
    again, then the GPU tests that hold the TMA kernel to its twin; every command parses."""
    from mixstack.cli import parse_args
    from mixstack.cli.bench import stack as bench_stack
    from mixstack.cli.tune import tune_keys

    calls = [argv for _, argv in _recorded_commands(tmp_path, "tma", NCU_TMA="0")
             if argv[:2] in (["-m", "pytest"], ["-m", "mixstack"])]
    assert [a[:2] for a in calls] == [["-m", "mixstack"], ["-m", "mixstack"], ["-m", "mixstack"], ["-m", "pytest"]]
    before, tune, after, tests = calls
    assert tests[tests.index("-k") + 1] == "tma" and "tests/gpu/test_gpu_compensated.py" in tests
    benches = [parse_args(a[2:]) for a in (before, after)]
    assert [a.out for a in benches] == [str(tmp_path / "out" / "tma" / "before"), str(tmp_path / "out" / "tma" / "after")]
    assert all(b.target == "stack" for b in benches)
    assert all(bench_stack.config(b).variants == ("0c", "3") and len(bench_stack.config(b).shapes) == 4 for b in benches)
    tuned = parse_args(tune[2:])
    assert tuned.family == ["stack_compensated", "stack_compensated_tma"] and len(set(tune_keys(tuned))) == 3


def _script_commands(name: str) -> list[str]:
    """The commands of ``scripts/gpu_check.sh`` that run ``python3 -m mixstack NAME``, each with
    its continuation lines joined."""
    text = open(os.path.join(ROOT, "scripts", "gpu_check.sh"), encoding="utf-8").read().replace("\\\n", " ")
    return [line for line in text.splitlines() if f"-m mixstack {name}" in line and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", ["bench", "scaling"])
def test_every_bench_and_scaling_run_of_the_gpu_check_writes_under_out(name):
    """Without ``--out`` a run writes into the user results folder, outside ``$OUT``: every
    bench and scaling command of the GPU check names its folder (and none runs the old
    ``python -m mixstack.lammps.scaling``)."""
    commands = _script_commands(name)
    assert commands
    assert [c for c in commands if "--out" not in c] == []
    text = open(os.path.join(ROOT, "scripts", "gpu_check.sh"), encoding="utf-8").read()
    assert "mixstack.lammps.scaling" not in text


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_gridcheck_part_holds_a_new_grid_to_the_committed_one(tmp_path):
    """``gridcheck`` runs one ``mixstack bench grid`` that parses, with ``--check`` on the newest
    committed H200 grid (or GRIDCHECK_BASE) and GRIDCHECK_ARGS passed through."""
    from mixstack.cli import parse_args

    calls = [argv[2:] for _, argv in _recorded_commands(tmp_path, "gridcheck", GRIDCHECK_ARGS="--lmax 1,2")
             if argv[:2] == ["-m", "mixstack"]]
    assert len(calls) == 1 and calls[0][:2] == ["bench", "grid"]
    args = parse_args(calls[0])
    newest = sorted(p for p in os.listdir(os.path.join(ROOT, "results")) if p.endswith("-h200-grid"))[-1]
    assert args.check == f"results/{newest}" and list(args.lmax) == [1, 2] and args.seconds > 0


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
@pytest.mark.parametrize("part, script", [("gluonprobe", "gluon_gemm_probe"), ("chainprobe", "gluon_chain_probe")])
def test_the_gluon_probe_parts_compile_offline_then_probe_at_s1s_rows(tmp_path, part, script):
    """``gluonprobe`` and ``chainprobe``: the probe offline first (the machine's Triton), then on the
    GPU at S1's rows, each command parsed by the probe's own parser; with no ``compute-sanitizer`` no
    racecheck runs."""
    from helpers import load_script

    probe = load_script(script)
    calls = [probe.parser().parse_args(argv[1:]) for _, argv in _recorded_commands(tmp_path, part, CHAIN_LAYERS="6")
             if argv[:1] == [f"scripts/{script}.py"]]
    if shutil.which("compute-sanitizer") is None:
        assert [(a.offline, a.racecheck) for a in calls] == [(True, False), (False, False)]
    offline, gpu = calls[0], calls[-1]
    assert offline.out == str(tmp_path / "out" / part / "offline")
    assert gpu.rows == 600006 and gpu.out == str(tmp_path / "out" / part)
    assert getattr(gpu, "layers", 6) == 6


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_fwdprobe_part_builds_the_forward_offline_then_runs_it_at_s1s_edges(tmp_path):
    """``fwdprobe``: design B's forward probe offline first, then on the GPU at S1's edges (``FWD_EDGES``
    overrides), each command parsed by the probe's own parser."""
    from helpers import load_script

    probe = load_script("gluon_forward_probe")

    def runs(run, **env):
        (tmp_path / run).mkdir()
        return [probe.parser().parse_args(argv[1:]) for _, argv in _recorded_commands(tmp_path / run, "fwdprobe", **env)
                if argv[:1] == ["scripts/gluon_forward_probe.py"]]

    calls = runs("default")
    assert calls[0].offline and calls[0].out == str(tmp_path / "default" / "out" / "fwdprobe" / "offline")
    gpu = calls[-1]
    assert not (gpu.offline or gpu.racecheck or gpu.cpu) and gpu.edges == 300003
    assert (gpu.focus, gpu.focus_dim, gpu.lmax, gpu.layers) == (2, 32, 3, 4)
    assert runs("fewer", FWD_EDGES="4099")[-1].edges == 4099


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_fwdncu_part_profiles_the_forwards_first_launches(tmp_path):
    """``fwdncu``: ``ncu --clock-control none`` on the first ``FWD_NCU_COUNT`` ``gluon_forward`` launches of the
    forward probe at ``FWD_EDGES``, the probe's command parsed by its own parser."""
    from helpers import load_script

    argv, summary = _ncu_command(tmp_path, "fwdncu", FWD_EDGES="8191")
    assert argv[argv.index("--clock-control") + 1] == "none" and argv[argv.index("-c") + 1] == "2"
    assert argv[argv.index("-k") + 1] == "regex:gluon_forward"
    assert argv[argv.index("python3") + 1] == "scripts/gluon_forward_probe.py"
    args = load_script("gluon_forward_probe").parser().parse_args(argv[argv.index("python3") + 2:])
    assert args.edges == 8191 and args.rounds == 1 and not args.offline
    assert "forward ncu rc=0: 1 sections" in summary


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_chain_forms_reach_every_step_of_the_chain_probe(tmp_path):
    """``CHAIN_FORMS`` picks the chain kernel's forms for its offline build, racecheck and timing alike;
    unset, every form runs."""
    from helpers import load_script

    probe = load_script("gluon_chain_probe")

    def forms(run, **env):
        (tmp_path / run).mkdir()
        return [probe.parser().parse_args(argv[1:]).forms
                for _, argv in _recorded_commands(tmp_path / run, "chainprobe", **env)
                if argv[:1] == ["scripts/gluon_chain_probe.py"]]

    picked = forms("picked", CHAIN_FORMS="pingpong,pingpong-inflight")
    assert len(picked) >= 2 and set(picked) == {("pingpong", "pingpong-inflight")}
    assert set(forms("every")) == {probe.FORMS}


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_a_gluon_probe_that_hangs_is_stopped_after_its_step_seconds(tmp_path):
    """``GLUON_STEP_SECONDS``: a probe whose GPU step never returns (a kernel that deadlocks) is cut
    after that many seconds, not the call's whole budget, and the summary says so (rc 124)."""
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3"                  # the probe's offline build returns at once, its GPU step hangs
    shim.write_text(f"#!{sys.executable}\nimport sys, time\n"
                    "if sys.argv[1:2] == ['scripts/gluon_chain_probe.py'] and '--offline' not in sys.argv:\n"
                    "    time.sleep(120)\n")
    shim.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "BUDGET": "100", "PARTS": "chainprobe",
           "GLUON_STEP_SECONDS": "2", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    start = time.monotonic()
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=90)
    assert time.monotonic() - start < 60, done.stdout + done.stderr
    assert "chain probe rc=124" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_chainprobe_part_runs_the_partition_racecheck_repro_plain_and_with_its_barrier(tmp_path):
    """Where ``compute-sanitizer`` exists, ``chainprobe`` runs the probe under racecheck, then
    ``repro/gluon_ws_racecheck.py`` under it twice (plain, ``--sync``), each in the summary."""
    bin_dir, log = tmp_path / "bin", tmp_path / "sanitizer.jsonl"
    bin_dir.mkdir()
    sanitizer = bin_dir / "compute-sanitizer"     # records what it would check, reports a clean run
    sanitizer.write_text(f"#!{sys.executable}\nimport json, sys\n"
                         f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                         "print('========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)')\n")
    sanitizer.chmod(0o755)
    python = bin_dir / "python3"
    python.write_text(f"#!{sys.executable}\n")
    python.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "BUDGET": "60", "PARTS": "chainprobe",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = [argv[argv.index("python3") + 1:] for argv in map(json.loads, log.read_text().splitlines())]
    assert checked == [["scripts/gluon_chain_probe.py", "--racecheck"], ["repro/gluon_ws_racecheck.py"],
                       ["repro/gluon_ws_racecheck.py", "--sync"]]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "ws racecheck [plain] rc=0" in summary and "ws racecheck [--sync] rc=0" in summary


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_chainncu_part_profiles_the_chains_first_launches_without_locking_the_clocks(tmp_path):
    """``chainncu``: ``ncu --clock-control none`` on the first ``CHAIN_NCU_COUNT`` ``gluon_chain`` launches of
    the chain probe at S1's rows, the forms ``CHAIN_FORMS`` names, the probe's command parsed by its own
    parser; the summary counts the report's sections."""
    from helpers import load_script

    argv, summary = _ncu_command(tmp_path, "chainncu", CHAIN_NCU_COUNT="3", CHAIN_FORMS="chain-prefetch")
    assert argv[argv.index("--clock-control") + 1] == "none" and argv[argv.index("-c") + 1] == "3"
    assert argv[argv.index("-k") + 1] == "regex:gluon_chain"
    probe = load_script("gluon_chain_probe")
    args = probe.parser().parse_args(argv[argv.index("python3") + 2:])
    assert argv[argv.index("python3") + 1] == "scripts/gluon_chain_probe.py"
    assert args.forms == ("chain-prefetch",) and args.rows == 600006 and args.rounds == 1
    assert "chain ncu rc=0: 1 sections" in summary


def test_the_tmaprobe_part_runs_every_candidate_at_s1s_key_then_the_quick_forms_at_two_more(tmp_path):
    """``tmaprobe``: ``scripts/tma_stack_probe.py`` at S1's key (every candidate, E 4099, written
    under ``$OUT/tma``), then the quick forms at the GPU tests' two other keys; every command parses."""
    from helpers import load_script

    probe = load_script("tma_stack_probe")
    calls = [probe.parser().parse_args(argv[1:]) for _, argv in _recorded_commands(tmp_path, "tmaprobe")
             if argv and argv[0] == "scripts/tma_stack_probe.py"]
    assert len(calls) == 3
    s1, *others = calls
    assert (s1.edges, s1.focus, s1.focus_dim, s1.lmax, s1.quick) == (4099, 2, 32, 3, False)
    assert s1.out == str(tmp_path / "out" / "tma" / "stack_probe_s1.jsonl")
    assert [(a.focus, a.focus_dim, a.lmax, a.edges, a.quick) for a in others] == [(1, 64, 3, 129, True),
                                                                                    (2, 32, 6, 1, True)]
