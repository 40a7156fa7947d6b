"""``mixstack.tune`` / ``tuner.tune_missing`` over many keys, and ``mixstack tune``, with a fake probe."""

import pytest
import torch
from tuning_fakes import DEVICE, FakeProbe

import mixstack
from mixstack import tuner, tuning
from mixstack.cli import main
from mixstack.tuner import driver, probes
from mixstack.tuner.sweep import TuneError

KEY = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
KEY64 = tuning.shape_key(focus_dim=64, lmax=3, n_focus=1, apply_alpha=True)


# Every test runs on empty, private tables (the ``tuning_env`` fixture, tests/conftest.py).
pytestmark = pytest.mark.usefixtures("tuning_env")


def _probes(errors=None, made=None):
    """A probe factory; ``errors``: family -> {label: exception}."""
    def make(family, key, device=None):
        p = FakeProbe(family, key, errors=(errors or {}).get(family))
        if made is not None:
            made.append((family, key))
        return p
    return make


def _tune(keys, **kw):
    clock = kw.pop("clock", None)
    return mixstack.tune(keys, rounds=2, warmup=0, clock=clock or (lambda fn: fn() or 1.0), **kw)


def test_tune_is_the_tuners_and_the_tables_do_not_import_it():
    assert mixstack.tune is tuner.tune and "tune" in mixstack.__all__ and "tuning" in mixstack.__all__
    assert not hasattr(tuning, "tune")          # the tables sit below the sweep that fills them


def test_the_default_keys_are_those_of_s1_to_s4():
    keys = driver.default_keys()
    assert keys == [KEY, tuning.shape_key(focus_dim=32, lmax=6, n_focus=2, apply_alpha=True), KEY64]


def test_tune_sweeps_each_family_in_order_and_skips_covered_keys(tuning_env):
    made = []
    res = _tune([KEY, KEY64], make_probe=_probes(made=made))
    assert [(r.family, r.key, r.status) for r in res] == [
        (f, k, "tuned" if f != "stack_compensated_tma" else "no-baseline") for k in (KEY, KEY64)
        for f in ("stack_fwd", "stack_bwd_relay", "stack_bwd_fused", "stack_compensated", "stack_compensated_tma")]
    # level 3 lost (equal fake times): the TMA family, measured against level 3, has no baseline
    assert made == [(r.family, r.key) for r in res if r.status == "tuned"]
    made.clear()
    again = tuner.tune_missing([KEY, KEY64], make_probe=_probes(made=made), rounds=2, warmup=0)
    assert {r.status for r in again} == {"covered", "no-baseline"}
    made.clear()
    tuner.tune_missing([KEY], make_probe=_probes(made=made), device_name=DEVICE)
    assert made == []                                       # skipped before any input is made


def test_a_failure_stops_tune_and_records_nothing_for_that_family(tuning_env):
    cand = tuning.families.label(tuning.candidates("stack_bwd_relay", KEY)[0])
    with pytest.raises(TuneError, match="boom"):
        _tune([KEY], make_probe=_probes({"stack_bwd_relay": {cand: RuntimeError("boom")}}))
    assert tuning.lookup("stack_fwd", KEY, device_name=DEVICE) is not tuning.MISSING
    assert tuning.lookup("stack_bwd_relay", KEY, device_name=DEVICE) is tuning.MISSING


def test_without_stop_on_error_the_fused_family_is_not_run_after_the_relay_failed():
    cand = tuning.families.label(tuning.candidates("stack_bwd_relay", KEY)[0])
    res = _tune([KEY, KEY64], make_probe=_probes({"stack_bwd_relay": {cand: RuntimeError("boom")}}),
                stop_on_error=False)
    status = {(r.family, r.key): r.status for r in res}
    assert status[("stack_bwd_relay", KEY)] == "failed"
    assert status[("stack_bwd_fused", KEY)] == "not-run"
    assert status[("stack_fwd", KEY)] == "tuned"
    assert tuning.lookup("stack_bwd_fused", KEY, device_name=DEVICE) is tuning.MISSING


def test_tunes_sweep_settings_reach_every_sweep_and_a_misspelt_one_is_refused(tuning_env):
    res = _tune([KEY], families=["stack_fwd", "stack_bwd_relay"], make_probe=_probes(), margin=0.5)
    for r in res:
        entry = tuning.registry.find(r.family, KEY, device_name=DEVICE)[1]
        assert (entry["margin"], entry["rounds"], entry["warmup"]) == (0.5, 2, 0)
    _tune([KEY64], families=["stack_bwd_relay"], make_probe=_probes(), persist=False)
    assert "focus_dim=64" not in tuning_env.user_file.read_text()
    assert tuning.lookup("stack_bwd_relay", KEY64, device_name=DEVICE) is not tuning.MISSING
    with pytest.raises(TypeError, match="'rund'"):
        _tune([KEY], make_probe=_probes(), rund=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_tune_without_a_gpu_says_so(capsys):
    with pytest.raises(ValueError, match="CUDA"):
        mixstack.tune([KEY])
    assert main(["tune", "--shape", "S1"]) == 2
    assert "CUDA" in capsys.readouterr().err


# ------------------------------------------------------------------ the CLI

@pytest.fixture
def fake_gpu(monkeypatch):
    """Point the CLI's sweep at the fake probe on a 'device' named fake-gpu."""
    made = []
    monkeypatch.setattr(probes, "tuning_device", lambda device=None: torch.device("cpu"))
    monkeypatch.setattr(probes, "StackProbe", _probes(made=made))
    monkeypatch.setattr(tuning, "device_name", lambda device=None: DEVICE)
    monkeypatch.setattr(tuning.validity, "device_name", lambda device=None: DEVICE)
    return made


def test_cli_tune_prints_a_summary_and_records_then_skips(capsys, fake_gpu, tuning_env):
    assert main(["tune", "--full", "--shape", "S1", "--shape", "S3", "--rounds", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "fake-gpu" in out and str(tuning_env.user_file) in out
    assert "| stack_bwd_fused | Cf32 l3 F2 alpha | tuned |" in out
    # S1 and S3 share one key; four families, and the TMA family's only where level 3 won (the
    # CLI times the fake probe on the real clock, so either can happen)
    level3 = isinstance(tuning.lookup("stack_compensated", KEY, device_name=DEVICE), dict)
    assert f"| stack_compensated_tma | Cf32 l3 F2 alpha | {'tuned' if level3 else 'no-baseline'} |" in out
    assert len(fake_gpu) == 4 + level3
    assert main(["tune", "--focus-dim", "32", "--lmax", "3", "--family", "stack_bwd_fused"]) == 0
    assert "| stack_bwd_fused | Cf32 l3 F2 alpha | covered |" in capsys.readouterr().out
    assert len(fake_gpu) == 4 + level3


def test_cli_tune_sweeps_every_combination_of_custom_key_values(capsys, fake_gpu, tuning_env):
    args = ["tune", "--focus-dim", "32", "64", "--lmax", "2", "--focus", "1", "2", "--family", "stack_bwd_relay",
            "--rounds", "2", "--warmup", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for key in ("Cf32 l2 F1", "Cf32 l2 F2", "Cf64 l2 F1", "Cf64 l2 F2"):
        assert f"| stack_bwd_relay | {key} alpha | tuned |" in out, out
    assert len(fake_gpu) == 4
    assert main(["tune", "--focus-dim", "32", "--lmax", "2", "3", "--family", "stack_bwd_relay",
                 "--rounds", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "| stack_bwd_relay | Cf32 l2 F2 alpha | covered |" in out
    assert "| stack_bwd_relay | Cf32 l3 F2 alpha | tuned |" in out
    assert len(fake_gpu) == 5


def test_cli_tune_reports_a_failure_and_exits_1(capsys, fake_gpu, monkeypatch):
    def failing(family, key, device=None):
        return FakeProbe(family, key, errors={"baseline": RuntimeError("boom")})
    monkeypatch.setattr(probes, "StackProbe", failing)
    assert main(["tune", "--shape", "S4", "--family", "stack_bwd_relay", "--rounds", "2"]) == 1
    captured = capsys.readouterr()
    assert "| stack_bwd_relay | Cf64 l3 F1 alpha | failed |" in captured.out
    assert "FAILED stack_bwd_relay" in captured.err and "boom" in captured.err


@pytest.mark.parametrize("args, why", [
    (["--focus-dim", "32"], "--lmax"),
    (["--focus-dim", "32", "--lmax", "7"], "lmax"),
    (["--family", "stack_bwd_fast"], "unknown tuning family"),
    (["--shape", "S9"], "unknown shape"),
    (["--rounds", "0"], "--rounds"),
])
def test_cli_tune_refuses_bad_arguments(capsys, fake_gpu, args, why):
    assert main(["tune", *args]) == 2
    assert why in capsys.readouterr().err


def test_cli_tune_runs_the_quick_sweep_by_default_over_a_tables_keys(capsys, fake_gpu, tuning_env, tmp_path):
    table = tmp_path / "old.json"
    table.write_text('{"format": 1, "entries": {"stack_compensated": {"focus_dim=32;lmax=3;n_focus=2;apply_alpha=1": '
                     '{"config": null}, "focus_dim=64;lmax=3;n_focus=1;apply_alpha=1": {"config": null}}, '
                     '"stack_bwd_relay": {"focus_dim=32;lmax=3;n_focus=2;apply_alpha=1": {"config": null}}}}')
    assert main(["tune", "--keys-of", str(table), "--rounds", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "quick sweep" in out and "families stack_bwd_relay, stack_compensated" in out
    assert fake_gpu == [("stack_bwd_relay", KEY), ("stack_compensated", KEY),
                        ("stack_bwd_relay", KEY64), ("stack_compensated", KEY64)]
    assert main(["tune", "--keys-of", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_tma_family_is_swept_only_where_level_3_has_a_config(tuning_env):
    made = []
    tuning.register("stack_compensated", KEY, {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})
    try:
        res = _tune([KEY, KEY64], families=["stack_compensated_tma"], make_probe=_probes(made=made),
                    device_name=DEVICE)
    finally:
        tuning.clear_registrations()
    assert [(r.key, r.status) for r in res] == [(KEY, "tuned"), (KEY64, "no-baseline")]
    assert made == [("stack_compensated_tma", KEY)]
