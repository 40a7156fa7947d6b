"""The fused backward through the interpreter: bit-for-bit the relay, and every
dispatch guard of docs/contract.md §4 tested with a winning table entry registered."""

import helpers
import pytest
import torch
from helpers import Case

import mixstack
from mixstack import tuning
from mixstack.stack import launchers
from mixstack.stack.values import Saved, Weights

FUSED = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


def _key(case: Case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F,
                            apply_alpha=case.apply_alpha)


def _run(case, level, *, fused=FUSED, weights=False, seed=0):
    inputs = helpers.make_inputs(case, seed)
    grad_out = helpers.make_grad_out(case, seed + 1)
    with tuning.registration("stack_bwd_fused", _key(case), fused):
        return helpers.run_stack(case, level, inputs, grad_out, weights=weights)


_LEVEL1: dict = {}


def _relay(case):
    """``_run(case, 1)`` (level 1 with FUSED registered: the relay), computed once per test run."""
    if case not in _LEVEL1:
        _LEVEL1[case] = _run(case, 1)
    return _LEVEL1[case]


def _same_bits(a, b):
    return all(torch.equal(a[k], b[k]) for k in a if k != "log")


GUARD_CASE = Case(F=1, E=129, Cf=16, lmax=2, n_layers=2)    # the candidate tiles and the guards below
# FUSED's 16-row tiles over INTERPRETER_PROGRAMS (3) persistent programs: with F = 2 and E = 37, six
# tiles (a partial one per stream), two a program; E = 70 also cuts the relay's 64-row tiles.
BITWISE_CASES = [
    Case(F=2, E=37, Cf=32, lmax=3, n_layers=3),
    Case(F=1, E=70, Cf=64, lmax=2, n_layers=2),
    Case(F=1, E=1, Cf=16, lmax=1, n_layers=2, apply_alpha=False),
    Case(F=2, E=37, Cf=16, lmax=6, n_layers=2),
    Case(F=1, E=33, Cf=16, lmax=2, n_layers=4),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", BITWISE_CASES, ids=helpers.case_id)
def test_fused_backward_is_bitwise_equal_to_the_relay(case):
    relay = _run(case, 1)
    fused = _run(case, 2)
    assert relay["log"] == {"fwd:triton": 1, "bwd:relay": 1}
    assert fused["log"] == {"fwd:triton": 1, "bwd:fused": 1}
    assert _same_bits(relay, fused)


@pytest.mark.parametrize("cfg", [{"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
                                 {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}])
def test_fused_backward_is_bitwise_equal_for_every_candidate_tile(cfg):
    assert _same_bits(_relay(GUARD_CASE), _run(GUARD_CASE, 2, fused=cfg))


def test_fused_backward_allocates_neither_the_sigmoid_nor_the_gz_surface(monkeypatch):
    """The relay allocates an (F, E, ROW) gz surface (and an (F, E, G) sigmoid surface
    where its pointwise kernel does not form the sigmoids itself); the fused backward
    allocates neither (its h is the only (F, E, ROW) buffer)."""
    case = Case(F=1, E=70, Cf=16, lmax=2, n_layers=3)       # more rows than the scratch's 3 x 16
    made = []
    real_new_empty = torch.Tensor.new_empty
    real_empty_like = torch.empty_like

    def new_empty(self, size, *a, **k):
        made.append(tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,))
        return real_new_empty(self, size, *a, **k)

    def empty_like(t, *a, **k):
        made.append(tuple(t.shape))
        return real_empty_like(t, *a, **k)

    inputs = helpers.make_inputs(case)
    u0, alpha, w0, w1, gw = inputs
    weights = Weights(w0, w1, gw)
    out, z, y = launchers.stack_forward(u0, alpha, weights, case.spec)
    grad_out = helpers.make_grad_out(case)
    monkeypatch.setattr(torch.Tensor, "new_empty", new_empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)
    launchers.stack_backward(grad_out, Saved(z, y, alpha), weights, case.spec, launchers.LaunchPlan(fused_cfg=FUSED))
    fused_made = list(made)
    made.clear()
    launchers.stack_backward(grad_out, Saved(z, y, alpha), weights, case.spec)
    relay_made = list(made)
    surface, sig = (case.F, case.E, case.row), (case.F, case.E, case.layout.gate_width)
    # h and gz, and sg unless the relay's pointwise kernel forms the sigmoids itself
    assert relay_made.count(surface) == 2
    assert (sig in relay_made) != launchers.pointwise_recomputes_gate(case.layout)
    assert fused_made.count(surface) == 1 and sig not in fused_made       # h only
    # ... and its per-program scratch is far smaller than a surface at production sizes:
    # programs x BLOCK_M x widest block, independent of E.
    scratch = [s for s in fused_made if len(s) == 3 and s[1] == FUSED["BLOCK_M"]]
    assert scratch and all(s[2] == max(case.layout.m0, case.layout.m1) for s in scratch)


# --- the guards: a winning fused entry is registered in every case below ---


def test_level_1_never_runs_the_fused_backward():
    assert _relay(GUARD_CASE)["log"] == {"fwd:triton": 1, "bwd:relay": 1}


def test_weight_gradients_keep_the_fused_backward_out():
    log = _run(GUARD_CASE, 2, weights=True)["log"]
    assert log.get("bwd:fused", 0) == 0 and log["bwd:relay"] == 1 and log["wgrad:triton"] == 1


def test_create_graph_keeps_the_fused_backward_out():
    case = GUARD_CASE
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    u0.requires_grad_()
    with tuning.registration("stack_bwd_fused", _key(case), FUSED), mixstack.use_level(2), \
            mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, **case.kw)
        (g,) = torch.autograd.grad(out.square().sum(), [u0], create_graph=True)
    assert g.requires_grad
    assert log.get("bwd:fused", 0) == 0 and log["bwd:relay"] == 1 and log.get("bwd:reference", 0) == 0


@pytest.mark.parametrize("cf", [48, 128])
def test_focus_dim_outside_the_regime_keeps_the_relay(cf):
    """48 is not a power of two; 128 is too wide to keep the gate in registers."""
    case = Case(F=1, E=17, Cf=cf, lmax=1, n_layers=2)
    assert tuning.candidates("stack_bwd_fused", _key(case)) == []
    log = _run(case, 2)["log"]
    assert log == {"fwd:triton": 1, "bwd:relay": 1}


def test_a_dtype_other_than_float32_never_reaches_the_kernels():
    case = GUARD_CASE
    inputs = [t.double() for t in helpers.make_inputs(case)]
    with tuning.registration("stack_bwd_fused", _key(case), FUSED):
        res = helpers.run_stack(case, 2, inputs, helpers.make_grad_out(case).double())
    assert res["log"].get("bwd:fused", 0) == 0 and res["log"]["fwd:reference"] == 1


def test_an_entry_of_none_keeps_the_relay():
    assert _run(GUARD_CASE, 2, fused=None)["log"] == {"fwd:triton": 1, "bwd:relay": 1}


def test_no_entry_keeps_the_relay():
    inputs = helpers.make_inputs(GUARD_CASE)
    with tuning.saved_registrations():
        tuning.unregister("stack_bwd_fused", _key(GUARD_CASE))
        assert tuning.lookup("stack_bwd_fused", _key(GUARD_CASE)) is tuning.MISSING
        res = helpers.run_stack(GUARD_CASE, 2, inputs, helpers.make_grad_out(GUARD_CASE))
    assert res["log"] == {"fwd:triton": 1, "bwd:relay": 1}


@pytest.mark.slow
def test_the_benchs_fused_variant_runs_the_fused_backward_and_only_there():
    """``mixstack bench --levels 2,2f``: L2 keeps the relay (no entry), L2-fused runs the
    fused kernel with the same errors (same bits), and no registration outlives the run."""
    from mixstack.bench import stack_bench
    from mixstack.measure.shapes import BenchShape
    shape = BenchShape("tiny", edges=37, focus=2, focus_dim=16, lmax=2, layers=3)
    key = tuning.shape_key(focus_dim=16, lmax=2, n_focus=2, apply_alpha=True)
    with tuning.saved_registrations():
        tuning.unregister("stack_bwd_fused", key)
        rec = stack_bench.run_bench(stack_bench.BenchConfig(shapes=(shape,), variants=("2", "2f"), passes=("bwd",),
                                                  rounds=1, warmup=0, device="cpu", roof_n=64))
        assert tuning.lookup("stack_bwd_fused", key) is tuning.MISSING
    l2, fused = rec["shapes"][0]["variants"]
    assert "bwd:relay" in l2["dispatch"] and "bwd:fused" not in l2["dispatch"]
    assert "bwd:fused" in fused["dispatch"] and "bwd:relay" not in fused["dispatch"], fused
    assert fused["note"] is None and not fused["failed"]
    assert fused["rel_error"] == l2["rel_error"]
    assert {t["variant"] for t in rec["timings"]} == {"L2", "L2-fused"}
