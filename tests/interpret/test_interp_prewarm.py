"""The warm-up lists against the launches they are for: every distinct compile that a quick sweep
(``mixstack tune``) or a grid key's measurement (``mixstack bench grid``) makes must be on the list
its warm-up compiles (``tuner.sweep.sweep_launches``, ``bench.grid.key_launches``).  On the CPU the
kernels run through the interpreter, which compiles nothing; the launches and their arguments are
the ones a GPU run makes."""

import contextlib

import pytest
from tuning_fakes import tuning_env  # noqa: F401  (private, empty tables)

from mixstack import tuning
from mixstack.bench import grid
from mixstack.measure import prewarm
from mixstack.measure.compiler_report import LAUNCHING_MODULES, Launch
from mixstack.tuner import probes, sweep
from mixstack.tuning import configs

KEY = tuning.shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True)


@pytest.fixture(autouse=True)
def tables(tuning_env, monkeypatch):  # noqa: F811
    monkeypatch.setenv("TRITON_INTERPRET", "1")          # tuning_env clears it
    tuning.policy.forget_verdicts()
    yield tuning_env
    tuning.policy.forget_verdicts()


@contextlib.contextmanager
def launches_made():
    """Every kernel launch made inside, as a ``LaunchSpec``, while the launches still run."""
    made = []
    modules = LAUNCHING_MODULES
    real = [m.wrap_triton for m in modules]

    def spy(wrap):
        def wrapped(kernel):
            class Grid:
                def __getitem__(self, grid_):
                    def call(*a, **kw):
                        made.append(prewarm.spec(Launch(kernel, a, kw)))
                        return wrap(kernel)[grid_](*a, **kw)
                    return call
            return Grid()
        return wrapped
    for m, r in zip(modules, real):
        m.wrap_triton = spy(r)
    try:
        yield made
    finally:
        for m, r in zip(modules, real):
            m.wrap_triton = r


def identities(specs) -> set:
    return {s.identity() for s in specs}


@contextlib.contextmanager
def validations_made(monkeypatch):
    """Every ``level3.validate`` call made inside: ``(key, config, edges)``."""
    from mixstack.stack import level3

    real, calls = level3.validate, []

    def spy(key, cfg, device, edges=None):
        calls.append((str(key), tuple(sorted(cfg.items())), tuple(edges or level3.validation_edges(device))))
        return real(key, cfg, device, edges)
    monkeypatch.setattr(level3, "validate", spy)
    yield calls
    monkeypatch.setattr(level3, "validate", real)


def check_warm_validations(cfg, cf, lmax, focus, measured, monkeypatch):
    """``grid.warm_validations`` (what a worker runs beside earlier batches) makes the measured
    run's ``level3.validate`` calls, the same keys, configs and edge counts (in a fresh worker:
    no verdict of this process's)."""
    from mixstack.stack import level3
    level3.forget()
    with validations_made(monkeypatch) as warmed:
        grid.warm_validations(cfg, cf, lmax, focus, "cpu")
    level3.forget()
    assert measured and warmed == measured


@pytest.mark.slow
def test_the_sweep_warm_up_lists_every_compile_of_the_compensated_sweep_after_the_relay():
    # the relay swept first and its candidate won: the compensated family's baseline runs with it
    relay = tuning.candidates("stack_bwd_relay", KEY, quick=True)
    probe = probes.StackProbe("stack_compensated", KEY, quick=True, edges=65, partial_edges=33, n_layers=2)
    warm = sweep.sweep_launches("stack_compensated", KEY, probe=probe, quick=True,
                                earlier=[("stack_bwd_relay", relay)])
    listed = identities(t.args[0] for t in prewarm.launch_tasks(warm))
    alone = identities(t.args[0] for t in prewarm.launch_tasks(
        sweep.sweep_launches("stack_compensated", KEY, probe=probe, quick=True)))
    with tuning.saved_registrations(), launches_made() as made:
        tuning.register("stack_bwd_relay", KEY, relay[0])
        result = sweep.tune_key("stack_compensated", KEY, probe=probe, rounds=1, warmup=0, persist=False,
                                quick=True, clock=lambda fn: fn() or 1.0)
    assert result.status == "tuned"
    made = identities(made)
    assert made <= listed
    assert made - alone, "negative control: without the relay's candidate the list misses compiles"
    # and what it lists beyond: the baseline alone, as if no relay candidate had won (exact GEMMs
    # at the level-1 config), which the sweep skips once one has
    level1 = {f: configs.GEMM_CONFIG[f] for f in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
    for name, _, constexprs, _ in listed - made:
        flags = dict(constexprs)
        assert name.endswith(":block_gemm_kernel") and not flags["COMPENSATED"], name
        assert {f: flags[f] for f in level1} == level1
    assert len(listed - made) <= len(listed) // 5


@pytest.mark.slow
def test_the_grid_warm_up_lists_every_compile_of_a_keys_measurement(tmp_path, monkeypatch):
    cfg = grid.GridConfig(focus_dims=(32,), lmaxes=(2,), focus=(1,), variants=("3",), edges=37,
                          rounds=1, warmup=0, check_edges=16, device="cpu")
    listed = identities(t.args[0] for t in prewarm.launch_tasks(grid.key_launches(cfg, 32, 2, 1, "cpu")))
    assert not tuning.registry.find("stack_compensated", tuning.shape_key(
        focus_dim=32, lmax=2, n_focus=1, apply_alpha=True), device_name="triton-interpreter"), \
        "recording must not leave a level-3 verdict behind"
    with launches_made() as made, validations_made(monkeypatch) as validated:
        done = grid.run_grid(cfg, tmp_path)
    assert done["measured"] == ["Cf32-l2-F1"]
    check_warm_validations(cfg, 32, 2, 1, list(validated), monkeypatch)          # the policy's config
    rec = grid.load_records(tmp_path)[0]
    assert grid.compensated_ran(rec)                          # level 3 validated the policy's config and ran it
    assert identities(made) <= listed


@pytest.mark.slow
def test_the_forced_level3_variant_runs_compensated_kernels_where_the_policy_is_unsure(tmp_path, monkeypatch):
    """``"3r"`` at a key the policy leaves on level 2 (Cf 16: 16-wide K tiles): level 3 runs the
    rule's config once it validates, the warm-up lists its compiles, and its time gives the verdict."""
    cfg = grid.GridConfig(focus_dims=(16,), lmaxes=(1,), focus=(1,), variants=("2", "3", "3r"), edges=37,
                          rounds=1, warmup=0, check_edges=16, device="cpu")
    assert grid.level3_unsure(cfg.shape(16, 1, 1), "cpu")
    listed = identities(t.args[0] for t in prewarm.launch_tasks(grid.key_launches(cfg, 16, 1, 1, "cpu")))
    with launches_made() as made, validations_made(monkeypatch) as validated:
        grid.run_grid(cfg, tmp_path)
    rec = grid.load_records(tmp_path)[0]
    assert grid.compensated_ran(rec) is False and grid.compensated_ran(rec, "L3-rule")
    check_warm_validations(cfg, 16, 1, 1, list(validated), monkeypatch)          # the rule's config
    assert identities(made) <= listed
    assert grid.level3_verdicts([rec])["focus_dim=16;lmax=1;n_focus=1;apply_alpha=1"]["measured_by"] == "L3-rule"
