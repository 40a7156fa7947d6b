"""Kernel-path properties beyond accuracy: determinism, no mutation, strides, E = 0,
NaN/Inf propagation, fallbacks, zero alpha (interpreted Triton kernels)."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case

import mixstack

SMALL = Case(F=2, E=5, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
DETERMINISM_CASES = [     # test_interp_accuracy's, whose level-1 runs (cached_run) are the first runs here
    Case(F=1, E=70, Cf=48, lmax=1, n_layers=2, apply_alpha=True),
    Case(F=3, E=70, Cf=16, lmax=3, n_layers=3, apply_alpha=False),
]


@pytest.mark.parametrize("case", [DETERMINISM_CASES[0], pytest.param(DETERMINISM_CASES[1], marks=pytest.mark.slow)],
                         ids=helpers.case_id)
def test_level1_is_bitwise_identical_run_to_run(case, cached_run):
    first = cached_run(case, 1)
    second = helpers.run_stack(case, 1, helpers.make_inputs(case), helpers.make_grad_out(case))
    for key in ("out", "grad_u0", "grad_alpha"):
        if key in first:
            assert torch.equal(first[key], second[key]), key


@pytest.mark.parametrize("weights", [False, True], ids=["relay", "weight-grads"])
def test_level1_does_not_mutate_inputs_or_grad_out(weights):
    case = SMALL
    inputs = [t.contiguous() for t in helpers.make_inputs(case)]
    grad_out = helpers.make_grad_out(case)
    before = [t.clone() for t in inputs] + [grad_out.clone()]
    x = [t.requires_grad_(weights or i < 2) for i, t in enumerate(inputs)]
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(*x, **case.kw)
        torch.autograd.grad(out, [t for t in x if t.requires_grad], grad_out)
    assert log["fwd:triton"] == 1
    for name, old, new in zip(helpers.INPUT_NAMES + ("grad_out",), before, inputs + [grad_out]):
        assert torch.equal(old, new.detach()), f"{name} was modified"


def _non_contiguous_like(t: torch.Tensor, dims=(0, 1)) -> torch.Tensor:
    """Same values, transposed storage: ``t.transpose(*dims).contiguous().transpose(*dims)``."""
    nc = t.transpose(*dims).contiguous().transpose(*dims)
    assert torch.equal(nc, t) and (t.numel() <= 1 or not nc.is_contiguous())
    return nc


def test_level1_accepts_non_contiguous_inputs_with_identical_results(cached_run):
    case = Case(F=2, E=70, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    grad_out = helpers.make_grad_out(case)
    nc = (_non_contiguous_like(u0), _non_contiguous_like(alpha), _non_contiguous_like(w0, (-1, -2)),
          _non_contiguous_like(w1, (-1, -2)), _non_contiguous_like(gw, (-1, -2)))
    want = cached_run(case, 1)
    got = helpers.run_stack(case, 1, nc, _non_contiguous_like(grad_out))
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1}
    for key in ("out", "grad_u0", "grad_alpha"):
        assert torch.equal(got[key], want[key]), key


def test_level1_empty_edge_set_returns_empty_results():
    case = Case(F=2, E=0, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
    got = helpers.run_stack(case, 1, helpers.make_inputs(case), helpers.make_grad_out(case))
    assert got["out"].shape == (0, case.F, case.row)
    assert got["grad_u0"].shape == (case.F, 0, case.row)
    assert got["grad_alpha"].shape == (0, case.F)
    assert got["log"]["fwd:triton"] == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")        # numpy, inside the interpreter
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_level1_nan_or_inf_in_u0_propagates_to_its_edge_only(bad):
    case = SMALL
    inputs = helpers.make_inputs(case)
    grad_out = helpers.make_grad_out(case)
    clean = helpers.run_stack(case, 1, inputs, grad_out)
    u0 = inputs[0].clone()
    u0[0, 2, 3] = bad                                   # focus 0, edge 2, an l = 0 channel
    dirty = helpers.run_stack(case, 1, (u0,) + inputs[1:], grad_out)
    assert not torch.isfinite(dirty["out"][2, 0]).all()
    assert not torch.isfinite(dirty["grad_u0"][0, 2]).all()
    keep = [e for e in range(case.E) if e != 2]
    # rows are independent: every other edge (and the other focus) is untouched, bit for bit
    assert torch.equal(dirty["out"][keep], clean["out"][keep])
    assert torch.equal(dirty["out"][2, 1], clean["out"][2, 1])
    assert torch.equal(dirty["grad_u0"][:, keep], clean["grad_u0"][:, keep])
    assert torch.equal(dirty["grad_alpha"][keep], clean["grad_alpha"][keep])


@pytest.mark.filterwarnings("ignore:mixstack. falling back")
@pytest.mark.parametrize("why", ["focus_dim-8", "float64"])
def test_level1_unsupported_shape_or_dtype_falls_back_to_reference(why):
    case = Case(F=2, E=5, Cf=8 if why == "focus_dim-8" else 16, lmax=2, n_layers=2)
    dtype = torch.float64 if why == "float64" else torch.float32
    inputs = helpers.make_inputs(case, dtype=dtype)
    got = helpers.run_stack(case, 1, inputs, helpers.make_grad_out(case, dtype=dtype))
    assert got["log"] == {"fwd:reference": 1, "bwd:reference": 1}
    want, grads = helpers.reference64(case, inputs, helpers.make_grad_out(case))
    helpers.assert_close_rel(got["out"], want, "forward")
    helpers.assert_close_rel(got["grad_u0"], grads["u0"], "grad_u0")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_level1_grad_alpha_is_right_where_alpha_is_zero():
    """grad_alpha = sum_c g * y (docs/contract.md §1) holds at alpha = 0 too; level 0 gets it right,
    so level 1 must too (raising the level never changes a result beyond rounding).
    A softmax weight can underflow to exactly 0; a NaN there poisons every gradient."""
    case = SMALL
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    alpha = alpha.clone()
    alpha[1, 0] = 0.0
    inputs = (u0, alpha, w0, w1, gw)
    grad_out = helpers.make_grad_out(case)
    _, want = helpers.reference64(case, inputs, grad_out)
    got = helpers.run_stack(case, 1, inputs, grad_out)
    assert torch.isfinite(got["grad_alpha"]).all(), got["grad_alpha"]
    helpers.assert_close_rel(got["grad_alpha"], want["alpha"], "grad_alpha")
    helpers.assert_close_rel(got["grad_u0"], want["u0"], "grad_u0")


@pytest.mark.parametrize("case", [Case(F=2, E=70, Cf=16, lmax=2, n_layers=3, apply_alpha=True),
                                  Case(F=3, E=1, Cf=32, lmax=1, n_layers=2, apply_alpha=False)],
                         ids=helpers.case_id)
def test_level1_sum_over_focus_gradient_is_read_in_place_with_the_same_bits(case):
    """``out.sum(1)`` (how a potential adds the streams) hands the backward a stride-0
    broadcast over F; the kernels read it through its strides instead of copying it,
    with the same bits as the copied (contiguous) gradient."""
    inputs = helpers.make_inputs(case)
    g_atoms = torch.randn(case.E, case.row, generator=torch.Generator().manual_seed(5))
    grads = []
    for broadcast in (True, False):
        x = [t.detach().clone().requires_grad_(i < 2) for i, t in enumerate(inputs)]
        with mixstack.use_level(1), mixstack.dispatch_log() as log:
            out = mixstack.mixing_stack(*x, **case.kw)
            if broadcast:
                loss_out, g = out.sum(1), g_atoms
            else:
                loss_out, g = out, g_atoms[:, None].expand_as(out).contiguous()
            grads.append(torch.autograd.grad(loss_out, x[:2] if case.apply_alpha else x[:1], g))
        assert log["bwd:relay"] == 1
    for a, b in zip(*grads):
        assert torch.equal(a, b)
