"""The convolution kernels' later features through the interpreter, against float64: rotate-in
with per-stream channel blocks, per-degree or no radial weights and the degree mix (every
kind of mix kernel); rotate-out with the streams kept apart, edge weights per edge, stream and
head, unsorted destinations walked through an ``EdgeOrder``, and a per-row scale; edge_wigner in
SeZM's signs.  Forward and every gradient on the kernels, odd sizes (channels not a power of two,
segments longer than a block, an atom without edges, E = 0), bitwise run to run and across
levels, the double backward and the mix's basis through the reference formulas."""

from __future__ import annotations

import helpers
import pytest
import torch
from conv_cases import InCase, OutCase, in_inputs, out_inputs, run_in, run_out

import mixstack
from mixstack.conv.frames import convention_signs

IN_CASES = [
    InCase(N=5, E=37, F=2, C=16, lmax=2, radial="degree", mix="basis1"),       # SeZM's default mixer, 2 streams
    InCase(N=4, E=29, F=1, C=24, lmax=3, radial=None, mix="shared", streams=False),   # C not a power of two
    InCase(N=6, E=21, F=3, C=16, lmax=1, radial="full", mix="channel"),        # one kernel per channel
    InCase(N=5, E=33, F=2, C=16, lmax=4, radial="degree", mix=None, streams=False),  # streams share x
    InCase(N=3, E=17, F=2, C=16, lmax=3, radial=None, mix="basis3", weight=False),
]
OUT_CASES = [
    OutCase(N=6, E=41, F=2, C=16, lmax=2, weight="heads2"),                   # segment runs of 20 > 16
    OutCase(N=5, E=30, F=2, C=32, lmax=3, weight="heads1", scale=False),
    OutCase(N=4, E=19, F=3, C=16, lmax=1, weight="edge", order=False),        # sorted dst, no order
    OutCase(N=5, E=23, F=1, C=48, lmax=2, weight=None),
    OutCase(N=5, E=27, F=2, C=16, lmax=3, weight="edge", blocks=False),       # summed streams, unsorted dst
]

_CACHE: dict = {}


def _in(case, level=1):
    key = ("in", str(case), level)
    if key not in _CACHE:
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            u, grads, _ = run_in(case, in_inputs(case))
        _CACHE[key] = (u, grads, dict(log))
    return _CACHE[key]


def _out(case, level=1):
    key = ("out", str(case), level)
    if key not in _CACHE:
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            out, grads, _ = run_out(case, out_inputs(case))
        _CACHE[key] = (out, grads, dict(log))
    return _CACHE[key]


@pytest.mark.parametrize("case", IN_CASES, ids=str)
def test_rotate_in_features_on_kernels_match_float64(case):
    u, grads, log = _in(case)
    assert log == {"conv_in:triton": 1, "conv_in_bwd:triton": 1}, log
    with mixstack.use_level(0):
        u64, grads64, _ = run_in(case, in_inputs(case, dtype=torch.float64))
    helpers.assert_close_rel(u, u64, "rotate_in")
    assert set(grads) == set(grads64) and {"x", "wigner"} <= set(grads)
    for name in grads:
        helpers.assert_close_rel(grads[name], grads64[name], f"rotate_in grad {name}")


@pytest.mark.parametrize("case", OUT_CASES, ids=str)
def test_rotate_out_features_on_kernels_match_float64(case):
    out, grads, log = _out(case)
    assert log == {"conv_out:triton": 1, "conv_out_bwd:triton": 1}, log
    with mixstack.use_level(0):
        out64, grads64, _ = run_out(case, out_inputs(case, dtype=torch.float64))
    helpers.assert_close_rel(out, out64, "rotate_out_sum")
    assert out.shape == (case.N, (case.lmax + 1) ** 2, case.C * (case.F if case.blocks else 1))
    for name in grads64:
        helpers.assert_close_rel(grads[name], grads64[name], f"rotate_out_sum grad {name}")
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))       # the atom without edges: zeros, written


def test_runs_and_levels_1_to_3_give_the_same_bits():
    for case, run in ((IN_CASES[0], _in), (OUT_CASES[0], _out)):
        first = run(case)
        for level in (1, 2, 3):
            _CACHE.pop((("in" if run is _in else "out"), str(case), level), None)
            again = run(case, level)
            assert torch.equal(first[0], again[0]) and all(torch.equal(first[1][k], again[1][k]) for k in first[1])


def test_the_order_walks_the_same_sums_as_sorted_edges():
    """Unsorted destinations through an EdgeOrder give what the same edges sorted give (both on
    the kernels; each atom's sum runs over its edges in their order either way)."""
    case = OUT_CASES[0]
    inp = out_inputs(case)
    order = mixstack.edge_order(inp["dst"], case.N)
    sorted_inp = {k: (v[order.perm] if k in ("y", "wigner", "edge_weight", "dst") else v) for k, v in inp.items()}
    with mixstack.use_level(1):
        a, _, _ = run_out(case, inp)
        b, _, _ = run_out(OutCase(**{**case.__dict__, "order": False}), sorted_inp)
    assert torch.equal(a, b)


def test_a_transposed_degree_mix_is_caught():
    """Negative control: each block's kernel read (l_out, l_in) instead of (l_in, l_out)."""
    case = IN_CASES[0]
    inp = in_inputs(case)
    n0, n1 = case.lmax + 1, case.lmax
    k = inp["kernel"]
    inp["kernel"] = torch.cat((k[:, :n0 * n0].unflatten(1, (n0, n0)).transpose(1, 2).flatten(1, 2),
                               k[:, n0 * n0:].unflatten(1, (n1, n1)).transpose(1, 2).flatten(1, 2)), 1)
    with mixstack.use_level(1):
        u_wrong, _, _ = run_in(case, inp)
    assert helpers.rel_err(u_wrong, _in(case)[0]) > 100 * helpers.REL_TOL


def test_the_basis_gradient_runs_the_reference_formulas():
    case = IN_CASES[4]
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        _, grads, _ = run_in(case, in_inputs(case), basis_grad=True)
    assert log == {"conv_in:triton": 1, "conv_in_bwd:reference": 1}, dict(log)
    with mixstack.use_level(0):
        _, grads64, _ = run_in(case, in_inputs(case, dtype=torch.float64), basis_grad=True)
    for name in ("basis", "kernel", "x"):
        helpers.assert_close_rel(grads[name], grads64[name], f"grad {name}")


def test_the_double_backward_runs_the_reference_formulas_and_matches_float64():
    """Force-loss training: gradients of x and wigner differentiated again, through both operators."""
    cin, cout = InCase(N=4, E=13, F=2, C=16, lmax=2, mix="basis1"), OutCase(N=4, E=13, F=2, C=16, lmax=2)

    def second(dtype, level):
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            _, g_in, leaves_in = run_in(cin, in_inputs(cin, 3, dtype=dtype), create_graph=True)
            _, g_out, leaves_out = run_out(cout, out_inputs(cout, 3, dtype=dtype), create_graph=True)
            loss = sum(g.square().sum() for g in (g_in["x"], g_in["wigner"], g_out["wigner"], g_out["y"]))
            wrt = [leaves_in[k] for k in ("x", "wigner", "radial", "kernel")] + [leaves_out[k] for k in ("y", "edge_weight")]
            return torch.autograd.grad(loss, wrt), dict(log)

    got, log = second(torch.float32, 1)
    want, _ = second(torch.float64, 0)
    assert log["conv_in_bwd:reference"] >= 1 and log["conv_out_bwd:reference"] >= 1, log
    for i, (g, w) in enumerate(zip(got, want)):
        helpers.assert_close_rel(g, w, f"double backward {i}")


def test_no_edges_gives_empty_results_and_zero_sums():
    cin, cout = InCase(N=3, E=0, F=2, C=16, lmax=2), OutCase(N=3, E=0, F=2, C=16, lmax=2)
    with mixstack.use_level(1):
        u, g_in, _ = run_in(cin, in_inputs(cin))
        out, _, _ = run_out(cout, out_inputs(cout))
    assert u.shape == (2, 0, 7 * 16) and out.shape == (3, 9, 32)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(g_in["x"], torch.zeros_like(g_in["x"]))
    assert g_in["kernel"].shape == (0, 13, 1)


@pytest.mark.parametrize("lmax", [1, 3, 6])
def test_edge_wigner_sezm_signs_in_the_kernels(lmax):
    """SeZM's rows are mixstack's times the signs, bit for bit (the kernels fold the signs into
    their stores), and so is the backward (the signs folded into its loads); both within float32
    rounding of float64."""
    vec = helpers.edge_vectors(23, seed=lmax)
    weight = torch.randn(23, 3, (lmax + 1) ** 2, generator=torch.Generator().manual_seed(2))
    signs = convention_signs(lmax, dtype=torch.float32)
    grads = {}
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        for convention, w_ in (("sezm", weight), ("mixstack", weight * signs)):
            v = vec.clone().requires_grad_()
            rows = mixstack.edge_wigner(v, lmax, convention=convention)
            grads[convention] = (rows.detach(), torch.autograd.grad((rows * w_).sum(), v)[0])
    assert log == {"wigner:triton": 2, "wigner_bwd:triton": 2}, dict(log)
    assert torch.equal(grads["sezm"][0], grads["mixstack"][0] * signs)
    assert torch.equal(grads["sezm"][1], grads["mixstack"][1])
    v64 = vec.double().requires_grad_()
    rows64 = mixstack.conv.frames.edge_wigner_reference(v64, lmax, convention="sezm")
    (g64,) = torch.autograd.grad((rows64 * weight.double()).sum(), v64)
    helpers.assert_close_rel(grads["sezm"][0], rows64, "sezm rows")
    helpers.assert_close_rel(grads["sezm"][1], g64, "sezm rows' gradient")
