"""The training paths on the CPU, in float64: the double-backward formulas against autograd of the
reference, the operators' autograd wiring (cotangents of z and y, the chain, the engine's say on
weight gradients) under gradcheck and against the float64 oracle, opcheck of the new operator,
and a negative control.  The kernels themselves are tested in tests/interpret and tests/gpu."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case

import mixstack
from mixstack.stack import reference

CASES = [
    Case(F=2, E=5, Cf=3, lmax=1, n_layers=1, apply_alpha=True),     # identity layer only
    Case(F=1, E=4, Cf=4, lmax=2, n_layers=3, apply_alpha=False),
    Case(F=3, E=7, Cf=2, lmax=6, n_layers=2, apply_alpha=True),
    Case(F=2, E=6, Cf=5, lmax=3, n_layers=4, apply_alpha=True),
]
NAMES = ("grad_out", "y", "z", "alpha", "w0", "w1", "gw")


def _autograd_double_backward(case, inputs, grad_out, v, w):
    """The partial derivatives of ``<grad_u0, v> + <grad_alpha, w>`` with respect to the backward's
    inputs (``z`` and ``y`` held as inputs), by autograd of ``reference.backward``."""
    u0, alpha, w0, w1, gw = inputs
    _, z, y = reference.forward_state(*inputs, **case.kw)
    leaves = [t.detach().clone().requires_grad_() for t in (grad_out, y, z, alpha, w0, w1, gw)]
    g, ga, *_ = reference.backward(leaves[0], leaves[1], leaves[2], None, *leaves[3:], **case.kw)
    loss = ((g * v).sum() if v is not None else 0) + ((ga * w).sum() if case.apply_alpha and w is not None else 0)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


@pytest.mark.parametrize("with_v, with_w", [(True, True), (True, False), (False, True)], ids=["v+w", "v", "w"])
@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_the_double_backward_formulas_match_autograd(case, with_v, with_w):
    if not (with_v or case.apply_alpha):
        pytest.skip("without alpha there is no grad_alpha for w to weigh")
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    v, w, _ = helpers.training_cotangents(case, dtype=torch.float64)
    v, w = (v if with_v else None), (w if with_w else None)
    _, z, y = reference.forward_state(*inputs, **case.kw)
    got = reference.double_backward(v, w, grad_out, y, z, *inputs[1:], **case.kw)
    want = _autograd_double_backward(case, inputs, grad_out, v, w)
    for name, g, ref in zip(NAMES, got, want):
        if ref is None or not ref.any():
            assert g is None or not g.any(), name
            continue
        torch.testing.assert_close(g, ref, rtol=1e-10, atol=1e-12, msg=f"d/d{name}")


def test_a_wrong_second_derivative_of_silu_fails_against_autograd(monkeypatch):
    """Negative control: SiLU'' without its ``s (1 - 2 s0)`` term."""
    case = CASES[3]
    monkeypatch.setattr(reference, "_silu_curvature", lambda s: 2 * torch.sigmoid(s) * (1 - torch.sigmoid(s)))
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    v, w, _ = helpers.training_cotangents(case, dtype=torch.float64)
    _, z, y = reference.forward_state(*inputs, **case.kw)
    got = reference.double_backward(v, w, grad_out, y, z, *inputs[1:], **case.kw)
    want = _autograd_double_backward(case, inputs, grad_out, v, w)
    assert helpers.rel_err(got[2], want[2]) > 1e-3


def _backward_op(case):
    def fn(grad_out, y, z, alpha, w0, w1, gw):
        return torch.ops.mixstack.stack_backward(grad_out, y, z, alpha, [w0, w1, gw], case.op_spec(1),
                                                 [False, False], None, None, None)[:2]
    return fn


@pytest.mark.parametrize("case", [Case(F=2, E=3, Cf=2, lmax=1, n_layers=2, apply_alpha=True),
                                  Case(F=1, E=2, Cf=2, lmax=2, n_layers=3, apply_alpha=False)], ids=helpers.case_id)
def test_the_backward_operator_passes_gradcheck_through_its_double_backward(case):
    """``stack_backward`` as a function of all its tensor inputs, ``z`` and ``y`` free: its autograd
    (``stack_double_backward``, reference formulas on the CPU) against finite differences."""
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    _, z, y = reference.forward_state(*inputs, **case.kw)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    x = [t.detach().clone().requires_grad_() for t in (grad_out, y, z, *inputs[1:])]
    if not case.apply_alpha:
        x[1] = torch.zeros(0, dtype=torch.float64)            # y is empty without alpha
    with mixstack.dispatch_log() as log:
        assert torch.autograd.gradcheck(_backward_op(case), x)
    assert log["bwd:reference"] > 0


@pytest.mark.parametrize("energy", [True, False], ids=["energy+forces", "forces"])
@pytest.mark.parametrize("case", CASES[1:], ids=helpers.case_id)
def test_the_operators_training_step_matches_autograd_of_the_reference(case, energy):
    """The force-training pattern through ``mixstack::stack_forward`` (CPU branches: the reference
    formulas, the double backward's among them), every input and the incoming gradient, against
    autograd of the reference differentiated twice, in float64."""
    inputs = helpers.make_inputs(case, dtype=torch.float64)
    grad_out = helpers.make_grad_out(case, dtype=torch.float64)
    cot = helpers.training_cotangents(case, dtype=torch.float64)
    if not energy:                                  # the result gets no cotangent of its own
        cot = cot[:2] + (None,)
    want = helpers.training_step64(case, inputs, grad_out, cot)
    x = [t.clone().requires_grad_() for t in inputs]
    go = grad_out.clone().requires_grad_()

    def op(*args, lmax, focus_dim, apply_alpha):
        return torch.ops.mixstack.stack_forward(*args, lmax, focus_dim, apply_alpha, 1)[0]
    got = helpers.training_step(op, case, x, go, *cot)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-10, atol=1e-12, msg=f"d/d{name}")


def test_the_force_pass_asks_the_engine_and_computes_no_weight_gradient(monkeypatch):
    """``autograd.grad(out, u0, create_graph=True)`` with weights that require grad: the backward
    computes no weight gradient (the engine will not use one) and keeps its chain; the loss's
    backward then computes them."""
    case = CASES[3]
    calls = []
    real = reference.backward_state

    def spy(*args, **kwargs):
        calls.append(kwargs["weight_grads"])
        return real(*args, **kwargs)
    monkeypatch.setattr(reference, "backward_state", spy)
    x = [t.requires_grad_() for t in helpers.make_inputs(case, dtype=torch.float64)]
    out = torch.ops.mixstack.stack_forward(*x, *case.op_args, 1)[0]
    (g,) = torch.autograd.grad(out, x[0], torch.ones_like(out), create_graph=True)
    assert calls == [False]
    g.square().sum().backward()
    assert True in calls and all(t.grad is not None for t in x)


def test_opcheck_stack_double_backward():
    case = Case(F=2, E=5, Cf=16, lmax=2, n_layers=2)
    inputs = helpers.make_inputs(case)
    _, z, y = torch.ops.mixstack.stack_forward(*inputs, *case.op_args, 1)
    grad_out = helpers.make_grad_out(case)
    v, w, _ = helpers.training_cotangents(case)
    chain = torch.ops.mixstack.stack_backward(grad_out, y, z, inputs[1], list(inputs[2:]), case.op_spec(1),
                                              [False, True], None, None, None)[5]
    torch.library.opcheck(torch.ops.mixstack.stack_double_backward,
                          (v, w, grad_out, y, z, chain, inputs[1], list(inputs[2:]), case.op_spec(1),
                           [True, True, True]))
