"""Compile ahead (``mixstack.measure.prewarm``): the worker pool, the launch specs, and the warm-up of
``mixstack tune`` and ``mixstack bench grid`` (orchestration on the CPU; the compiles it saves
happen on a GPU).  The lists of launches the warm-ups compile are checked against the launches
the sweep and the grid make in tests/interpret/test_interp_prewarm.py."""

import os

import pytest
import torch
from tuning_fakes import DEVICE, FakeProbe

from mixstack import tuning
from mixstack.bench import grid
from mixstack.measure import prewarm
from mixstack.tuner import driver

# ---------------------------------------------------------------- tasks (module level: workers import them)

def write_pid(path: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"{os.getpid()} {os.environ.get('MIXSTACK_PREWARM_TEST', '')}")


def fail(message: str) -> None:
    raise RuntimeError(message)


def test_auto_workers_take_half_the_cores_at_most_eight_and_none_below_two_workers():
    assert [prewarm.auto_workers(c) for c in (1, 2, 3, 4, 16, 64)] == [0, 0, 0, 2, 8, 8]
    assert prewarm.resolve_workers("auto") == prewarm.auto_workers()
    assert prewarm.resolve_workers(None) == prewarm.auto_workers()
    assert prewarm.resolve_workers("3") == 3 and prewarm.resolve_workers(0) == 0
    for bad in ("-1", "many"):
        with pytest.raises(ValueError, match="--warm-workers"):
            prewarm.resolve_workers(bad, "--warm-workers")


@pytest.mark.slow
def test_workers_run_the_tasks_with_the_parents_environment_and_report_failures_without_raising(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MIXSTACK_PREWARM_TEST", "seen")
    paths = [str(tmp_path / f"t{i}") for i in range(3)]
    tasks = [prewarm.Task(f"ok {i}", write_pid, (p,)) for i, p in enumerate(paths)]
    tasks.append(prewarm.Task("boom", fail, ("planted failure",)))
    seen = []
    with prewarm.Pool(1) as pool:
        summary = pool.run(tasks, on_done=lambda r, n, total: seen.append((r.name, n, total)))
    assert sorted(r.name for r in summary.results) == sorted(t.name for t in tasks)
    assert [n for _, n, _ in seen] == [1, 2, 3, 4] and {t for *_, t in seen} == {4}
    (bad,) = summary.failed
    assert bad.name == "boom" and "RuntimeError: planted failure" in bad.error
    pids = {open(p).read() for p in paths}
    assert all(p.endswith(" seen") for p in pids)                       # MIXSTACK_* reached the workers
    assert str(os.getpid()) not in {p.split()[0] for p in pids}          # ... which are other processes
    assert all(r.seconds >= 0 for r in summary.results) and "1 failed" in summary.describe()


def test_zero_processes_run_the_tasks_here_and_an_empty_batch_starts_no_worker(tmp_path):
    pool = prewarm.Pool(0)
    summary = pool.run([prewarm.Task("here", write_pid, (str(tmp_path / "p"),))])
    assert not summary.failed and (tmp_path / "p").read_text().split()[0] == str(os.getpid())
    idle = prewarm.Pool(4)
    assert idle.run([]).results == [] and idle._executor is None


def test_a_launch_spec_keeps_what_selects_the_binary_and_dedupes_by_it():
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    from mixstack.kernels.reduce import alpha_grad_kernel
    from mixstack.measure.compiler_report import Launch

    t = torch.empty(64)
    launch = Launch(alpha_grad_kernel, (t, t[1:], 1, 4099, 32, 2 ** 40), {"ROW": 64, "num_warps": 4})
    s = prewarm.spec(launch)
    assert s.kernel == "mixstack.kernels.reduce:alpha_grad_kernel" and s.device is None
    assert s.args[:2] == (prewarm.TensorArg(torch.float32, 0), prewarm.TensorArg(torch.float32, 4))
    # the classes agree with Triton's own specialisation of the same values
    for arg, cls in zip(launch.args, s.identity()[1]):
        kind, attr = native_specialize_impl(BaseBackend, arg, False, True, True)
        if isinstance(arg, torch.Tensor):
            assert (attr == "D") == cls[2]
        elif arg == 1:
            assert kind == "constexpr" and cls[1] == "1"
        else:
            assert (attr == "D") == (cls[1] == "D") and (kind == "i32") == cls[2]
    assert prewarm._pointer(s.args[1]).data_ptr() % 16 == 4
    same_class = Launch(alpha_grad_kernel, (t, t[1:], 1, 4101, 48, 2 ** 41), {"ROW": 64, "num_warps": 4})
    other = Launch(alpha_grad_kernel, (t, t[1:], 1, 4096, 48, 2 ** 41), {"ROW": 64, "num_warps": 4})
    seen: set = set()
    assert len(prewarm.launch_tasks([launch, same_class, other], seen)) == 2     # 4096: divisible by 16
    assert prewarm.launch_tasks([same_class], seen) == []                      # an earlier batch's


def test_a_warmed_launch_on_a_device_builds_its_launcher_and_one_on_the_cpu_only_compiles(monkeypatch):
    """The measuring process must find the host launcher built too (Triton 3.6 builds it
    with the host's compiler at the first run, not at ``warmup``)."""
    import sys
    import types

    calls = []

    class Compiled:
        def _init_handles(self):
            calls.append("init")

    class Kernel:
        def warmup(self, *args, grid, **kwargs):
            calls.append(("warmup", args, grid, kwargs))
            return Compiled()

    module = types.ModuleType("fake_kernels")
    module.k = Kernel()
    monkeypatch.setitem(sys.modules, "fake_kernels", module)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("device", d)))
    prewarm.warm_launch(prewarm.LaunchSpec("fake_kernels:k", (3,), (("BLOCK", 16),), device=0))
    assert calls == [("device", 0), ("warmup", (3,), (1,), {"BLOCK": 16}), "init"]
    calls.clear()
    prewarm.warm_launch(prewarm.LaunchSpec("fake_kernels:k", (3,), (("BLOCK", 16),)))
    assert calls == [("warmup", (3,), (1,), {"BLOCK": 16})]


# ---------------------------------------------------------------- mixstack tune

KEY = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
OTHER = tuning.shape_key(focus_dim=64, lmax=2, n_focus=1, apply_alpha=True)


@pytest.mark.usefixtures("tuning_env")
def test_tune_with_warm_workers_records_what_it_records_without(monkeypatch):
    recorded = []

    def fake_launches(name, key, *, probe, quick, earlier):
        recorded.append((name, key, [e[0] for e in earlier]))
        return []
    monkeypatch.setattr(driver, "sweep_launches", fake_launches)

    def sweep(workers):
        warmed = []
        with tuning.saved_registrations():
            results = driver.tune([KEY, OTHER], families=["stack_bwd_relay", "stack_compensated"],
                                  make_probe=lambda f, k, device=None: FakeProbe(f, k), clock=lambda fn: fn() or 1.0,
                                  persist=False, quick=True, rounds=2, warmup=0, warm_workers=workers,
                                  on_warm=lambda key, summary: warmed.append((key, summary.results)))
            return [(r.family, r.key, r.status, r.config) for r in results], warmed

    plain, none = sweep(0)
    assert none == [] and recorded == []                    # 0: no warm-up at all
    warm, warmed = sweep(1)
    assert warm == plain
    assert [k for k, _ in warmed] == [KEY, OTHER]           # one batch per key, before its sweep
    assert recorded == [("stack_bwd_relay", KEY, []), ("stack_compensated", KEY, ["stack_bwd_relay"]),
                        ("stack_bwd_relay", OTHER, []), ("stack_compensated", OTHER, ["stack_bwd_relay"])]


@pytest.mark.usefixtures("tuning_env")
def test_tune_warms_only_the_families_it_will_sweep(monkeypatch):
    recorded = []
    monkeypatch.setattr(driver, "sweep_launches", lambda name, key, **kw: recorded.append(name) or [])
    with tuning.saved_registrations():
        tuning.register("stack_bwd_relay", KEY, None)       # covered: not swept, not warmed
        res = driver.tune([KEY], families=["stack_bwd_relay", "stack_compensated"], persist=False, quick=True,
                          make_probe=lambda f, k, device=None: FakeProbe(f, k), clock=lambda fn: fn() or 1.0,
                          rounds=2, warmup=0, warm_workers=1, device_name=DEVICE)
    assert [r.status for r in res] == ["covered", "tuned"] and recorded == ["stack_compensated"]
    recorded.clear()
    with tuning.saved_registrations():
        driver.tune([KEY], families=["stack_fwd", "stack_bwd_fused"], persist=False, quick=True,
                    make_probe=lambda f, k, device=None: FakeProbe(f, k), clock=lambda fn: fn() or 1.0, rounds=2,
                    warmup=0, warm_workers=1)
    assert recorded == []                                   # no quick candidates: nothing to sweep or warm


# ---------------------------------------------------------------- mixstack bench grid

TINY = dict(focus_dims=(16,), lmaxes=(1,), focus=(1, 2), variants=("0c", "0"), edges=65, rounds=1, warmup=0,
            check_edges=16, device="cpu", compile_backend="eager")


@pytest.mark.slow
def test_a_grid_with_warm_workers_measures_the_same_keys_and_records_the_warm_up(tmp_path):
    events = []
    one = {**TINY, "focus": (1,)}
    plain = grid.run_grid(grid.GridConfig(**one), tmp_path / "plain")
    done = grid.run_grid(grid.GridConfig(**one, warm_workers=1), tmp_path / "warm",
                         on_key=lambda *e: events.append(e))
    assert done == plain
    assert [e[0] for e in events] == ["warm", "warm", "start", "done"]     # the references first, then the batch
    recs = grid.load_records(tmp_path / "warm")
    info, refs = recs[0]["warmup"], recs[0]["reference_warmup"]
    assert info["workers"] == 1 and info["compiled_references"] == 0 and info["failed"] == []
    assert list(refs["reference_seconds"]) == ["0c Cf16-l1"] and refs["failed"] == [] and info["kernels"] == 0
    inline = grid.run_grid(grid.GridConfig(**one, warm_workers=1, references_first=False), tmp_path / "inline")
    assert inline == plain
    info = grid.load_records(tmp_path / "inline")[0]["warmup"]
    assert info["compiled_references"] == 1 and list(info["reference_seconds"]) == ["0c Cf16-l1"]
    assert [r["compile"]["graphs"] for r in recs] == [1]        # the measuring process still traces its own
    for a, b in zip(grid.load_records(tmp_path / "plain"), recs):
        assert {t["variant"] for t in a["timings"]} == {t["variant"] for t in b["timings"]}
        assert a["shape"]["variants"][0]["rel_error"] == b["shape"]["variants"][0]["rel_error"]


def test_grid_seconds_bound_the_warm_up_too(tmp_path, monkeypatch):
    batches = []
    monkeypatch.setattr(grid, "_warm_batch", lambda cfg, pool, batch, *a: batches.append(batch) or (lambda: {}))
    nothing = grid.run_grid(grid.GridConfig(**{**TINY, "variants": ("0",)}, seconds=0, warm_workers=2), tmp_path)
    assert nothing["measured"] == [] and len(nothing["stopped"]) == 2 and batches == []
    cfg = grid.GridConfig(**{**TINY, "variants": ("0",), "focus_dims": (16, 32)}, warm_workers=1)
    done = grid.run_grid(cfg, tmp_path / "b")
    assert batches == [[((16, 1), [1, 2])], [((32, 1), [1, 2])]]         # one group per worker per batch
    assert len(done["measured"]) == 4


def _disk_key(kernel, args, kwargs) -> str:
    """The key Triton files a compile of ``kernel(*args, **kwargs)`` under on disk (as
    ``JITFunction.run`` computes it for the sm_90 target), without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.cache import get_cache_key
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = {"debug": False, **kwargs}
    bound, specialization, _ = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, None)
    return get_cache_key(ASTSource(kernel, signature, constexprs, attrs), backend, options, {})


@pytest.mark.parametrize("focus, compensated", [(1, False), (2, True)])
def test_a_warmed_launch_is_filed_under_the_measured_launchs_cache_key(focus, compensated):
    """The worker compiles from ``LaunchSpec`` values (mock pointers of the recorded dtype and
    alignment): Triton must file that compile under the key the measured launch looks up, or the
    measuring process compiles it again."""
    from mixstack.measure import compiler_report
    layout = tuning.shape_key(focus_dim=16, lmax=2, n_focus=focus, apply_alpha=True).layout
    launches = compiler_report.distinct(compiler_report.stack_launches(layout, focus, compensated=compensated))
    assert len(launches) > 5
    for launch in launches:
        s = prewarm.spec(launch)
        mocks = [prewarm._pointer(a) if isinstance(a, prewarm.TensorArg) else a for a in s.args]
        assert _disk_key(launch.kernel, mocks, dict(s.kwargs)) == \
            _disk_key(launch.kernel, launch.args, dict(launch.kwargs)), launch.name
    # negative control: a first pointer off its 16-byte alignment is another binary
    first = launches[0]
    s = prewarm.spec(first)
    assert isinstance(s.args[0], prewarm.TensorArg)
    off = [prewarm._pointer(prewarm.TensorArg(s.args[0].dtype, 4))] + \
        [prewarm._pointer(a) if isinstance(a, prewarm.TensorArg) else a for a in s.args[1:]]
    assert _disk_key(first.kernel, off, dict(s.kwargs)) != _disk_key(first.kernel, first.args, dict(first.kwargs))


def test_the_grid_hands_over_the_next_batch_before_it_measures_this_one(tmp_path, monkeypatch):
    order = []

    def warm(cfg, pool, batch, *a):
        order.append(("submit", batch[0][0]))
        return lambda: order.append(("wait", batch[0][0])) or {}
    monkeypatch.setattr(grid, "_warm_batch", warm)
    cfg = grid.GridConfig(**{**TINY, "variants": ("0",), "focus_dims": (16, 32), "focus": (1,)}, warm_workers=1)
    grid.run_grid(cfg, tmp_path, on_key=lambda event, name, _d: event == "start" and order.append(("measure", name)))
    assert order == [("submit", (16, 1)), ("submit", (32, 1)), ("wait", (16, 1)), ("measure", "Cf16-l1-F1"),
                     ("wait", (32, 1)), ("measure", "Cf32-l1-F1")]
    order.clear()                                 # three batches ahead: all three handed over first
    cfg = grid.GridConfig(**{**TINY, "variants": ("0",), "focus_dims": (16, 32, 48), "focus": (1,)}, warm_workers=1,
                          batches_ahead=3)
    grid.run_grid(cfg, tmp_path / "b", on_key=lambda event, name, _d: event == "start" and order.append(("measure", name)))
    assert [o[0] for o in order] == ["submit"] * 3 + ["wait", "measure"] * 3


def test_the_triton_cache_folder_is_pinned_before_workers_or_the_compiled_reference_can_move_it(
        tmp_path, monkeypatch):
    from triton import knobs

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    default = str(knobs.cache.dir)
    grid.run_grid(grid.GridConfig(**{**TINY, "variants": ("0",), "focus": (1,)}), tmp_path)
    assert os.environ["TRITON_CACHE_DIR"] == default                # Inductor leaves a set variable alone
    assert prewarm.worker_env()["TRITON_CACHE_DIR"] == default      # and the workers inherit it
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert prewarm.pin_triton_cache() == str(tmp_path / "mine")     # a user's folder is kept
