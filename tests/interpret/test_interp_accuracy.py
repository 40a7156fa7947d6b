"""Levels 1-3 (Triton kernels, interpreted) against the float64 reference.

Covering set (not the full product; the interpreter is slow): every case has a
partial edge tile or a single edge, and together they cover E in {1, 70, 129} (70 and 129:
two and three of the level-1 GEMM's 64-row tiles, the last partial; E = 0 in test_interp_edge_cases), Cf in {16, 48} (48: padded register tiles),
lmax in {1, 3, 6} (2, 4, 5 in a lighter test), n_layers 1 (identity layer only) and > 1, F in {1, 3},
alpha on and off.
"""

from __future__ import annotations

import functools

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel, case_id

import mixstack

CASES = [
    Case(F=1, E=129, Cf=16, lmax=1, n_layers=1, apply_alpha=True),    # no gated layer, a 1-row last tile
    Case(F=3, E=70, Cf=16, lmax=3, n_layers=3, apply_alpha=False),    # 2 gated layers, F=3
    Case(F=1, E=70, Cf=48, lmax=1, n_layers=2, apply_alpha=True),     # non-power-of-two Cf
    Case(F=1, E=70, Cf=16, lmax=6, n_layers=2, apply_alpha=True),     # lmax 6
    Case(F=3, E=1, Cf=48, lmax=3, n_layers=2, apply_alpha=False),     # one edge, Cf 48, F=3
    Case(F=1, E=1, Cf=48, lmax=6, n_layers=3, apply_alpha=True),      # widest row, one edge
]
# Level 2 and level 3 rerun everything: a representative subset.
LEVEL_EQ_CASES = [CASES[1], CASES[2], CASES[5]]
# The dearest shapes through the interpreter run in the full suite only: the widest row, the one
# edge at Cf 48 and F 3 (one edge in the quick tier: test_interp_edge_cases' sum over the streams
# and test_interp_training's weight gradients), and F 3 at levels 2 and 3 (the quick tier keeps
# Cf 48 there).
PARAMS = [pytest.param(c, marks=pytest.mark.slow) if c in (CASES[4], CASES[5]) else c for c in CASES]
LEVEL_EQ_PARAMS = [pytest.param(c, marks=pytest.mark.slow) if c in (CASES[1], CASES[5]) else c
                   for c in LEVEL_EQ_CASES]
# Weight gradients and the double backward run the training kernels here; their full covering
# set, with the incoming gradient's and alpha's terms, is tests/interpret/test_interp_training.py
# (lmax 6 runs in the full suite only, there and here).
TRAINING_CASES = [CASES[0], CASES[2], pytest.param(CASES[3], marks=pytest.mark.slow)]

RELAY_GRADS = ("grad_u0", "grad_alpha")


@functools.lru_cache(maxsize=None)
def _want(case):
    inputs = helpers.make_inputs(case)
    return helpers.reference64(case, inputs, helpers.make_grad_out(case),
                               wrt=("u0", "alpha", "w0", "w1", "gw"))


@pytest.mark.parametrize("case", PARAMS, ids=case_id)
def test_level1_forward_matches_float64_reference(case, cached_run):
    got = cached_run(case, 1)
    want, _ = _want(case)
    assert got["out"].shape == (case.E, case.F, case.row)
    assert got["out"].dtype == torch.float32
    assert_close_rel(got["out"], want, "forward")


@pytest.mark.parametrize("case", PARAMS, ids=case_id)
def test_level1_relay_gradients_match_float64_reference(case, cached_run):
    got = cached_run(case, 1)
    _, want = _want(case)
    assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")
    if case.apply_alpha:
        assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")


@pytest.mark.parametrize("case", PARAMS, ids=case_id)
def test_level1_force_path_runs_triton_forward_and_relay_backward(case, cached_run):
    assert cached_run(case, 1)["log"] == {"fwd:triton": 1, "bwd:relay": 1}


@pytest.mark.parametrize("case", TRAINING_CASES, ids=case_id)
def test_level1_weight_gradients_match_float64_reference(case, cached_run):
    got = cached_run(case, 1, weights=True)
    want_out, want = _want(case)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1, "wgrad:triton": 1}
    assert_close_rel(got["out"], want_out, "forward")
    for name in ("u0", "alpha", "w0", "w1", "gw"):
        if name == "alpha" and not case.apply_alpha:
            continue
        assert got[f"grad_{name}"].shape == want[name].shape, name
        assert_close_rel(got[f"grad_{name}"], want[name], f"grad_{name}")


@pytest.mark.parametrize("case", TRAINING_CASES, ids=case_id)
def test_level1_double_backward_matches_float64_reference(case):
    inputs = helpers.make_inputs(case)
    grad_out = helpers.make_grad_out(case)
    v = helpers.make_grad_out(case, seed=2).transpose(0, 1).contiguous()    # (F, E, ROW) like u0
    want = helpers.double_backward64(case, inputs, grad_out, v)
    x = [t.clone().requires_grad_() for t in inputs]
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        got = helpers.double_backward(mixstack.mixing_stack, case, x, grad_out, v)
    # the first backward keeps its chain (relay), the double backward runs the tangent pass and
    # its reductions, the forward's backward the relay with the weight reductions
    assert log == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2}, dict(log)
    for name, g in want.items():
        assert_close_rel(got[name], g, f"d2/d{name}")


@pytest.mark.parametrize("lmax", [2, 4, 5])
def test_level1_remaining_lmax_values_match_float64_reference(lmax, cached_run):
    case = Case(F=1, E=65, Cf=16, lmax=lmax, n_layers=2, apply_alpha=True)
    got = cached_run(case, 1)
    want_out, want = _want(case)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1}
    assert_close_rel(got["out"], want_out, "forward")
    assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")
    assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")


@pytest.mark.parametrize("case", LEVEL_EQ_PARAMS, ids=case_id)
def test_level2_bitwise_equal_to_level1(case, cached_run):
    one, two = cached_run(case, 1), cached_run(case, 2)
    assert two["log"]["fwd:triton"] == 1
    for key in ("out",) + RELAY_GRADS:
        if key in one:
            assert torch.equal(one[key], two[key]), key


@pytest.mark.parametrize("case", LEVEL_EQ_PARAMS, ids=case_id)
def test_level3_matches_float64_reference(case, cached_run):
    got = cached_run(case, 3)
    want_out, want = _want(case)
    assert got["log"]["fwd:triton"] == 1
    assert_close_rel(got["out"], want_out, "forward")
    assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")
    if case.apply_alpha:
        assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")


def test_tolerance_rejects_a_1e3_weight_perturbation(cached_run):
    """The 1e-5 bound is meaningful: float32 rounding sits far below it, and a
    result computed with one weight tensor off by 1e-3 (relative) sits far above."""
    case = CASES[2]
    inputs = helpers.make_inputs(case)
    want_out, want = _want(case)
    exact = cached_run(case, 1)
    w0 = inputs[2] * (1 + 1e-3)
    wrong = helpers.run_stack(case, 1, (inputs[0], inputs[1], w0, inputs[3], inputs[4]),
                              helpers.make_grad_out(case))
    for key, ref in (("out", want_out), ("grad_u0", want["u0"]), ("grad_alpha", want["alpha"])):
        err_exact = helpers.rel_err(exact[key], ref)
        err_wrong = helpers.rel_err(wrong[key], ref)
        assert err_exact < helpers.REL_TOL / 10, (key, err_exact)
        assert err_wrong > 5 * helpers.REL_TOL, (key, err_wrong)
