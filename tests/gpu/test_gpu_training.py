"""Training on the kernels on a CUDA GPU: weight gradients and the double backward against float64,
bit for bit run to run, level 2 bitwise equal to level 1 whatever the tuned configs, level 3
within its contract, and the potential's training step end to end.  Skipped without CUDA."""

from __future__ import annotations

import copy

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel

from mixstack import tuning
from mixstack.tuning.families import CONTRACT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
CASES = [
    Case(F=2, E=20001, Cf=32, lmax=3, n_layers=4, apply_alpha=True),    # S1-like, ten wgrad chunks
    Case(F=1, E=4099, Cf=64, lmax=3, n_layers=4, apply_alpha=True),     # S4-like
    Case(F=3, E=4097, Cf=48, lmax=2, n_layers=2, apply_alpha=False),    # padded tiles, no alpha
    Case(F=2, E=1, Cf=32, lmax=6, n_layers=3, apply_alpha=True),        # one edge, lmax 6
]
EXACT = (("stack_fwd", {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}),
         ("stack_bwd_relay", {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}),
         ("stack_wgrad", {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}))
COMPENSATED = (("stack_compensated", {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}),
               ("stack_wgrad_compensated", {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}))


def _key(case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _data(case):
    return (helpers.make_inputs(case, device=DEV), helpers.make_grad_out(case, device=DEV),
            helpers.training_cotangents(case, device=DEV))


def _step(case, level, registered=()):
    inputs, grad_out, cot = _data(case)
    with tuning.saved_registrations():
        for fam, cfg in registered:
            tuning.register(fam, _key(case), cfg)
        return helpers.run_training_step(case, level, inputs, grad_out, cot)


def _same_bits(a, b):
    return [k for k in a if k != "log" and not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_level1_training_step_matches_float64_and_repeats_bit_for_bit(case):
    got = _step(case, 1)
    want = helpers.training_step64(case, *_data(case))
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2}, got["log"]
    for name, g in want.items():
        assert_close_rel(got[name], g, f"d loss / d {name}")
    assert _same_bits(got, _step(case, 1)) == []


@pytest.mark.parametrize("case", CASES[:3], ids=helpers.case_id)
def test_gpu_level2_is_bitwise_level1_whatever_the_tuned_configs(case):
    one, two = _step(case, 1), _step(case, 2, EXACT)
    assert two["log"]["cfg:stack_wgrad"] == 2
    assert _same_bits(one, two) == []


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_level3_training_step_is_within_the_contract(case):
    got = _step(case, 3, COMPENSATED)
    want = helpers.training_step64(case, *_data(case))
    assert got["log"]["bwd2:compensated"] == 1 and got["log"]["wgrad:compensated"] == 2, got["log"]
    errs = {name: helpers.rel_err(got[name], g) for name, g in want.items()}
    assert all(e <= CONTRACT for e in errs.values()), errs
    assert _same_bits(got, _step(case, 3, COMPENSATED)) == []


def test_gpu_the_compensated_weight_reduction_keeps_the_contract_at_extreme_scales():
    from mixstack.stack import training
    lay = Case(F=1, E=1, Cf=32, lmax=3, n_layers=2).layout
    g = torch.Generator(device=DEV).manual_seed(5)
    n = 9001
    a = torch.randn(1, 1, n, lay.row, generator=g, device=DEV) * 1e-6
    b = torch.randn(1, n, lay.row, generator=g, device=DEV) * 1e4
    a[0, 0, 17] *= 1e3                                        # rows of different sizes
    b[0, 33] *= 1e-3
    dw0 = torch.empty(1, 1, lay.m0, lay.m0, device=DEV)
    dw1 = torch.empty(1, 1, lay.m1, lay.m1, device=DEV)
    plan = training.WgradPlan(dict(COMPENSATED[1][1]), compensated=True)
    training._Reductions(b, n, 1, lay, plan).blocks(a, 0, b, dw0, dw1, 0)
    a64, b64 = a[0, 0].double(), b[0].double()
    assert helpers.rel_err(dw0[0, 0], a64[:, :lay.m0].T @ b64[:, :lay.m0]) <= CONTRACT
    assert helpers.rel_err(dw1[0, 0], a64[:, lay.m0:].T @ b64[:, lay.m0:]) <= CONTRACT


def test_gpu_potential_training_step_runs_the_stack_kernels_and_matches_float64():
    pytest.importorskip("ase")
    from ase.build import bulk

    import mixstack
    from mixstack.potential import SO2Potential, atoms_inputs
    model = SO2Potential(lmax=3, focus_dim=32, n_focus=2, cutoff=4.0, seed=1, energy_scale=10.0,
                         device=DEV).train()
    model64 = copy.deepcopy(model).double()
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=2)

    def step(m, level, dtype):
        inputs = atoms_inputs(atoms, m.cutoff, device=DEV, dtype=dtype)
        m.zero_grad()
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            energy, forces, _, _ = m(*inputs)
            ((energy - 1.0) ** 2 + (forces ** 2).sum()).backward()
        return {n: p.grad for n, p in m.named_parameters()}, dict(log)

    got, log = step(model, 2, torch.float32)
    want, _ = step(model64, 0, torch.float64)
    assert log.get("bwd:reference", 0) == 0 and log["bwd2:triton"] == 2 and log["wgrad:triton"] == 4, log
    for name, g in got.items():
        assert_close_rel(g, want[name], name, tol=2e-5)
