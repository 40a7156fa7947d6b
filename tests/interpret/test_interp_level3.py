"""Level 3 on a key nobody swept, through the interpreter: the policy's config is validated
against float64 at the first call and the verdict kept for the process (no table is written);
where the policy is not sure, or the validation fails, level 3 runs level 2 and the dispatch
log says so."""

import json

import helpers
import pytest
import triton
from helpers import Case
from tuning_fakes import tuning_env  # noqa: F401  (private, empty tables)

from mixstack import tuning
from mixstack.stack import level3
from mixstack.tuning import families, policy, registry

COMP = "stack_compensated"
DEVICE = "triton-interpreter"
CASE = Case(F=1, E=33, Cf=16, lmax=1, n_layers=2)      # Cf 16: the rule is not sure here


@pytest.fixture
def tables(tuning_env, monkeypatch):  # noqa: F811
    monkeypatch.setenv("TRITON_INTERPRET", "1")          # tuning_env clears it
    policy.forget_verdicts()
    yield tuning_env
    policy.forget_verdicts()


def _key(case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _engage_by_grid_verdict(case):
    """A grid verdict that level 3 wins at ``case``'s key, so the policy engages there."""
    with open(policy.verdicts_path(DEVICE), "w") as fh:
        json.dump({"verdicts": {str(_key(case)): {"speedup": 1.5}}}, fh)
    policy.forget_verdicts()


def _run(case=CASE):
    return helpers.run_stack(case, 3, helpers.make_inputs(case), helpers.make_grad_out(case))


def test_an_unsure_key_runs_level_2_and_says_so(tables):
    res = _run()
    assert res["log"].get("fwd:triton", 0) and res["log"].get("bwd:relay", 0) and res["log"].get("level3:level2", 0) == 2
    assert not res["log"].get("fwd:compensated", 0)
    assert tuning.find(COMP, _key(CASE), device_name=DEVICE) is None       # nothing recorded


def test_the_policy_config_is_validated_at_first_use_and_kept(tables, monkeypatch):
    _engage_by_grid_verdict(CASE)
    calls = []
    real = level3.validate
    monkeypatch.setattr(level3, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    res = _run()
    assert res["log"].get("fwd:compensated", 0) and res["log"].get("bwd:compensated", 0) and res["log"].get("level3:policy", 0) == 2
    assert helpers.rel_err(res["out"], helpers.run_stack(CASE, 0, helpers.make_inputs(CASE),
                                                          helpers.make_grad_out(CASE))["out"]) < 2e-6
    assert tuning.find(COMP, _key(CASE), device_name=DEVICE) is None        # no table written
    plan = level3.resolve(_key(CASE), DEVICE)
    assert plan.source == "policy" and plan.config == policy.rule_config(_key(CASE))
    assert len(calls) == 1
    assert _run()["log"].get("level3:policy", 0) == 2 and len(calls) == 1   # kept: no second check
    registry.reload()
    level3.forget()                                    # a new process checks again
    assert _run()["log"].get("level3:policy", 0) == 2 and len(calls) == 2


def test_a_failed_validation_is_kept_and_level_3_runs_level_2(tables, monkeypatch):
    _engage_by_grid_verdict(CASE)
    strict = families.contract_difference
    monkeypatch.setattr(level3.families, "contract_difference",
                        lambda ref, got, **kw: strict(ref, got, bound=0.0, **kw))
    with pytest.warns(UserWarning, match="failed the float64 check"):
        res = _run()
    assert res["log"].get("fwd:triton", 0) and res["log"].get("level3:level2", 0) == 2 and not res["log"].get("fwd:compensated", 0)
    plan = level3.resolve(_key(CASE), DEVICE)
    assert plan.config is None and "above the contract" in plan.reason


def test_the_first_call_may_come_without_autograd(tables):
    import torch

    import mixstack
    _engage_by_grid_verdict(CASE)
    u0, alpha, w0, w1, gw = helpers.make_inputs(CASE)
    with mixstack.use_level(3), torch.inference_mode(), mixstack.dispatch_log() as log:
        mixstack.mixing_stack(u0, alpha, w0, w1, gw, lmax=CASE.lmax, focus_dim=CASE.Cf)
    assert log == {"fwd:compensated": 1, "level3:policy": 1}
    assert level3.resolve(_key(CASE), DEVICE).source == "policy"


def _cancelling_inputs(key, edges, device, seed):
    """``level3._inputs`` with the upstream gradient moved so that every grad_alpha sum cancels to
    1e-3 of its terms' absolute values."""
    from mixstack.stack import reference
    u0, alpha, w0, w1, gw, grad = _real_inputs(key, edges, device, seed)
    x64 = (t.double() for t in (u0, alpha, w0, w1, gw))
    y = reference.forward_state(*x64, lmax=key.lmax, focus_dim=key.focus_dim, apply_alpha=False)[2]
    return u0, alpha, w0, w1, gw, helpers.cancelling_grad_out(grad, y, 1e-3)


_real_inputs = level3._inputs


def test_the_check_judges_an_ill_conditioned_alpha_gradient_by_its_sum_s_scale(tables, monkeypatch):
    """One edge whose grad_alpha sums cancel: level 3 is above 2e-6 relative there, as float32 is,
    and within 2e-6 of each sum's absolute scale, which the check asks (docs/contract.md §3)."""
    from mixstack.stack import ops  # noqa: F401  (registers the mixstack:: operators)
    monkeypatch.setattr(level3, "_inputs", _cancelling_inputs)
    key, cfg = _key(CASE), policy.rule_config(_key(CASE))
    assert level3.validate(key, cfg, "cpu", edges=(1,)) == {"ok": True, "why": None, "edges": [1]}
    monkeypatch.setattr(level3, "_scales", lambda key, x64, grad: (None, None, None))   # relative only
    failed = level3.validate(key, cfg, "cpu", edges=(1,))
    assert not failed["ok"] and failed["why"].startswith("1 edges: output 2 (grad_alpha): relative error")


@triton.jit
def _doubled_tail(head, tail, row_up):
    """``compensated.split_result`` with the tail products counted twice: a planted wrong tail."""
    return (head + tail * (2.0 / 2048.0)) * row_up[:, None]


def test_a_wrong_tail_product_fails_the_alpha_check_where_the_true_one_passes(tables, monkeypatch):
    """The check judging grad_alpha alone, on edges whose sums cancel to 1e-3 of their scale: level 3
    passes, and fails with every tail product doubled (an error far above float32 rounding of the
    scale), so the scale-relative bound still catches a wrong product."""
    from mixstack.kernels import compensated
    from mixstack.stack import ops  # noqa: F401  (registers the mixstack:: operators)
    strict = families.contract_difference
    monkeypatch.setattr(level3.families, "contract_difference",
                        lambda ref, got, scales, names: strict(ref[2:], got[2:], scales=scales[2:], names=names[2:]))
    monkeypatch.setattr(level3, "_inputs", _cancelling_inputs)
    key, cfg = _key(CASE), policy.rule_config(_key(CASE))
    assert level3.validate(key, cfg, "cpu", edges=(5,))["ok"]
    monkeypatch.setattr(compensated, "split_result", _doubled_tail)
    failed = level3.validate(key, cfg, "cpu", edges=(5,))
    assert not failed["ok"] and failed["why"].startswith("5 edges: output 0 (grad_alpha): error")
    assert "of the sum of its terms' absolute values" in failed["why"]


def test_a_freeze_checks_the_policy_config_before_it_traces(tables, monkeypatch):
    """A trace makes no eager call, where the first-use check runs: ``check`` does it for a
    freeze (``export.check_level3``), once, and the trace then sees the verdict."""
    import torch

    from mixstack import export
    _engage_by_grid_verdict(CASE)
    calls = []
    real = level3.validate
    monkeypatch.setattr(level3, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    key = _key(CASE)
    assert level3.resolve(key, DEVICE).source == "unchecked"
    plan = level3.check(key, torch.device("cpu"))
    assert plan.source == "policy" and plan.config == policy.rule_config(key) and len(calls) == 1
    assert level3.resolve(key, DEVICE) == plan
    assert level3.check(key, torch.device("cpu")) == plan and len(calls) == 1       # kept
    # the freeze's summary: only at level 3 on CUDA, one entry per key
    assert export.check_level3([key], torch.device("cpu"), 3) == ""
    assert export.check_level3([key], torch.device("cuda"), 2) == ""
    monkeypatch.setattr(level3, "check", lambda k, d: plan)
    assert export.check_level3([key], torch.device("cuda"), 3) == f"{key.short()}: policy"
    refused = level3.Plan(None, "table", "the shipped table's entry is level 2")
    monkeypatch.setattr(level3, "check", lambda k, d: refused)
    assert export.check_level3([key], torch.device("cuda"), 3) == \
        f"{key.short()}: level 2 (the shipped table's entry is level 2)"
