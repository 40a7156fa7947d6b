"""The relay's pointwise kernel may form the gate sigmoids itself instead of reading a
sigmoid surface a separate gate launch wrote (``launchers.pointwise_recomputes_gate``).
That is a schedule, not new math: both go through ``gate.gate_sigmoids``, so ``gz``,
its recorded row maxima and the whole backward have the same bits either way, exact and
at level 3, on partial tiles and with padded register columns (Cf = 48)."""

import helpers
import pytest
import torch
from helpers import Case

from mixstack.stack import launchers
from mixstack.stack.values import Saved, Weights

CASES = [Case(F=2, E=37, Cf=32, lmax=2, n_layers=3), Case(F=1, E=1, Cf=48, lmax=1, n_layers=2),
         Case(F=1, E=70, Cf=64, lmax=2, n_layers=2)]       # Cf 64: the pointwise kernel's 64-row tiles, 2


@pytest.mark.parametrize("compensated", [False, True], ids=["exact", "level3"])
@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_the_pointwise_kernels_own_sigmoids_give_the_relays_bits(case, compensated):
    lay = case.layout
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, 0)
    _, z, _ = launchers.stack_forward(u0, alpha, Weights(w0, w1, gw), case.spec)
    gate_split = launchers.split_matrices(gw) if compensated else None
    h = torch.randn(case.F, case.E, lay.row, generator=torch.Generator().manual_seed(1))
    results = []
    for fold in (False, True):
        sg = None if fold else torch.full((case.F, case.E, lay.gate_width), float("nan"))
        gz = torch.full_like(h, float("nan"))
        amax = torch.full((case.F, case.E, 2), -1.0) if compensated else None
        launchers.relay_gz(h, z, gw, 0, lay, sg, gz, amax=amax, gate_split=gate_split,
                           fold=fold)
        results.append((gz, amax))
    (gz_surface, amax_surface), (gz_fold, amax_fold) = results
    assert not gz_fold.isnan().any()
    assert torch.equal(gz_fold, gz_surface)
    if compensated:
        assert torch.equal(amax_fold, amax_surface)


# Level 3's whole backward in the full suite (each kernel's fold at level 3 is in the test above).
@pytest.mark.parametrize("compensated", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["exact", "level3"])
def test_the_whole_backward_is_the_same_with_or_without_the_sigmoid_surface(monkeypatch, compensated):
    case = CASES[0]
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, 2)
    weights, plan = Weights(w0, w1, gw), launchers.LaunchPlan(compensated=compensated)
    out, z, y = launchers.stack_forward(u0, alpha, weights, case.spec, plan)
    grad_out = torch.randn_like(out)
    grads = {}
    for fold in (False, True):
        monkeypatch.setattr(launchers, "pointwise_recomputes_gate", lambda layout, compensated=False, fold=fold: fold)
        grads[fold] = launchers.stack_backward(grad_out, Saved(z, y, alpha), weights, case.spec, plan)
    assert torch.equal(grads[True][0], grads[False][0])
    assert torch.equal(grads[True][1], grads[False][1])
