"""The convolution's kernels (``mixstack.rotate_in``, ``rotate_out_sum``) through the interpreter:
forward and every gradient against float64, on partial tiles (edge counts no block divides,
segments longer than a segment block, an atom without edges), bitwise run to run and across
levels 1-3, and the double backward through the tensor-op formulas."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import ConvCase

import mixstack

CASES = [
    ConvCase(N=5, E=97, F=1, C=16, lmax=1),                                 # segment runs of 48 > 32
    ConvCase(N=7, E=53, F=2, C=32, lmax=3),                                 # the bench model's key
    ConvCase(N=9, E=70, F=3, C=48, lmax=2, scalar=False, weight=False),     # C not a power of two
    ConvCase(N=4, E=45, F=2, C=16, lmax=6, scalar=True, weight=False),
]


def _runs(case, level, seed=0):
    inp = helpers.make_conv_inputs(case, seed)
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        res_in = helpers.run_rotate_in(inp)
        res_out = helpers.run_rotate_out(inp)
    return res_in, res_out, dict(log)


_CACHE: dict = {}


def _cached(case, level):
    key = (str(case), level)
    if key not in _CACHE:
        _CACHE[key] = _runs(case, level)
    return _CACHE[key]


def _float64(case):
    inp = helpers.make_conv_inputs(case, 0, dtype=torch.float64)
    with mixstack.use_level(0):
        return helpers.run_rotate_in(inp), helpers.run_rotate_out(inp)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_level1_forward_and_every_gradient_match_float64(case):
    (u, gin), (out, gout), log = _cached(case, 1)
    assert log == {"conv_in:triton": 1, "conv_in_bwd:triton": 1, "conv_out:triton": 1,
                   "conv_out_bwd:triton": 1}, log
    (u64, gin64), (out64, gout64) = _float64(case)
    helpers.assert_close_rel(u, u64, "rotate_in")
    helpers.assert_close_rel(out, out64, "rotate_out_sum")
    assert set(gin) == set(gin64) and set(gout) == set(gout64)
    for name in gin:
        helpers.assert_close_rel(gin[name], gin64[name], f"rotate_in grad {name}")
    for name in gout:
        helpers.assert_close_rel(gout[name], gout64[name], f"rotate_out_sum grad {name}")
    # the last atom receives no edge: its sum is zero, written, not left uninitialised
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES[:2], ids=str)
def test_runs_and_levels_1_to_3_give_the_same_bits(case):
    first = _cached(case, 1)
    for again in (_runs(case, 1), _runs(case, 2), _runs(case, 3)):
        for (a, ga), (b, gb) in zip(first[:2], again[:2]):
            assert torch.equal(a, b)
            assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_the_tolerance_sees_a_swapped_pair_of_wigner_rows():
    """Negative control: m = -1 and m = +1 rows exchanged is caught by the float64 comparison."""
    case = CASES[1]
    inp = helpers.make_conv_inputs(case, 0)
    inp["wigner"] = inp["wigner"][:, [2, 1, 0]]
    with mixstack.use_level(1):
        u, _ = helpers.run_rotate_in(inp)
    (u64, _), _ = _float64(case)
    assert helpers.rel_err(u, u64) > 100 * helpers.REL_TOL


def test_keeping_only_the_focus_sum_gives_the_same_gradients():
    case = CASES[1]
    inp = helpers.make_conv_inputs(case, 0)
    with mixstack.use_level(1):
        out_a, ga = helpers.run_rotate_out(inp, keep_input=True)
        out_b, gb = helpers.run_rotate_out(inp, keep_input=False)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    assert ga["y"].stride(1) == 0                        # every stream's gradient, one surface


def test_no_edges_gives_empty_inputs_gradients_and_zero_sums():
    case = ConvCase(N=3, E=0, F=2, C=16, lmax=2)
    inp = helpers.make_conv_inputs(case, 0)
    with mixstack.use_level(1):
        u, gin = helpers.run_rotate_in(inp)
        out, gout = helpers.run_rotate_out(inp)
    assert u.shape == (2, 0, case.row) and out.shape == (3, case.S, 16)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(gin["x"], torch.zeros_like(gin["x"]))


def test_the_double_backward_runs_the_tensor_op_formulas_and_matches_float64():
    """Force-loss training: a loss on first-order gradients, differentiated again."""
    case = ConvCase(N=4, E=23, F=2, C=16, lmax=2)

    def second_order(dtype, level):
        inp = helpers.make_conv_inputs(case, 3, dtype=dtype)
        leaves = {k: inp[k].detach().clone().requires_grad_() for k in set(helpers.ROTATE_IN_FLOATS) | {"y"}}
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            u = mixstack.rotate_in(leaves["x"], leaves["wigner"], leaves["radial"], inp["src"],
                                   edge_scalar=leaves["edge_scalar"], scalar_weight=leaves["scalar_weight"],
                                   edge_weight=leaves["edge_weight"])
            out = mixstack.rotate_out_sum(leaves["y"], leaves["wigner"], inp["dst"], case.N,
                                          edge_weight=leaves["edge_weight"])
            gx, gw = torch.autograd.grad(u.square().sum() + out.square().sum(), [leaves["x"], leaves["wigner"]],
                                         create_graph=True)
            loss = gx.square().sum() + gw.square().sum()
            names = sorted(leaves)
            second = torch.autograd.grad(loss, [leaves[k] for k in names])
        return dict(zip(names, second)), dict(log)

    got, log = second_order(torch.float32, 1)
    want, _ = second_order(torch.float64, 0)
    assert log["conv_in_bwd:reference"] >= 1 and log["conv_out_bwd:reference"] >= 1, log
    for name in want:
        helpers.assert_close_rel(got[name], want[name], f"double backward, {name}")


# ------------------------------------------------------------------ radial weights as a layer

LINEAR_CASES = [
    (ConvCase(N=7, E=53, F=2, C=32, lmax=3), 32),                           # the bench model's key
    (ConvCase(N=5, E=37, F=1, C=8, lmax=1, scalar=False), 20),              # C and H padded to 16, 32
    (ConvCase(N=9, E=41, F=3, C=48, lmax=2, weight=False), 16),             # C not a power of two
]


def _linear_inputs(case, hidden_dim, dtype=torch.float32):
    inp = helpers.make_conv_inputs(case, 0, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    rows = 3 * case.lmax + 2 if case.scalar else 2 * case.lmax + 1
    f64 = torch.float64
    inp["hidden"] = torch.randn(case.E, hidden_dim, generator=g, dtype=f64).to(dtype)
    inp["lin_weight"] = (torch.randn(case.F, rows, case.C, hidden_dim, generator=g, dtype=f64)
                         / hidden_dim ** 0.5).to(dtype)
    inp["lin_bias"] = torch.randn(case.F, rows, case.C, generator=g, dtype=f64).to(dtype)
    return inp


def _run_linear(inp, level, *, layer_grads=False, create_graph=False):
    names = ["x", "wigner", "hidden"] + [k for k in ("edge_scalar", "edge_weight") if inp[k] is not None]
    if layer_grads:
        names += ["lin_weight", "lin_bias"]
    leaves = {k: inp[k].detach().clone().requires_grad_(k in names)
              for k in ("x", "wigner", "hidden", "edge_scalar", "edge_weight", "lin_weight", "lin_bias")
              if inp[k] is not None}
    radial = mixstack.LinearRadial(leaves["hidden"], leaves["lin_weight"], leaves["lin_bias"])
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        u = mixstack.rotate_in(leaves["x"], leaves["wigner"], radial, inp["src"],
                               edge_scalar=leaves.get("edge_scalar"), edge_weight=leaves.get("edge_weight"))
        gu = torch.randn(u.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(u)
        grads = torch.autograd.grad(u, [leaves[k] for k in names], gu, create_graph=create_graph)
    return u, dict(zip(names, grads)), dict(log), leaves


_LINEAR: dict = {}


def _linear_level1(case, hidden_dim):
    """``_run_linear`` at level 1 on ``_linear_inputs(case, hidden_dim)``, computed once per test run."""
    key = (str(case), hidden_dim)
    if key not in _LINEAR:
        _LINEAR[key] = _run_linear(_linear_inputs(case, hidden_dim), 1)
    return _LINEAR[key]


@pytest.mark.parametrize("case,hidden_dim", LINEAR_CASES, ids=lambda v: str(v))
def test_linear_radial_forward_and_forces_gradients_run_the_kernels_and_match_float64(case, hidden_dim):
    """The radial weights made per tile from the layer: forward and the gradients a force pass
    wants (every input but the layer's own weight and bias) from the kernels, against float64;
    and the same numbers as rotate-in fed the whole weights (to rounding)."""
    inp = _linear_inputs(case, hidden_dim)
    u, grads, log, _ = _linear_level1(case, hidden_dim)
    assert log == {"conv_in:triton": 1, "conv_in_bwd:triton": 1}, log
    u64, grads64, _, _ = _run_linear(_linear_inputs(case, hidden_dim, torch.float64), 0)
    helpers.assert_close_rel(u, u64, "rotate_in (linear radial)")
    assert set(grads) == set(grads64)
    for name in grads:
        helpers.assert_close_rel(grads[name], grads64[name], f"rotate_in (linear radial) grad {name}")
    radial, sw = mixstack.conv.reference.linear_radial_weights(
        mixstack.LinearRadial(inp["hidden"], inp["lin_weight"], inp["lin_bias"]), case.lmax, case.scalar)
    with mixstack.use_level(1):
        whole = mixstack.rotate_in(inp["x"], inp["wigner"], radial, inp["src"], edge_scalar=inp["edge_scalar"],
                                   scalar_weight=sw, edge_weight=inp["edge_weight"])
    helpers.assert_close_rel(u, whole, "linear radial against the whole weights")


@pytest.mark.slow           # a negative control of the tolerance: the full suite
def test_linear_radial_wrong_layer_is_caught():
    """Negative control: the bias of the wrong focus stream (rows swapped) fails the comparison."""
    case, hidden_dim = LINEAR_CASES[0]
    inp = _linear_inputs(case, hidden_dim)
    u, _, _, _ = _linear_level1(case, hidden_dim)
    inp["lin_bias"] = inp["lin_bias"].flip(0)
    u_wrong, _, _, _ = _run_linear(inp, 1)
    with pytest.raises(AssertionError):
        helpers.assert_close_rel(u_wrong, u, "swapped focus streams")


def test_linear_radial_layer_gradients_and_double_backward_run_the_reference_formulas():
    case, hidden_dim = LINEAR_CASES[0]
    inp = _linear_inputs(case, hidden_dim)
    u, grads, log, _ = _run_linear(inp, 1, layer_grads=True)
    assert log == {"conv_in:triton": 1, "conv_in_bwd:reference": 1}, log
    _, grads64, _, _ = _run_linear(_linear_inputs(case, hidden_dim, torch.float64), 0, layer_grads=True)
    for name in ("lin_weight", "lin_bias", "hidden", "x"):
        helpers.assert_close_rel(grads[name], grads64[name], f"grad {name}")
    # create_graph: the gradients are differentiable again (here: d/dx of <grad_hidden, 1>)
    _, g2, log2, leaves = _run_linear(inp, 1, create_graph=True)
    assert log2["conv_in_bwd:reference"] == 1
    (gx,) = torch.autograd.grad(g2["hidden"].sum(), leaves["x"])
    _, g64, _, leaves64 = _run_linear(_linear_inputs(case, hidden_dim, torch.float64), 0, create_graph=True)
    (gx64,) = torch.autograd.grad(g64["hidden"].sum(), leaves64["x"])
    helpers.assert_close_rel(gx, gx64, "double backward through the linear radial")


@pytest.mark.slow
def test_linear_radial_runs_and_levels_1_to_3_give_the_same_bits():
    case, hidden_dim = LINEAR_CASES[0]
    inp = _linear_inputs(case, hidden_dim)
    first = _linear_level1(case, hidden_dim)
    for level in (1, 2, 3):
        u, grads, _, _ = _run_linear(inp, level)
        assert torch.equal(u, first[0]) and all(torch.equal(grads[k], first[1][k]) for k in grads)


def test_make_fx_traces_the_reference_formulas_of_the_convolution_and_the_kernels_eagerly():
    """A trace (here ``make_fx``, as deepmd-kit's compiled inference and freezes trace) records the
    convolution's reference formulas, as ``torch.compile`` does (``guards.tracing``); the same
    call run eagerly takes the kernels."""
    from torch.fx.experimental.proxy_tensor import make_fx

    case = CASES[1]
    inp = helpers.make_conv_inputs(case, 0)

    def forward(x, wigner, src):
        return mixstack.rotate_in(x, wigner, None, src)

    with mixstack.use_level(1):
        graph = make_fx(forward, tracing_mode="fake")(inp["x"], inp["wigner"], inp["src"])
        with mixstack.dispatch_log() as log:
            forward(inp["x"], inp["wigner"], inp["src"])
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert not any("mixstack" in t for t in targets), targets
    assert log["conv_in:triton"] == 1


def test_under_opaque_operators_a_trace_keeps_the_convolutions_operators_whole_and_calls_their_kernels():
    """``guards.opaque_operators`` (what ``FrameRunner`` opens around deepmd-kit's compiled
    inference): ``make_fx`` records ``mixstack::rotate_in`` as an operator, not its reference
    formulas; AOTAutograd keeps it whole (no Triton kernel inlined into the graph); the traced
    graph, run, calls the same kernel as an eager call and gives its bits.  Outside the block
    torch's setting is back and a trace records the reference formulas again.  (The forward
    only: the interpreter's fake pass of the backward operator runs reference gradients that
    a fake trace cannot; on a GPU the fake pass goes through ``wrap_triton``.)"""
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixstack.dispatch.guards import opaque_operators

    case = CASES[1]
    inp = helpers.make_conv_inputs(case, 0)

    def forces(x, wigner, src):
        u = mixstack.rotate_in(x, wigner, None, src)
        return u, (u * u).sum()

    args = (inp["x"], inp["wigner"], inp["src"])
    with mixstack.use_level(1):
        with mixstack.dispatch_log() as log:
            eager = forces(*args)
        with opaque_operators():
            assert functorch_config.decompose_custom_triton_ops is False
            graph = make_fx(forces, tracing_mode="symbolic")(*args)
            lowered = []

            def keep(gm, _inputs):
                lowered.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
                return gm
            fakes = [n.meta["val"] for n in graph.graph.nodes if n.op == "placeholder"]     # as deepmd-kit lowers
            with torch.no_grad():
                aot = aot_module_simplified(graph, fakes, fw_compiler=keep, inference_compiler=keep)
        assert functorch_config.decompose_custom_triton_ops is True
        with mixstack.dispatch_log() as traced_log:
            got = graph(*args)
            again = aot(*args)
        plain = make_fx(forces, tracing_mode="fake")(*args)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "mixstack.rotate_in.default" in targets, targets
    assert "mixstack.rotate_in.default" in lowered[0], lowered
    assert not any("triton_kernel_wrapper" in t for t in lowered[0]), lowered
    assert log["conv_in:triton"] == 1 and traced_log["conv_in:triton"] == 2, (dict(log), dict(traced_log))
    for a, b, c in zip(eager, got, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert not any("mixstack" in str(n.target) for n in plain.graph.nodes if n.op == "call_function")
