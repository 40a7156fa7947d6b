"""Training on the kernels through the interpreter: weight gradients (``wgrad:*``) and the double
backward (``bwd2:*``) against float64, bitwise run to run, level 2 bitwise equal to level 1,
level 3 within its contract, the guards that send a call to the reference, and negative
controls that show a wrong formula fails.

The float64 oracle is independent of the formulas under test: autograd of
``mixstack.reference`` (the forward written out), differentiated twice.  Covering set (the
interpreter is slow): partial edge tiles and one edge, Cf 16 and 48 (48: padded register
tiles), lmax 1, 2, 3 and 6, F 1 to 3, n_layers 1 to 3, alpha on and off.
"""

from __future__ import annotations

import functools

import helpers
import pytest
import torch
import triton
import triton.language as tl
from helpers import Case, assert_close_rel, case_id

import mixstack
from mixstack import tuning
from mixstack.stack import training
from mixstack.tuning import configs
from mixstack.tuning.families import CONTRACT

CASES = [
    Case(F=2, E=37, Cf=16, lmax=2, n_layers=3, apply_alpha=True),     # partial tile, 2 gated layers
    Case(F=1, E=70, Cf=48, lmax=1, n_layers=2, apply_alpha=False),    # padded tiles, no alpha
    Case(F=3, E=1, Cf=16, lmax=3, n_layers=2, apply_alpha=True),      # one edge, F 3
    Case(F=1, E=20, Cf=16, lmax=6, n_layers=2, apply_alpha=True),     # lmax 6
    Case(F=2, E=9, Cf=16, lmax=1, n_layers=1, apply_alpha=True),      # the identity layer alone
]
TUNED = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
WGRAD_TUNED = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}


def _key(case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _data(case):
    return helpers.make_inputs(case), helpers.make_grad_out(case), helpers.training_cotangents(case)


@functools.lru_cache(maxsize=None)
def _want(case):
    inputs, grad_out, cot = _data(case)
    _, first = helpers.reference64(case, inputs, grad_out, wrt=helpers.INPUT_NAMES)
    return first, helpers.training_step64(case, inputs, grad_out, cot)


_RUNS: dict = {}


def _train(case, level, registered=()):
    """``helpers.run_training_step`` at ``level`` with ``registered`` ((family, cfg) pairs) in force;
    computed once per test run."""
    key = (case, level, registered)
    if key not in _RUNS:
        inputs, grad_out, cot = _data(case)
        with tuning.saved_registrations():
            for fam, cfg in registered:
                tuning.register(fam, _key(case), dict(cfg))
            _RUNS[key] = helpers.run_training_step(case, level, inputs, grad_out, cot)
    return _RUNS[key]


def _frozen(cfg):
    return tuple(sorted(cfg.items()))


LEVEL2 = (("stack_fwd", TUNED), ("stack_bwd_relay", TUNED), ("stack_wgrad", WGRAD_TUNED))
LEVEL3 = (("stack_compensated", TUNED), ("stack_wgrad_compensated", TUNED))


def _registered(pairs):
    return tuple((fam, _frozen(cfg)) for fam, cfg in pairs)


def _same_bits(a, b):
    return [k for k in a if k != "log" and not torch.equal(a[k], b[k])]


def _params(slow):
    """CASES, those in ``slow`` in the full suite only.  The quick tier keeps a partial tile with 2
    gated layers, padded tiles without alpha and the identity layer alone; lmax 6 (and for the
    training step one edge with F 3) run in the full suite."""
    return [pytest.param(c, marks=pytest.mark.slow) if c in slow else c for c in CASES]


@pytest.mark.parametrize("case", _params([CASES[3]]), ids=case_id)
def test_level1_weight_gradients_come_from_kernels_and_match_float64(case, cached_run):
    got = cached_run(case, 1, weights=True)
    want, _ = _want(case)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 1, "wgrad:triton": 1}
    for name in helpers.INPUT_NAMES:
        if name in want:
            assert got[f"grad_{name}"].shape == want[name].shape
            assert_close_rel(got[f"grad_{name}"], want[name], f"grad_{name}")


@pytest.mark.parametrize("case", _params([CASES[2], CASES[3]]), ids=case_id)
def test_level1_training_step_runs_the_double_backward_from_kernels_and_matches_float64(case):
    got = _train(case, 1)
    _, want = _want(case)
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2}, got["log"]
    for name, g in want.items():
        assert got[name].shape == g.shape, name
        assert_close_rel(got[name], g, f"d loss / d {name}")


def test_a_loss_of_forces_alone_gives_the_result_no_cotangent_and_matches_float64():
    """No energy term: the forward's backward receives only the double backward's cotangents of z
    and y (no identity-layer GEMM, no identity weight reduction: both would multiply zero)."""
    case = CASES[0]
    inputs, grad_out, (v, w, _) = _data(case)
    got = helpers.run_training_step(case, 1, inputs, grad_out, (v, w, None))
    want = helpers.training_step64(case, inputs, grad_out, (v, w, None))
    assert got["log"] == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2}, got["log"]
    for name, g in want.items():
        assert_close_rel(got[name], g, f"d loss / d {name}")


def test_the_force_pass_computes_no_weight_gradient_though_the_weights_require_grad():
    """``autograd.grad(out, [u0, alpha])`` asks for no weight gradient: the engine says so, and the
    backward stays on the force path (the fused backward too, where a winning entry exists)."""
    case = CASES[0]
    inputs = [t.clone().requires_grad_() for t in helpers.make_inputs(case)]
    grad_out = helpers.make_grad_out(case)
    fused = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    with tuning.registration("stack_bwd_fused", _key(case), fused), mixstack.use_level(2), \
            mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(*inputs, **case.kw)
        torch.autograd.grad(out, inputs[:2], grad_out)
    assert log == {"fwd:triton": 1, "bwd:fused": 1}


def test_training_is_bitwise_identical_run_to_run(cached_run):
    case = CASES[0]
    inputs, grad_out, cot = _data(case)
    again = helpers.run_training_step(case, 1, inputs, grad_out, cot)
    assert _same_bits(_train(case, 1), again) == []
    weights = cached_run(case, 1, weights=True)          # the first run: the weight-gradient test's
    assert _same_bits(helpers.run_stack(case, 1, inputs, grad_out, weights=True), weights) == []


@pytest.mark.parametrize("case", [CASES[0]], ids=case_id)    # Cf 48 and 64: tests/gpu/test_gpu_training.py
def test_level2_with_tuned_configs_is_bitwise_equal_to_level1(case):
    one, two = _train(case, 1), _train(case, 2, _registered(LEVEL2))
    assert two["log"]["cfg:stack_wgrad"] == 2 and two["log"]["bwd2:triton"] == 1
    assert _same_bits(one, two) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES[:1], ids=case_id)     # Cf 48 and 64: tests/gpu/test_gpu_training.py
def test_level3_with_validated_entries_runs_compensated_within_the_contract(case):
    got = _train(case, 3, _registered(LEVEL3))
    _, want = _want(case)
    assert got["log"] == {"fwd:compensated": 1, "bwd:compensated": 2, "bwd2:compensated": 1,
                          "wgrad:compensated": 2}, got["log"]
    for name, g in want.items():
        assert helpers.rel_err(got[name], g) <= CONTRACT, name


def test_level3_without_entries_runs_level2_bit_for_bit():
    case = CASES[1]
    three = _train(case, 3)
    assert three["log"] == {"fwd:triton": 1, "bwd:relay": 2, "bwd2:triton": 1, "wgrad:triton": 2,
                            "level3:level2": 4}
    assert _same_bits(_train(case, 1), three) == []


def test_the_reductions_sum_several_chunks_in_order_including_a_partial_one():
    """More edges than two chunks (and a partial third): the block and gate reductions against
    float64 products, two runs with the same bits, and the same bits with another output tile."""
    lay = Case(F=2, E=1, Cf=16, lmax=1, n_layers=2).layout
    n_edges = 2 * configs.WGRAD_CHUNK + 37
    g = torch.Generator().manual_seed(7)
    a = torch.randn(1, 2, n_edges, lay.row, generator=g)
    b = torch.randn(2, n_edges, lay.row, generator=g)
    m0 = lay.m0

    def blocks(cfg):
        dw0 = torch.full((1, 2, m0, m0), float("nan"))
        dw1 = torch.full((1, 2, lay.m1, lay.m1), float("nan"))
        training._Reductions(b, n_edges, 2, lay, training.WgradPlan(cfg)).blocks(a, 0, b, dw0, dw1, 0)
        return dw0, dw1

    dw0, dw1 = blocks(None)
    a64, b64 = a[0].double(), b.double()
    assert_close_rel(dw0[0], a64[..., :m0].transpose(-1, -2) @ b64[..., :m0], "dw0")
    assert_close_rel(dw1[0], a64[..., m0:].transpose(-1, -2) @ b64[..., m0:], "dw1")
    again = blocks(None)
    other = blocks({"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2})
    assert torch.equal(dw0, again[0]) and torch.equal(dw1, again[1])
    assert torch.equal(dw0, other[0]) and torch.equal(dw1, other[1])


def test_the_gate_reduction_sums_several_chunks_against_float64():
    case = Case(F=1, E=3 * configs.GATE_WGRAD_CHUNK + 5, Cf=16, lmax=2, n_layers=2)
    lay = case.layout
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    z = torch.randn(1, 1, case.E, lay.row, generator=torch.Generator().manual_seed(3))
    h = torch.randn(1, case.E, lay.row, generator=torch.Generator().manual_seed(4))
    dgw = torch.full(gw.shape, float("nan"))
    training._Reductions(h, case.E, 1, lay, training.WgradPlan()).gate(h, 0, z, gw, dgw, 0)
    from mixstack.stack import reference
    sg = torch.sigmoid(z[0, ..., :case.Cf].double() @ gw[0].double())
    _, gl = reference._gate_cotangents(h.double(), z[0].double(), sg, gw[0].double(), lay)
    assert_close_rel(dgw[0], z[0, ..., :case.Cf].double().transpose(-1, -2) @ gl, "dgw")


def test_the_op_level_double_backward_matches_the_reference_formulas_in_float64():
    """``mixstack::stack_double_backward`` at level 1 against ``reference.double_backward`` in
    float64 (itself held to autograd in tests/test_training.py): every output, the partial
    derivatives with respect to z and y included."""
    case = Case(F=2, E=37, Cf=16, lmax=2, n_layers=3, apply_alpha=True)
    inputs = helpers.make_inputs(case)
    grad_out = helpers.make_grad_out(case)
    v, w, _ = helpers.training_cotangents(case)
    _, z, y = torch.ops.mixstack.stack_forward(*inputs, *case.op_args, 1)
    empty = grad_out.new_empty((0,))
    with mixstack.dispatch_log() as log:
        got = torch.ops.mixstack.stack_double_backward(v, w, grad_out, y, z, empty, inputs[1], list(inputs[2:]),
                                                       case.op_spec(1), [True, True, True])
    assert log["bwd2:triton"] == 1 and log["wgrad:triton"] == 1
    d64 = [t.double() for t in (v, w, grad_out, y, z, *inputs[1:])]
    want = mixstack.reference.double_backward(*d64, **case.kw)
    for name, g, ref in zip(("grad_out", "y", "z", "alpha", "w0", "w1", "gw"), got, want):
        assert_close_rel(g, ref, f"d/d{name}")


@triton.jit
def _without_sigmoid_curvature(gsg_dot, gsg, t_dot, sg):
    """``curvature.gate_logit_curvature`` with its sigmoid'' term dropped (a wrong formula)."""
    return gsg_dot * sg * (1.0 - sg) + tl.zeros_like(t_dot) * gsg


@pytest.mark.slow           # a negative control of the tolerance: the full suite
def test_a_wrong_second_derivative_fails_the_float64_check(monkeypatch):
    """Negative control: the tangent kernel and the gate reduction with the sigmoid'' term of the
    gate-logit curvature dropped give double-backward gradients far outside the tolerance."""
    from mixstack.kernels import curvature, wgrad

    without_curvature = _without_sigmoid_curvature
    case = CASES[0]
    monkeypatch.setattr(curvature, "gate_logit_curvature", without_curvature)
    monkeypatch.setattr(wgrad, "gate_logit_curvature", without_curvature)
    inputs, grad_out, cot = _data(case)
    wrong = helpers.run_training_step(case, 1, inputs, grad_out, cot)
    _, want = _want(case)
    errs = {n: helpers.rel_err(wrong[n], want[n]) for n in ("u0", "w0", "gw")}
    assert all(e > 10 * helpers.REL_TOL for e in errs.values()), errs


def test_a_weight_gradient_while_building_a_graph_runs_the_reference_and_says_so():
    """Guard (docs/contract.md §4): ``create_graph`` with a weight gradient asked for in the same
    pass runs the differentiable reference formulas; a derivative of that is still right."""
    case = CASES[0]
    inputs = [t.clone().requires_grad_() for t in helpers.make_inputs(case)]
    grad_out = helpers.make_grad_out(case)
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(*inputs, **case.kw)
        g_u0, g_w0 = torch.autograd.grad(out, [inputs[0], inputs[2]], grad_out, create_graph=True)
        (h,) = torch.autograd.grad((g_w0 * g_w0).sum() + g_u0.sum(), inputs[3])
    assert log["bwd:reference"] == 1 and log["fwd:triton"] == 1
    x = [t.detach().double().requires_grad_() for t in inputs]
    out = mixstack.reference.mixing_stack(*x, **case.kw)
    g_u0, g_w0 = torch.autograd.grad(out, [x[0], x[2]], grad_out.double(), create_graph=True)
    (want,) = torch.autograd.grad((g_w0 * g_w0).sum() + g_u0.sum(), x[3])
    assert_close_rel(h, want, "d/dw1")


def test_a_third_derivative_falls_back_to_the_reference_and_says_so():
    case = Case(F=1, E=9, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
    inputs = helpers.make_inputs(case)
    grad_out = helpers.make_grad_out(case)
    v, _, _ = helpers.training_cotangents(case)

    def third(fn, x):
        out = fn(*x, **case.kw)
        (g1,) = torch.autograd.grad(out, x[0], grad_out.to(x[0].dtype), create_graph=True)
        (g2,) = torch.autograd.grad((g1 * v.to(x[0].dtype)).sum(), x[0], create_graph=True)
        return torch.autograd.grad((g2 * g2).sum(), [x[0], x[2]])

    x = [t.clone().requires_grad_() for t in inputs]
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        got = third(mixstack.mixing_stack, x)
    # the double backward taken with create_graph is the differentiable reference (a third
    # derivative will follow); the first-order backwards stay on the kernels
    assert log["bwd:reference"] >= 1 and "bwd2:triton" not in log and log["bwd:relay"] >= 1, dict(log)
    want = third(mixstack.reference.mixing_stack, [t.double().requires_grad_() for t in inputs])
    for name, g, ref in zip(("u0", "w0"), got, want):
        assert_close_rel(g, ref, f"d3/d{name}")


def test_no_edges_give_zero_weight_gradients_and_an_empty_double_backward():
    case = Case(F=2, E=0, Cf=16, lmax=1, n_layers=2)
    inputs, grad_out, cot = _data(case)
    got = helpers.run_training_step(case, 1, inputs, grad_out, cot)
    assert got["log"]["bwd2:triton"] == 1
    for name in ("w0", "w1", "gw"):
        assert got[name].shape == inputs[helpers.INPUT_NAMES.index(name)].shape
        assert not got[name].any()
    assert got["u0"].shape == (2, 0, case.row) and got["grad_out"].shape == (0, 2, case.row)


def _peak_surfaces(step, surface_bytes, within: str) -> int:
    """The most whole ``(F, E, ROW)`` surfaces that the operator ``within`` holds at once of those
    it allocated during ``step`` (the profiler's CPU allocation trace; buffers under 0.9 of a
    surface, such as the weight gradients and the reductions' partial sums, are left out)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            events = json.load(f)["traceEvents"]
    (op,) = [e for e in events if e.get("name") == within and e.get("ph") == "X"]
    live, peak = 0, 0
    for e in events:
        if e.get("name") == "[memory]" and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]:
            n = round(e["args"]["Bytes"] / surface_bytes)
            if abs(e["args"]["Bytes"]) >= 0.9 * surface_bytes:
                live += n
                peak = max(peak, live)
    return peak


@pytest.mark.slow
def test_the_double_backward_allocates_no_surface_it_can_reuse():
    """The double backward of a stack with 2 gated layers and weights allocates its outputs
    ``d_z`` (2 surfaces), the tangent ``u_dot`` and ``z_dot``, later ``y_dot`` in ``z_dot``'s
    place: 4 surfaces at once.  The gate cotangent ``gz`` lives in ``d_z[k]`` until the tangent
    step writes it, and the top reduction scales ``grad_out`` into the dead ``z_dot``; either on
    a surface of its own made it 5 (on the H200 the training step's peak was in that reduction)."""
    from mixstack.bench import train_bench
    from mixstack.measure.shapes import BenchShape

    shape = BenchShape("T", 257, 2, 16, 1, layers=3)          # 2 gated layers: d_z holds 2
    inp = train_bench._stack_inputs(shape, torch.device("cpu"), 0)
    step = train_bench.StackStep("1", shape, inp)
    assert _peak_surfaces(step, inp.u0.numel() * inp.u0.element_size(), "mixstack::stack_double_backward") == 4
