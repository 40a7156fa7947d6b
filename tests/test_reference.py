"""The reference (level 0, the oracle of every other test) and the custom operator's
CPU branch, in float64: against docs/contract.md §1 written out independently, against
autograd, and under gradcheck / gradgradcheck."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case

import mixstack

# Tiny shapes; Cf need not be a multiple of 16 on the reference path.
GRAD_CASES = [
    Case(F=2, E=5, Cf=3, lmax=1, n_layers=1, apply_alpha=True),     # identity layer only
    Case(F=1, E=4, Cf=4, lmax=2, n_layers=3, apply_alpha=False),
    Case(F=3, E=7, Cf=2, lmax=6, n_layers=2, apply_alpha=True),
    Case(F=2, E=6, Cf=5, lmax=3, n_layers=4, apply_alpha=True),
]
CHECK_CASES = [                                                     # gradcheck-sized
    Case(F=2, E=3, Cf=2, lmax=1, n_layers=2, apply_alpha=True),
    Case(F=1, E=2, Cf=2, lmax=2, n_layers=1, apply_alpha=False),
]


def _spec_forward(u0, alpha, w0, w1, gw, lmax, cf, apply_alpha):
    """docs/contract.md §1 transcribed per focus stream and per subtile (independent of mixstack.reference)."""
    n_focus, n_edges, row = u0.shape
    m0 = (lmax + 1) * cf
    n_gated = w0.shape[0] - 1
    result = u0.new_empty((n_edges, n_focus, row))
    ys = u0.new_empty((n_edges, n_focus, row))
    zs = u0.new_zeros((n_gated, n_focus, n_edges, row))

    def sub(r):                                    # columns of subtile r of a full row
        return slice(r * cf, (r + 1) * cf)

    for f in range(n_focus):
        u = u0[f]
        for k in range(n_gated):
            z = torch.cat((u[:, :m0] @ w0[k, f], u[:, m0:] @ w1[k, f]), 1)
            zs[k, f] = z
            s = z[:, sub(0)]
            sg = torch.sigmoid(s @ gw[k, f])
            a = torch.zeros_like(u)
            a[:, sub(0)] = s * torch.sigmoid(s)
            for ell in range(1, lmax + 1):
                gate = sg[:, (ell - 1) * cf:ell * cf]
                for r in (ell, lmax + ell, 2 * lmax + ell):       # m = 0, m = -1, m = +1 of degree l
                    a[:, sub(r)] = z[:, sub(r)] * gate
            u = u + a
        y = u + torch.cat((u[:, :m0] @ w0[n_gated, f], u[:, m0:] @ w1[n_gated, f]), 1)
        result[:, f] = y * alpha[:, f:f + 1] if apply_alpha else y
        ys[:, f] = y
    return result, zs, ys


@pytest.mark.parametrize("case", GRAD_CASES, ids=helpers.case_id)
def test_reference_forward_matches_spec_formulas(case):
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    out, z, y = mixstack.reference.forward_state(*inputs, **case.kw)
    want_out, want_z, want_y = _spec_forward(*inputs, case.lmax, case.Cf, case.apply_alpha)
    assert out.shape == y.shape == (case.E, case.F, case.row)
    assert z.shape == (case.n_layers - 1, case.F, case.E, case.row)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(z, want_z, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(mixstack.reference.forward(*inputs, **case.kw), (out, z)))
    torch.testing.assert_close(mixstack.reference.mixing_stack(*inputs, **case.kw), want_out,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", GRAD_CASES, ids=helpers.case_id)
def test_reference_backward_formulas_match_autograd(case):
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    _, want = helpers.reference64(case, inputs, grad_out, wrt=helpers.INPUT_NAMES)
    _, z, y = mixstack.reference.forward_state(*inputs, **case.kw)
    got = mixstack.reference.backward(grad_out, y, z, *inputs, weights=True, **case.kw)
    for name, g in zip(helpers.INPUT_NAMES, got):
        if name == "alpha" and not case.apply_alpha:
            assert g is None
            continue
        assert g.shape == want[name].shape, name
        torch.testing.assert_close(g, want[name], rtol=1e-10, atol=1e-12, msg=f"grad_{name}")


@pytest.mark.parametrize("case", GRAD_CASES[:2], ids=helpers.case_id)
def test_reference_backward_without_weights_gives_same_u0_grad_and_no_weight_grads(case):
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    _, z, y = mixstack.reference.forward_state(*inputs, **case.kw)
    full = mixstack.reference.backward(grad_out, y, z, *inputs, weights=True, **case.kw)
    light = mixstack.reference.backward(grad_out, y, z, None, *inputs[1:], weights=False, **case.kw)
    assert torch.equal(light[0], full[0])
    assert light[2:] == (None, None, None)


def test_reference_backward_grad_alpha_is_right_where_alpha_is_zero():
    """grad_alpha = sum_c g * y (docs/contract.md §1) must not depend on alpha being non-zero.
    The custom op's backward uses these formulas on CPU (and the relay mirrors them)."""
    case = Case(F=2, E=4, Cf=2, lmax=1, n_layers=2, apply_alpha=True)
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, dtype=torch.float64)
    alpha = alpha.clone()
    alpha[1, 0] = 0.0
    inputs = (u0, alpha, w0, w1, gw)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    _, want = helpers.reference64(case, inputs, grad_out)
    _, z, y = mixstack.reference.forward_state(*inputs, **case.kw)
    grad_alpha = mixstack.reference.backward(grad_out, y, z, *inputs, **case.kw)[1]
    assert torch.isfinite(grad_alpha).all(), grad_alpha
    torch.testing.assert_close(grad_alpha, want["alpha"])


def _leaves(case, names=helpers.INPUT_NAMES):
    return [t.requires_grad_(n in names)
            for n, t in zip(helpers.INPUT_NAMES, helpers.make_inputs(case, dtype=torch.float64))]


@pytest.mark.parametrize("case", CHECK_CASES, ids=helpers.case_id)
def test_level0_mixing_stack_passes_gradcheck_and_gradgradcheck(case):
    x = _leaves(case)

    def fn(*args):
        with mixstack.use_level(0):
            return mixstack.mixing_stack(*args, **case.kw)

    assert torch.autograd.gradcheck(fn, x)
    assert torch.autograd.gradgradcheck(fn, x)


def _op(case, level=1):
    def fn(*args):
        return torch.ops.mixstack.stack_forward(*args, *case.op_args, level)[0]
    return fn


@pytest.mark.parametrize("case", CHECK_CASES, ids=helpers.case_id)
def test_custom_op_cpu_relay_gradients_pass_gradcheck(case):
    """Only u0 and alpha require grad: the op's backward (stack_backward), whose CPU
    branch runs the reference formulas and says so."""
    x = _leaves(case, names=("u0", "alpha"))
    with mixstack.dispatch_log() as log:
        assert torch.autograd.gradcheck(_op(case), x)
    assert log["bwd:reference"] > 0 and log["bwd:relay"] == 0 and log["bwd:fused"] == 0


@pytest.mark.parametrize("case", CHECK_CASES, ids=helpers.case_id)
def test_custom_op_cpu_weight_gradients_pass_gradcheck(case):
    x = _leaves(case)
    with mixstack.dispatch_log() as log:
        assert torch.autograd.gradcheck(_op(case), x)
    assert log["bwd:reference"] > 0 and log["bwd:relay"] == 0


@pytest.mark.parametrize("case", CHECK_CASES, ids=helpers.case_id)
def test_custom_op_cpu_double_backward_passes_gradgradcheck(case):
    assert torch.autograd.gradgradcheck(_op(case), _leaves(case))


def test_custom_op_cpu_force_double_backward_with_constant_weights_passes_gradgradcheck():
    case = CHECK_CASES[0]
    assert torch.autograd.gradgradcheck(_op(case), _leaves(case, names=("u0", "alpha")))


def _saved_sizes(fn):
    """Shapes of the tensors autograd saves while ``fn`` runs."""
    sizes = []

    def pack(t):
        sizes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sizes, out


@pytest.mark.parametrize("weights_grad", [False, True], ids=["inference", "weight-grads"])
def test_keep_input_false_saves_u0_only_when_a_weight_gradient_needs_it(weights_grad):
    case = CHECK_CASES[0]
    x = _leaves(case, names=helpers.INPUT_NAMES if weights_grad else ("u0", "alpha"))
    grads = {}
    for keep in (True, False):
        sizes, out = _saved_sizes(
            lambda: torch.ops.mixstack.stack_forward(*x, *case.op_args, 1, keep)[0])
        u0_saved = sizes.count(tuple(x[0].shape))
        assert u0_saved == (1 if keep or weights_grad else 0), (keep, sizes)
        wanted = [t for t in x if t.requires_grad]
        grads[keep] = torch.autograd.grad(out, wanted, torch.ones_like(out))
    for a, b in zip(grads[True], grads[False]):
        assert torch.equal(a, b)


def test_keep_input_false_still_takes_a_double_backward_which_needs_no_u0():
    """The double backward reads the saved z and y and the chain, never u0 (docs/contract.md §1):
    with keep_input=False and constant weights it runs and gives keep_input=True's values."""
    case = CHECK_CASES[0]
    got = {}
    for keep in (False, True):
        x = _leaves(case, names=("u0", "alpha"))
        out = torch.ops.mixstack.stack_forward(*x, *case.op_args, 1, keep)[0]
        (g,) = torch.autograd.grad(out, x[0], torch.ones_like(out), create_graph=True)
        got[keep] = torch.autograd.grad(g.square().sum(), x[:2])
    for a, b in zip(got[False], got[True]):
        assert torch.equal(a, b)
