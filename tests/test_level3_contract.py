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


def _split_product(a, w, tail=1.0):
    """``a @ w`` as level 3's products form it (docs/contract.md §3), a test oracle in torch: each
    row of ``a`` and the whole ``w`` scaled into [1, 2) by powers of two, split into an fp16 head and
    a 2^11-scaled fp16 tail, the head product and the two tail products in float32 (each fp16
    product exact in it); ``tail`` scales the tail products (1: as the kernels do)."""
    def scaled(x, amax):
        _, e = torch.frexp(amax)
        return torch.ldexp(x, 1 - e), torch.ldexp(torch.ones_like(amax), e - 1)

    def split(x):
        hi = x.half().float()
        return hi, ((x - hi) * 2048).half().float()

    a_s, a_up = scaled(a, a.abs().amax(-1, keepdim=True))
    w_s, w_up = scaled(w, w.abs().amax())
    (a_hi, a_lo), (w_hi, w_lo) = split(a_s), split(w_s)
    return (a_hi @ w_hi + tail * (a_hi @ w_lo + a_lo @ w_hi) / 2048) * a_up * w_up


def _worst(got, ref, scale):
    """The largest ``|got - ref| / scale``: how far the contract's scaled check is from failing."""
    return ((got.double() - ref).abs() / scale).max().item()


def test_compensated_rows_are_accepted_where_exact_fp32_is_and_a_wrong_tail_product_is_refused():
    """16 rows of a 128-wide product whose grad_alpha sums cancel to 1e-4 of their scale: exact
    float32 and the split product are each far above 2e-6 relative yet within 1/10 of the bound on
    the scale; the split product with its tail products dropped or doubled is 10x past it."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 128, generator=g, dtype=torch.float64).float()
    w = (torch.randn(128, 128, generator=g, dtype=torch.float64) / 128 ** 0.5).float()
    y64 = a.double() @ w.double()
    grad_out = helpers.cancelling_grad_out(torch.randn(16, 128, generator=g).float(), y64, 1e-4)
    ref, scale = (grad_out.double() * y64).sum(-1), dot_scale(grad_out, y64)

    def alpha_grad(y):
        return (grad_out * y).sum(-1)

    for y in (a @ w, _split_product(a, w)):
        got = alpha_grad(y)
        assert helpers.rel_err(got, ref) > 20 * CONTRACT                  # the sums cancel as built
        assert _worst(got, ref, scale) < CONTRACT / 10
        assert contract_difference((ref,), (got,), scales=(scale,)) is None
    for tail in (0.0, 2.0):
        bad = alpha_grad(_split_product(a, w, tail))
        assert _worst(bad, ref, scale) > 10 * CONTRACT
        why = contract_difference((ref,), (bad,), scales=(scale,))
        assert why is not None and "of the sum of its terms' absolute values" in why


def test_well_conditioned_outputs_keep_2e6_relative():
    """The upstream gradient equal to the unscaled result: no grad_alpha sum cancels (each equals its
    scale), so the scaled check is the relative one there; 3e-6 relative fails every output, 1e-6
    passes."""
    inputs = helpers.make_inputs(CASE)
    y64 = _unscaled64(CASE, inputs)
    grad_out = y64.float()
    ref = _outputs(CASE, inputs, grad_out, torch.float64)
    scales = (None, None, dot_scale(grad_out, y64))
    assert torch.allclose(ref[2], scales[2], rtol=1e-12)                 # no cancellation
    for i, name in enumerate(NAMES):
        for off, fails in ((3e-6, True), (1e-6, False)):
            got = tuple((r * (1 + off) if j == i else r).float() for j, r in enumerate(ref))
            why = contract_difference(ref, got, scales=scales, names=NAMES)
            assert (why is not None) == fails, (name, off, why)
            if fails:
                assert why.startswith(f"output {i} ({name}):") and "above the contract 2e-06" in why


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
