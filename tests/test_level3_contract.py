"""Level 3's float64 contract (``families.contract_difference``, docs/contract.md §3): the result
and ``grad_u0`` within 2e-6 relative, every ``grad_alpha`` element within 2e-6 of the sum of its
terms' absolute values, every element finite.  Plain PyTorch on the CPU: float32 rounding comes
from the reference formulas in float32; the kernels' side runs in
tests/interpret/test_interp_level3.py."""

import helpers
import pytest
import torch
from helpers import Case

from mixstack.stack import reference
from mixstack.tuning.families import CONTRACT, contract_difference, dot_scale

CASE = Case(F=2, E=1, Cf=16, lmax=3, n_layers=3)       # one edge: grad_alpha is two sums over a row
NAMES = ("result", "grad_u0", "grad_alpha")


def _outputs(case, inputs, grad_out, dtype):
    """``(result, grad_u0, grad_alpha)`` of the reference formulas in ``dtype``."""
    x = [t.detach().to(dtype) for t in inputs]
    x[0].requires_grad_(True)
    x[1].requires_grad_(True)
    out = reference.mixing_stack(*x, **case.kw)
    return (out.detach(),) + torch.autograd.grad(out, x[:2], grad_out.to(dtype))


def _unscaled64(case, inputs):
    """The float64 reference's result before alpha, ``y (E, F, ROW)``."""
    x = [t.double() for t in inputs]
    return reference.forward_state(*x, lmax=case.lmax, focus_dim=case.Cf, apply_alpha=False)[2]


def _checked(case=CASE, ratio=None):
    """Float64 and float32 outputs, and the contract's scales, on ``case``; with ``ratio`` the
    upstream gradient makes every grad_alpha sum cancel to that fraction of its scale."""
    inputs, grad_out = helpers.make_inputs(case), helpers.make_grad_out(case)
    y64 = _unscaled64(case, inputs)
    if ratio is not None:
        grad_out = helpers.cancelling_grad_out(grad_out, y64, ratio)
    ref = _outputs(case, inputs, grad_out, torch.float64)
    got = _outputs(case, inputs, grad_out, torch.float32)
    return ref, got, (None, None, dot_scale(grad_out, y64)), (grad_out, y64)


def test_an_ill_conditioned_alpha_gradient_at_float32_rounding_meets_the_contract():
    ref, got, scales, _ = _checked(ratio=1e-3)
    cancel = (ref[2].abs() / scales[2]).max().item()
    assert 5e-4 < cancel < 2e-3                                   # the sums cancel as built
    assert helpers.rel_err(got[2], ref[2]) > CONTRACT             # a relative check fails the float32 reference
    assert contract_difference(ref, got, scales=scales, names=NAMES) is None
    why = contract_difference(ref, got, names=NAMES)              # the relative rule, every output
    assert why.startswith("output 2 (grad_alpha): relative error") and "above the contract 2e-06" in why


def test_a_planted_error_in_grad_u0_or_the_result_still_fails():
    ref, got, scales, _ = _checked(ratio=1e-3)
    for i, name in ((0, "result"), (1, "grad_u0")):
        bad = list(got)
        bad[i] = got[i] * (1 + 1e-4)
        why = contract_difference(ref, tuple(bad), scales=scales, names=NAMES)
        assert why.startswith(f"output {i} ({name}): relative error 0.0001"), why


def test_a_dropped_term_of_the_alpha_sum_fails_even_where_the_sum_cancels():
    ref, got, scales, (grad_out, y64) = _checked(ratio=1e-3)
    bad = got[2] - (grad_out[..., 5] * y64[..., 5]).float()       # one term of each row's sum left out
    why = contract_difference(ref, (got[0], got[1], bad), scales=scales, names=NAMES)
    assert why.startswith("output 2 (grad_alpha): error") and "of the sum of its terms' absolute values" in why
    assert "above the contract 2e-06" in why


def test_an_alpha_gradient_from_a_result_off_by_a_tail_product_fails():
    ref, got, scales, (grad_out, y64) = _checked()
    g = torch.Generator().manual_seed(7)
    signs = torch.randint(0, 2, y64.shape, generator=g).double() * 2 - 1
    y_bad = y64 * (1 + 2.0 ** -11 * signs)                        # y off by a dropped tail product
    bad = (grad_out.double() * y_bad).sum(-1).float()
    why = contract_difference(ref[2:], (bad,), scales=scales[2:])
    assert why is not None and "of the sum of its terms' absolute values" in why


def test_a_relative_alpha_error_of_1e4_fails_on_random_gradients():
    ref, got, scales, _ = _checked(Case(F=2, E=37, Cf=16, lmax=3, n_layers=3))
    assert contract_difference(ref, got, scales=scales) is None
    why = contract_difference(ref, (got[0], got[1], got[2] * (1 + 1e-4)), scales=scales)
    assert why is not None and why.startswith("output 2: error")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_alpha_gradient_fails_whatever_its_scale(value):
    ref, got, scales, _ = _checked(ratio=1e-3)
    bad = got[2].clone()
    bad[0, 1] = value
    why = contract_difference(ref, (got[0], got[1], bad), scales=(None, None, scales[2] * 1e30), names=NAMES)
    assert why == "output 2 (grad_alpha): 1 of 2 values are not finite"


def test_a_sum_of_zero_terms_must_be_exact():
    ref = (torch.zeros(3, 2, dtype=torch.float64),)
    scale = (torch.zeros(3, 2, dtype=torch.float64),)
    assert contract_difference(ref, (torch.zeros(3, 2),), scales=scale) is None
    off = torch.zeros(3, 2)
    off[2, 0] = 1e-30
    assert "at element (2, 0)" in contract_difference(ref, (off,), scales=scale)


def test_scales_must_stand_beside_the_outputs():
    ref, got, scales, _ = _checked()
    with pytest.raises(ValueError, match="2 scales for 3 outputs"):
        contract_difference(ref, got, scales=scales[:2])
