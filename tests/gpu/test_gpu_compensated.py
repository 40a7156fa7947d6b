"""Level 3 on a CUDA GPU: every compensated candidate config meets the float64
contract (2e-6) at partial-tile edge counts, and at extreme input scales.
Registers each config for the test's key (no table is needed).  Skipped
without CUDA."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case

from mixstack import tuning
from mixstack.tuning.families import CONTRACT, GEMM_FIELDS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
CASES = [Case(F=2, E=4099, Cf=32, lmax=3, n_layers=4), Case(F=1, E=129, Cf=64, lmax=3, n_layers=4),
         Case(F=2, E=1, Cf=32, lmax=6, n_layers=3)]


def _key(case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _check(case, cfg, scale=1.0):
    inputs = list(helpers.make_inputs(case, device=DEV))
    inputs[0] = inputs[0] * scale
    grad_out = helpers.make_grad_out(case, device=DEV)
    with tuning.registration("stack_compensated", _key(case), cfg):
        got = helpers.run_stack(case, 3, inputs, grad_out)
    assert got["log"] == {"fwd:compensated": 1, "bwd:compensated": 1}
    out64, grads64 = helpers.reference64(case, inputs, grad_out)
    errs = {"out": helpers.rel_err(got["out"], out64)}
    errs.update({n: helpers.rel_err(got[f"grad_{n}"], g) for n, g in grads64.items()})
    return errs


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_every_compensated_candidate_meets_the_contract(case):
    for cfg in tuning.candidates("stack_compensated", _key(case)):
        errs = _check(case, cfg)
        assert max(errs.values()) <= CONTRACT, (tuning.families.label(cfg), errs)


@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_compensated_at_extreme_input_scales_is_no_worse_than_fp32(scale):
    case = CASES[0]
    cfg = tuning.candidates("stack_compensated", _key(case))[0]
    inputs = list(helpers.make_inputs(case, device=DEV))
    inputs[0] = inputs[0] * scale
    grad_out = helpers.make_grad_out(case, device=DEV)
    fp32 = helpers.run_stack(case, 2, inputs, grad_out)
    out64, grads64 = helpers.reference64(case, inputs, grad_out)
    base = max([helpers.rel_err(fp32["out"], out64)] +
               [helpers.rel_err(fp32[f"grad_{n}"], g) for n, g in grads64.items()])
    errs = _check(case, cfg, scale)
    assert max(errs.values()) <= max(CONTRACT, 4 * base), (errs, base)


@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_gpu_the_tma_gemms_meet_the_contract_and_match_the_pointer_kernel(case):
    """Every TMA candidate that this Triton builds: within the float64 contract, and the pointer
    kernel's bits at the same tile (same K order and split; the schedule may differ only in
    how tiles arrive).  A candidate that does not build is skipped, as the sweep does."""
    from mixstack.tuner.sweep import build_reason, resource_reason
    inputs = list(helpers.make_inputs(case, device=DEV))
    grad_out = helpers.make_grad_out(case, device=DEV)
    built = 0
    # every candidate at the first case, the quick set (tiled and persistent) at the others
    for cfg in tuning.candidates("stack_compensated_tma", _key(case), quick=case is not CASES[0]):
        tile = {f: cfg[f] for f in GEMM_FIELDS}                  # the pointer kernel at the same tile
        with tuning.registration("stack_compensated", _key(case), tile):
            pointer = helpers.run_stack(case, 3, inputs, grad_out)
            try:
                with tuning.registration("stack_compensated_tma", _key(case), cfg):
                    tma = helpers.run_stack(case, 3, inputs, grad_out)
            except Exception as exc:          # noqa: BLE001 - a build refusal is a skip, anything else fails
                if build_reason(exc) or resource_reason(exc):
                    continue
                raise
        built += 1
        assert tma["log"].get("level3:tma") == 2
        for name in pointer:
            if name != "log":
                assert torch.equal(pointer[name], tma[name]), (tuning.families.label(cfg), name)
    if not built:
        pytest.skip("no TMA candidate builds with this Triton on this GPU")
