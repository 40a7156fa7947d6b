"""Levels 1-3 on a CUDA GPU against float64, on S-like moderate shapes; run-to-run
and level-1/level-2 bit identity.  Skipped without CUDA."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel

import mixstack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
CASES = [
    Case(F=2, E=20001, Cf=32, lmax=3, n_layers=4, apply_alpha=True),    # S1-like
    Case(F=2, E=20001, Cf=32, lmax=6, n_layers=4, apply_alpha=True),    # S2-like
    Case(F=1, E=20001, Cf=64, lmax=3, n_layers=4, apply_alpha=True),    # S4-like
    Case(F=3, E=4097, Cf=48, lmax=2, n_layers=2, apply_alpha=False),    # non-power-of-two Cf
]


def _want(case):
    inputs = helpers.make_inputs(case, device=DEV)
    return helpers.reference64(case, inputs, helpers.make_grad_out(case, device=DEV))


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_level1_forward_and_relay_gradients_match_float64(case, cached_run):
    got = cached_run(case, 1, device=DEV)
    want_out, want = _want(case)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1}
    assert got["out"].device.type == DEV and got["out"].dtype == torch.float32
    assert_close_rel(got["out"], want_out, "forward")
    assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")
    if case.apply_alpha:
        assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_level1_is_bitwise_identical_run_to_run(case, cached_run):
    first = cached_run(case, 1, device=DEV)
    second = helpers.run_stack(case, 1, helpers.make_inputs(case, device=DEV),
                               helpers.make_grad_out(case, device=DEV))
    for key in ("out", "grad_u0", "grad_alpha"):
        if key in first:
            assert torch.equal(first[key], second[key]), key


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_level2_bitwise_equal_to_level1(case, cached_run):
    one, two = cached_run(case, 1, device=DEV), cached_run(case, 2, device=DEV)
    assert two["log"]["fwd:triton"] == 1
    for key in ("out", "grad_u0", "grad_alpha"):
        if key in one:
            assert torch.equal(one[key], two[key]), key


@pytest.mark.parametrize("case", CASES[:2], ids=helpers.case_id)
def test_gpu_level3_matches_float64(case, cached_run):
    got = cached_run(case, 3, device=DEV)
    want_out, want = _want(case)
    assert_close_rel(got["out"], want_out, "forward")
    assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")
    assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")


def test_gpu_level1_weight_gradients_and_double_backward_match_float64():
    case = Case(F=2, E=3001, Cf=32, lmax=3, n_layers=3, apply_alpha=True)
    inputs = helpers.make_inputs(case, device=DEV)
    grad_out = helpers.make_grad_out(case, device=DEV)
    got = helpers.run_stack(case, 1, inputs, grad_out, weights=True)
    _, want = helpers.reference64(case, inputs, grad_out, wrt=helpers.INPUT_NAMES)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1, "wgrad:triton": 1}
    for name in helpers.INPUT_NAMES:
        assert_close_rel(got[f"grad_{name}"], want[name], f"grad_{name}")
    v = helpers.make_grad_out(case, seed=2, device=DEV).transpose(0, 1).contiguous()
    want2 = helpers.double_backward64(case, inputs, grad_out, v)
    x = [t.clone().requires_grad_() for t in inputs]
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        got2 = helpers.double_backward(mixstack.mixing_stack, case, x, grad_out, v)
    assert log == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2}, dict(log)
    for name, g in want2.items():
        assert_close_rel(got2[name], g, f"d2/d{name}")


def test_gpu_level1_nan_in_u0_stays_in_its_edge_and_noncontiguous_inputs_give_same_bits(cached_run):
    case = CASES[0]
    inputs = helpers.make_inputs(case, device=DEV)
    grad_out = helpers.make_grad_out(case, device=DEV)
    clean = cached_run(case, 1, device=DEV)
    nc = tuple(t.transpose(0, 1).contiguous().transpose(0, 1) for t in inputs[:2]) + inputs[2:]
    assert not nc[0].is_contiguous()
    same = helpers.run_stack(case, 1, nc, grad_out)
    for key in ("out", "grad_u0", "grad_alpha"):
        assert torch.equal(same[key], clean[key]), key
    u0 = inputs[0].clone()
    u0[1, 777, 5] = float("nan")
    dirty = helpers.run_stack(case, 1, (u0,) + inputs[1:], grad_out)
    assert torch.isnan(dirty["out"][777, 1]).any()
    keep = torch.ones(case.E, dtype=torch.bool, device=DEV)
    keep[777] = False
    assert torch.equal(dirty["out"][keep], clean["out"][keep])
    assert torch.equal(dirty["grad_u0"][:, keep], clean["grad_u0"][:, keep])


@pytest.mark.parametrize("compensated", [False, True], ids=["exact", "level3"])
@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_the_relay_has_the_same_bits_with_or_without_the_sigmoid_surface(case, compensated, monkeypatch):
    """The pointwise kernel forming the gate sigmoids itself is a schedule: compiled for
    the GPU (FMA dots exact, tensor-core dots at level 3, different row tiles than the gate
    kernel) it must give the surface relay's bits."""
    from mixstack.stack import launchers
    from mixstack.stack.values import Saved, Weights
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, device=DEV)
    weights, plan = Weights(w0, w1, gw), launchers.LaunchPlan(compensated=compensated)
    out, z, y = launchers.stack_forward(u0, alpha, weights, case.spec, plan)
    grad_out = torch.randn_like(out)
    grads = {}
    for fold in (False, True):
        monkeypatch.setattr(launchers, "pointwise_recomputes_gate", lambda layout, compensated=False, fold=fold: fold)
        grads[fold] = launchers.stack_backward(grad_out, Saved(z, y, alpha), weights, case.spec, plan)
    assert torch.equal(grads[True][0], grads[False][0])
    assert torch.equal(grads[True][1], grads[False][1])
