"""The exact levels with their products on the BLAS (``tuning.products``, ``stack.blas``),
forced, through the interpreter: against float64, level 2 (tuned configs, a fused entry) bit for
bit level 1's, run to run, training's weight gradients and double backward, a gradient summed over
the focus streams, and that the route's products are the ones that ran.

On the CPU the BLAS is the host's (its summation order, not ``exact_dot``'s): the bitwise checks
compare two runs of this process, never figures written down elsewhere."""

from __future__ import annotations

import functools

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel, case_id

import mixstack
from mixstack import tuning
from mixstack.stack import gemm, launchers
from mixstack.tuning.products import use_products

CASES = [
    Case(F=2, E=37, Cf=16, lmax=2, n_layers=3, apply_alpha=True),     # partial tile, 2 gated layers, F 2
    Case(F=1, E=9, Cf=48, lmax=1, n_layers=2, apply_alpha=False),     # Cf 48 (a 16-column gate chunk x 3), no alpha
]
TUNED = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
FUSED = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
WGRAD_TUNED = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
LEVEL2 = (("stack_fwd", TUNED), ("stack_bwd_relay", TUNED), ("stack_bwd_fused", FUSED), ("stack_wgrad", WGRAD_TUNED))


def _key(case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _same_bits(a, b):
    return [k for k in a if k != "log" and not torch.equal(a[k], b[k])]


@functools.lru_cache(maxsize=None)
def _runs(case, level):
    """The force path and a training step of ``case`` at ``level`` on the BLAS (level 2 with
    every family registered, the fused backward's too)."""
    inputs, grad_out, cot = helpers.make_inputs(case), helpers.make_grad_out(case), helpers.training_cotangents(case)
    with tuning.saved_registrations(), use_products("blas"):
        if level == 2:
            for fam, cfg in LEVEL2:
                tuning.register(fam, _key(case), dict(cfg))
        force = helpers.run_stack(case, level, inputs, grad_out)
        train = helpers.run_training_step(case, level, inputs, grad_out, cot)
    return force, train


@functools.lru_cache(maxsize=None)
def _want(case):
    inputs, grad_out, cot = helpers.make_inputs(case), helpers.make_grad_out(case), helpers.training_cotangents(case)
    return helpers.reference64(case, inputs, grad_out), helpers.training_step64(case, inputs, grad_out, cot)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_level1_on_the_blas_matches_float64_and_says_so(case):
    force, _ = _runs(case, 1)
    (out, grads), _ = _want(case)
    assert force["log"] == {"fwd:triton": 1, "products:blas": 2, "bwd:relay": 1}
    assert_close_rel(force["out"], out, "forward")
    assert_close_rel(force["grad_u0"], grads["u0"], "grad_u0")
    if case.apply_alpha:
        assert_close_rel(force["grad_alpha"], grads["alpha"], "grad_alpha")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_level2_on_the_blas_keeps_the_relay_and_gives_level1s_bits(case):
    one, two = _runs(case, 1)[0], _runs(case, 2)[0]
    assert two["log"]["bwd:relay"] == 1 and "bwd:fused" not in two["log"]      # the fused GEMM is Triton's
    assert _same_bits(one, two) == []


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_training_on_the_blas_matches_float64_and_level2_bit_for_bit(case):
    one, two = _runs(case, 1)[1], _runs(case, 2)[1]
    _, want = _want(case)
    assert one["log"]["products:blas"] == 4 and one["log"]["wgrad:triton"] == 2 and one["log"]["bwd2:triton"] == 1
    for name, g in want.items():
        assert_close_rel(one[name], g, name, tol=helpers.REL_TOL)
    assert _same_bits(one, two) == []


def test_the_blas_route_is_bitwise_identical_run_to_run():
    case = CASES[0]
    with use_products("blas"):
        again = helpers.run_stack(case, 1, helpers.make_inputs(case), helpers.make_grad_out(case))
    assert _same_bits(_runs(case, 1)[0], again) == []


def test_a_gradient_summed_over_the_focus_streams_reads_a_zero_stride_and_matches_float64():
    case = CASES[0]
    inputs = helpers.make_inputs(case)
    x = [t.clone().requires_grad_() for t in inputs]
    with use_products("blas"), mixstack.use_level(1):
        got = torch.autograd.grad(mixstack.mixing_stack(*x, **case.kw).sum(1).square().sum(), x[:2])
    x64 = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(mixstack.reference.mixing_stack(*x64, **case.kw).sum(1).square().sum(), x64[:2])
    for name, g, w in zip(("grad_u0", "grad_alpha"), got, want):
        assert_close_rel(g, w, name)


def test_the_route_runs_every_product_on_the_blas_and_no_triton_gemm(monkeypatch):
    """Two gated layers and the identity layer: 5 block launches forward, 3 backward, all BLAS;
    the gate's logits twice forward and twice in the relay's recompute, its contraction twice."""
    calls = {"block": 0, "logits": 0, "contraction": 0}

    def counted(name, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(gemm, "block_products", counted("block", gemm.block_products))
    monkeypatch.setattr(launchers, "gate_logits", counted("logits", launchers.gate_logits))
    monkeypatch.setattr(launchers, "add_logit_contraction", counted("contraction", launchers.add_logit_contraction))
    monkeypatch.setattr(gemm, "block_gemm_kernel", None)               # a Triton GEMM launch would fail
    case = CASES[0]
    with use_products("blas"):
        got = helpers.run_stack(case, 1, helpers.make_inputs(case), helpers.make_grad_out(case))
    assert calls == {"block": 8, "logits": 4, "contraction": 2}
    assert _same_bits(_runs(case, 1)[0], got) == []


def test_the_double_backward_recomputes_the_gate_on_the_blas_where_the_backward_did(monkeypatch):
    """A training step on the BLAS: the double backward's relay step forms the gate's logits and
    their contraction on the BLAS too (as the first backward's relay did), and the step still
    matches float64."""
    from mixstack.stack import training

    calls = {"logits": 0, "contraction": 0}
    monkeypatch.setattr(launchers, "gate_logits", _counting(calls, "logits", launchers.gate_logits))
    monkeypatch.setattr(launchers, "add_logit_contraction",
                        _counting(calls, "contraction", launchers.add_logit_contraction))
    assert training.launchers is launchers
    case = CASES[0]
    inputs, grad_out, cot = helpers.make_inputs(case), helpers.make_grad_out(case), helpers.training_cotangents(case)
    with use_products("blas"):
        got = helpers.run_training_step(case, 1, inputs, grad_out, cot)
    # two gated layers: the forward's logits, then each relay's logits and contraction; the double
    # backward's relay adds 2 + 2 (with Triton's gate products there it was 6 and 4)
    assert calls == {"logits": 8, "contraction": 6}
    _, want = _want(case)
    for name, g in want.items():
        assert_close_rel(got[name], g, name, tol=helpers.REL_TOL)


def _counting(calls, name, fn):
    def run(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)
    return run


def test_each_block_weight_reaches_the_blas_in_its_layout_laid_out_once_per_call(monkeypatch):
    """The |m| = 1 block's weight reaches the products as a transposed view (cuBLAS's "tn" form),
    the m = 0 block's contiguous, forward and backward; ``route_weights`` laid them out for the
    call, so no product copies its weight."""
    from mixstack.stack import blas

    seen = []

    def spy(w, block):
        got = b_operand(w, block)
        seen.append((block, got.is_contiguous(), got.mT.is_contiguous(), got is w))
        return got

    b_operand = blas.b_operand
    monkeypatch.setattr(blas, "b_operand", spy)
    case = CASES[0]
    with use_products("blas"):
        got = helpers.run_stack(case, 1, helpers.make_inputs(case), helpers.make_grad_out(case))
    # forward: two gated layers' blocks one launch each, the identity layer's both; backward: the identity
    # layer's and the two relay steps' both blocks: 6 + 6 block products
    assert {block for block, *_ in seen} == {0, 1} and len(seen) == 12
    assert all(transposed and not contiguous for block, contiguous, transposed, _ in seen if block == 1)
    assert all(contiguous for block, contiguous, _, _ in seen if block == 0)
    assert all(same for *_, same in seen)
    assert _same_bits(_runs(case, 1)[0], got) == []


@pytest.mark.parametrize("blocks", [frozenset(), frozenset({0, 1})], ids=["plain", "all-transposed"])
def test_any_layout_of_the_weights_matches_float64_and_level2_gives_level1s_bits(blocks):
    """The layout changes which BLAS kernel runs (and its bits), never the values beyond fp32
    rounding, and levels 1 and 2 still share it."""
    from mixstack.stack import blas

    case = CASES[0]
    inputs, grad_out = helpers.make_inputs(case), helpers.make_grad_out(case)
    with use_products("blas"), blas.transposed_blocks(blocks):
        w1 = blas.route_weights(inputs[2], inputs[3], transposed=False)[1]
        assert w1.is_contiguous() == (1 not in blocks) and w1.mT.is_contiguous() == (1 in blocks)
        one = helpers.run_stack(case, 1, inputs, grad_out)
        with tuning.saved_registrations():
            for fam, cfg in LEVEL2:
                tuning.register(fam, _key(case), dict(cfg))
            two = helpers.run_stack(case, 2, inputs, grad_out)
    (out, grads), _ = _want(case)
    assert_close_rel(one["out"], out, "forward")
    assert_close_rel(one["grad_u0"], grads["u0"], "grad_u0")
    assert_close_rel(one["grad_alpha"], grads["alpha"], "grad_alpha")
    assert _same_bits(one, two) == []
