"""The sweep's six rules (docs/contract.md §5), driven by a fake probe and a fake clock: no GPU."""

import dataclasses
import json

import pytest
import torch
from triton.runtime.errors import OutOfResources
from tuning_fakes import DEVICE, FakeClock, FakeProbe, base_outputs, flip_last_bit

import mixstack
from mixstack import tuning
from mixstack.measure.timing import rotation
from mixstack.tuner.sweep import NotEngagedError, TuneError, tune_key
from mixstack.tuning import families
from mixstack.tuning.families import label

KEY = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
FUSED = "stack_bwd_fused"
CANDS = [label(c) for c in tuning.candidates(FUSED, KEY)]


# Every test runs on empty, private tables (the ``tuning_env`` fixture, tests/conftest.py).
pytestmark = pytest.mark.usefixtures("tuning_env")


def _sweep(probe, times=None, family=FUSED, rounds=6, warmup=1, **kw):
    clock = FakeClock(probe, times)
    return tune_key(family, KEY, probe=probe, clock=clock, rounds=rounds, warmup=warmup, **kw)


def _assert_uncovered(tuning_env, family=FUSED):
    assert tuning.lookup(family, KEY, device_name=DEVICE) is tuning.MISSING
    assert not tuning_env.user_file.exists()


# ----------------------------------------------------- rule 1: level and engagement

def test_the_sweep_runs_everything_at_level_2_whatever_the_caller_set():
    probe = FakeProbe(FUSED)
    mixstack.set_level(0)
    _sweep(probe)
    assert probe.levels and set(probe.levels) == {2}
    assert mixstack.get_level() == 0


def test_a_fused_candidate_that_ran_the_relay_is_an_error_and_nothing_is_recorded(tuning_env):
    probe = FakeProbe(FUSED, off_path={CANDS[3]})
    with pytest.raises(NotEngagedError, match=CANDS[3]) as info:
        _sweep(probe, times={CANDS[3]: [0.5]})
    assert "bwd:fused" in str(info.value)
    assert probe.order == []                          # never timed
    _assert_uncovered(tuning_env)


def test_a_candidate_off_its_path_while_timed_is_an_error(tuning_env):
    probe = FakeProbe(FUSED, off_path_timed={CANDS[0]})
    with pytest.raises(NotEngagedError, match="did not take the path"):
        _sweep(probe, times={CANDS[0]: [0.5]})
    _assert_uncovered(tuning_env)


def test_a_baseline_that_is_not_the_relay_is_an_error(tuning_env):
    probe = FakeProbe(FUSED, baseline_paths=("bwd:fused",))      # e.g. a fused entry leaked into it
    with pytest.raises(NotEngagedError, match="baseline"):
        _sweep(probe)
    _assert_uncovered(tuning_env)


def test_a_tuned_forward_config_must_show_in_the_dispatch_log(tuning_env):
    cand = label(tuning.candidates("stack_fwd", KEY)[0])
    probe = FakeProbe("stack_fwd", off_path={cand})
    with pytest.raises(NotEngagedError, match="cfg:stack_fwd"):
        _sweep(probe, family="stack_fwd")
    _assert_uncovered(tuning_env, "stack_fwd")


# ----------------------------------------------------- rule 2: bitwise equality

@pytest.mark.parametrize("which", [0, 1, 2], ids=["result", "grad_u0", "grad_alpha"])
def test_a_candidate_one_bit_off_the_baseline_is_rejected_even_when_fastest(which):
    outs = list(base_outputs())
    outs[which] = flip_last_bit(outs[which])
    probe = FakeProbe(FUSED, outputs={CANDS[2]: tuple(outs)})
    res = _sweep(probe, times={CANDS[2]: [0.5]})
    assert CANDS[2] in res.rejected and f"output {which}" in res.rejected[CANDS[2]]
    assert CANDS[2] not in probe.order
    assert res.config is None


def test_negative_zero_is_not_bitwise_equal_to_zero():
    outs = list(base_outputs())
    outs[0] = outs[0].clone()
    outs[0][2] = -0.0                                   # torch.equal would call this equal
    probe = FakeProbe(FUSED, outputs={CANDS[1]: tuple(outs)})
    res = _sweep(probe, times={CANDS[1]: [0.5]})
    assert CANDS[1] in res.rejected


def test_a_baseline_that_does_not_repeat_is_an_error(tuning_env):
    with pytest.raises(TuneError, match="repeat"):
        _sweep(FakeProbe(FUSED, flaky_baseline=True))
    _assert_uncovered(tuning_env)


def test_a_non_finite_baseline_is_an_error(tuning_env):
    outs = (torch.tensor([1.0, float("nan")]),) + base_outputs()[1:]
    with pytest.raises(TuneError, match="not finite"):
        _sweep(FakeProbe(FUSED, outputs={"baseline": outs}))
    _assert_uncovered(tuning_env)


# ----------------------------------------------------- rule 3: interleaved timing and margin

def _one_candidate(monkeypatch, family=FUSED):
    """Restrict ``family`` to its first candidate; return that candidate's label."""
    only = tuning.candidates(family, KEY)[:1]
    monkeypatch.setitem(families.FAMILIES, family,
                        dataclasses.replace(families.FAMILIES[family], make_candidates=lambda key: only))
    return label(only[0])


@pytest.mark.parametrize("cand_time, base_times, wins", [
    (0.97, [1.0, 1.001, 0.999], True),                    # 3% faster, tiny spread: wins
    (0.97, [0.95, 0.975, 1.0, 1.025, 1.05], False),       # 3% faster, baseline spread 5%: no
    (0.99, [1.0], False),                                 # 1% faster: under the 2% margin
])
def test_a_candidate_wins_only_by_the_margin_and_beyond_the_baselines_spread(
        monkeypatch, cand_time, base_times, wins):
    cand = _one_candidate(monkeypatch)
    probe = FakeProbe(FUSED)
    res = _sweep(probe, times={"baseline": base_times, cand: [cand_time]}, rounds=10)
    assert (res.config is not None) == wins
    assert res.medians_ms[cand] == pytest.approx(cand_time * 1e3)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == res.config


def test_the_fastest_of_several_winners_is_recorded():
    probe = FakeProbe(FUSED)
    res = _sweep(probe, times={CANDS[1]: [0.9], CANDS[5]: [0.8], CANDS[7]: [0.95]})
    assert label(res.config) == CANDS[5]


def test_baseline_and_candidates_are_timed_interleaved_in_rotating_order():
    probe = FakeProbe(FUSED)
    _sweep(probe, rounds=5, warmup=2)
    names = ["baseline"] + CANDS
    expected = [n for r in range(2) for n in rotation(names, r)] + \
               [n for r in range(5) for n in rotation(names, r)]
    assert probe.order == expected
    firsts = {probe.order[i * len(names)] for i in range(7)}
    assert len(firsts) > 1                               # not always the baseline first
    assert probe.order.count("baseline") == 7            # timed every round, not once


# ----------------------------------------------------- rule 4: record, covered keys

def test_the_entry_carries_medians_device_versions_and_date(tuning_env):
    res = _sweep(FakeProbe(FUSED), times={CANDS[0]: [0.5]})
    doc = json.loads(tuning_env.user_file.read_text())
    entry = doc["entries"][FUSED][str(KEY)]
    assert entry["config"] == res.config == tuning.candidates(FUSED, KEY)[0]
    assert entry["device"] == DEVICE and entry["triton"] and entry["torch"] == torch.__version__
    assert entry["kernel_hash"] == tuning.kernel_source_hash(family=FUSED) and entry["date"]
    assert entry["medians_ms"]["baseline"] == pytest.approx(1e3)
    assert entry["medians_ms"][CANDS[0]] == pytest.approx(500.0)


def test_covered_keys_are_skipped_unless_forced():
    probe = FakeProbe(FUSED)
    first = _sweep(probe)                                # nothing wins: None is recorded
    assert first.status == "tuned" and first.config is None
    n = len(probe.runs)
    again = _sweep(probe, times={CANDS[0]: [0.5]})
    assert again.status == "covered" and len(probe.runs) == n
    forced = _sweep(probe, times={CANDS[0]: [0.5]}, force=True)
    assert forced.status == "tuned" and len(probe.runs) > n
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == tuning.candidates(FUSED, KEY)[0]


def test_persist_false_registers_for_this_process_only(tuning_env):
    _sweep(FakeProbe(FUSED), times={CANDS[0]: [0.5]}, persist=False)
    assert not tuning_env.user_file.exists()
    assert tuning.lookup(FUSED, KEY, device_name="another-gpu") == tuning.candidates(FUSED, KEY)[0]


def test_a_family_without_candidates_records_nothing(tuning_env):
    wide = tuning.shape_key(focus_dim=48, lmax=2, n_focus=1, apply_alpha=True)   # outside the fused regime
    probe = FakeProbe(FUSED)
    res = tune_key(FUSED, wide, probe=probe, clock=FakeClock(probe), rounds=2)
    assert res.status == "no-candidates" and probe.runs == []
    assert tuning.lookup(FUSED, wide, device_name=DEVICE) is tuning.MISSING


# ------------------------------------------- level 3: the float64 contract, not bits

COMP = "stack_compensated"
COMP_CANDS = [label(c) for c in tuning.candidates(COMP, KEY)]


def _off_by(rel: float):
    """The baseline's outputs, each moved by ``rel`` of its norm (a uniform relative error)."""
    return tuple(t + rel * t.norm() / t.numel() ** 0.5 for t in base_outputs())


def test_compensated_candidates_are_judged_against_float64_at_level_3(tuning_env):
    within, over = COMP_CANDS[0], COMP_CANDS[1]
    probe = FakeProbe(COMP, outputs={within: _off_by(1e-6), over: _off_by(5e-6)})
    res = _sweep(probe, {"baseline": [1.0], within: [0.5]}, family=COMP)
    # different bits from the baseline but inside the contract: accepted, timed, and it wins
    assert res.config == tuning.candidates(COMP, KEY)[0]
    assert over in res.rejected and "above the contract 2e-06" in res.rejected[over]
    assert within not in res.rejected
    levels = dict(zip(probe.runs, probe.levels))
    assert levels["baseline"] == 2 and levels[within] == 3 and levels[over] == 3


def test_a_compensated_candidate_with_one_nonfinite_value_is_rejected(tuning_env):
    bad = list(base_outputs())
    bad[1] = bad[1].clone()
    bad[1][3] = float("nan")
    probe = FakeProbe(COMP, outputs={COMP_CANDS[0]: tuple(bad)})
    res = _sweep(probe, family=COMP)
    assert "not finite" in res.rejected[COMP_CANDS[0]]


def test_the_probe_s_scales_judge_grad_alpha_element_by_element(tuning_env):
    # grad_alpha 1e-5 off relative (above 2e-6) but 1e-6 of a scale of 10: within the contract;
    # 1e-4 off absolute is 1e-5 of that scale: above it.
    out, grad_u0, grad_alpha = base_outputs()
    within, over = COMP_CANDS[0], COMP_CANDS[1]
    close, far = (out, grad_u0, grad_alpha * (1 + 1e-5)), (out, grad_u0, grad_alpha + 1e-4)
    scales = (None, None, torch.full(grad_alpha.shape, 10.0, dtype=torch.float64))
    probe = FakeProbe(COMP, outputs={within: close, over: far}, scales=scales)
    res = _sweep(probe, {"baseline": [1.0], within: [0.5]}, family=COMP)
    assert res.config == tuning.candidates(COMP, KEY)[0] and within not in res.rejected
    assert res.rejected[over].startswith("output 2 (grad_alpha): error")
    assert "of the sum of its terms' absolute values" in res.rejected[over]
    relative = _sweep(FakeProbe(COMP, outputs={within: close}), family=COMP, force=True)     # no scales
    assert within in relative.rejected and "relative error" in relative.rejected[within]


def test_the_contract_is_measured_against_the_reference_not_the_baseline(tuning_env):
    # A baseline 3e-6 away from float64: a candidate equal to the baseline's bits breaks the contract.
    probe = FakeProbe(COMP, reference=_off_by(-3e-6))
    res = _sweep(probe, family=COMP)
    assert res.config is None and set(res.rejected) == set(COMP_CANDS)


# ----------------------------------------------------- rule 5: resources vs failures

def test_an_unexpected_exception_leaves_the_key_uncovered_and_surfaces(tuning_env):
    boom = RuntimeError("boom")
    with pytest.raises(TuneError, match="boom") as info:
        _sweep(FakeProbe(FUSED, errors={CANDS[4]: boom}))
    assert info.value.__cause__ is boom
    _assert_uncovered(tuning_env)


def test_a_failing_baseline_leaves_the_key_uncovered(tuning_env):
    with pytest.raises(TuneError, match="baseline run failed"):
        _sweep(FakeProbe(FUSED, errors={"baseline": ValueError("bad input")}))
    _assert_uncovered(tuning_env)


@pytest.mark.parametrize("error", [
    OutOfResources(232448, 101376, "shared memory"),
    RuntimeError("triton: out of shared memory for this launch"),
], ids=["OutOfResources", "message"])
def test_a_resource_refusal_skips_only_that_candidate(error):
    probe = FakeProbe(FUSED, errors={CANDS[0]: error})
    res = _sweep(probe, times={CANDS[0]: [0.1], CANDS[1]: [0.5]})
    assert list(res.skipped) == [CANDS[0]] and "shared memory" in res.skipped[CANDS[0]]
    assert CANDS[0] not in probe.order and CANDS[1] in probe.order
    assert label(res.config) == CANDS[1]


def test_a_resource_error_raised_from_inside_another_is_still_a_resource_refusal():
    try:
        try:
            raise OutOfResources(1, 0, "registers")
        except OutOfResources as inner:
            raise RuntimeError("compiling failed") from inner
    except RuntimeError as exc:
        wrapped = exc
    res = _sweep(FakeProbe(FUSED, errors={CANDS[2]: wrapped}))
    assert CANDS[2] in res.skipped


def test_no_registration_outlives_the_sweep_even_on_failure():
    tuning.register("stack_fwd", KEY, None)
    before = tuning.registrations()

    class Leaky(FakeProbe):
        def run(self, cfg):
            tuning.register(FUSED, KEY, cfg)             # a probe that forgets to restore
            return super().run(cfg)
    with pytest.raises(TuneError):
        _sweep(Leaky(FUSED, errors={CANDS[1]: RuntimeError("boom")}))
    assert tuning.registrations() == before


# ----------------------------------------------------- rule 6: progress

def test_progress_reports_key_candidate_and_steps_to_the_end():
    events = []
    _sweep(FakeProbe(FUSED), progress=events.append, rounds=3, warmup=1)
    assert {e.key for e in events} == {KEY} and {e.family for e in events} == {FUSED}
    assert {e.candidate for e in events if e.phase == "check"} >= set(CANDS)
    assert [e.done for e in events] == sorted(e.done for e in events)
    assert events[-1].phase == "done" and events[-1].done == events[-1].total
    assert all(e.done <= e.total for e in events)


# ----------------------------------------------------- the TMA-fed level-3 family

TMA = "stack_compensated_tma"
TMA_CANDS = [label(c) for c in tuning.candidates(TMA, KEY)]


def test_the_tma_family_runs_its_baseline_at_level_3_and_judges_against_float64(tuning_env):
    probe = FakeProbe(TMA, outputs={TMA_CANDS[0]: _off_by(1e-6), TMA_CANDS[1]: _off_by(5e-6)})
    res = _sweep(probe, {"baseline": [1.0], TMA_CANDS[0]: [0.5]}, family=TMA)
    assert res.config == tuning.candidates(TMA, KEY)[0] and TMA_CANDS[1] in res.rejected
    assert set(dict(zip(probe.runs, probe.levels)).values()) == {3}     # the baseline is level 3 too


def test_a_tma_candidate_that_does_not_build_is_skipped_but_elsewhere_it_surfaces(tuning_env):
    """Triton's Hopper warp specialisation can fail to build a tile (a pass pipeline error):
    the TMA family skips that candidate; the same error in another family is a failure."""
    from triton.compiler.errors import CompilationError
    broken = RuntimeError("PassManager::run failed")
    res = _sweep(FakeProbe(TMA, errors={TMA_CANDS[0]: broken,
                                        TMA_CANDS[1]: CompilationError("src", None, "unsupported")}), family=TMA)
    assert set(res.skipped) == {TMA_CANDS[0], TMA_CANDS[1]} and "does not build" in res.skipped[TMA_CANDS[0]]
    with pytest.raises(TuneError, match="PassManager"):
        _sweep(FakeProbe(COMP, errors={COMP_CANDS[0]: broken}), family=COMP)
    assert tuning.lookup(COMP, KEY, device_name=DEVICE) is tuning.MISSING


def test_the_tma_family_has_four_warp_tiles_only_and_stays_out_of_the_default_quick_sweep():
    cands = tuning.candidates(TMA, KEY)
    assert cands and all(c["num_warps"] == 4 for c in cands)     # what Triton's Hopper pass needs
    quick = tuning.candidates(TMA, KEY, quick=True)
    assert all(q in cands for q in quick)
    assert [label(q) for q in quick] == ["M64 N64 w4 s2", "M64 N64 w4 s2 specialised", "M64 N64 w4 s2 persistent",
                                         "M64 N64 w4 s2 persistent specialised", "M64 N64 w4 s3 persistent"]
    assert TMA in families.SWEEP_ORDER and TMA not in families.QUICK_FAMILIES


def test_the_tma_forms_the_gpu_found_wrong_are_never_swept():
    """More than two stages: only the persistent unspecialised form (the others gave wrong bits)."""
    for key in (KEY, tuning.shape_key(focus_dim=64, lmax=3, n_focus=2, apply_alpha=True)):
        cands = tuning.candidates(TMA, key)
        deep = [c for c in cands if c["num_stages"] > 2]
        assert deep and all(c["persistent"] and not c["specialised"] for c in deep)
        assert any(c["specialised"] for c in cands) and any(not c["persistent"] for c in cands)
        forms = families.tma_forms(key)                 # what the TMA probe runs: the unswept ones too
        assert all(c in forms for c in cands) and any(not families.tma_form_is_right(f) for f in forms)
        for quick in (False, True):
            assert all(families.tma_form_is_right(c) for c in tuning.candidates(TMA, key, quick=quick))
