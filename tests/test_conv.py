"""``mixstack.rotate_in`` / ``rotate_out_sum`` on the CPU without the interpreter: the reference
formulas (gradcheck in float64, the spelled-out backward equal to autograd's), the argument
checks, and the four ``mixstack::`` operators under ``opcheck``, ``torch.compile`` and export
(their bodies run the reference branch here; the kernels are tested in tests/interpret)."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import ConvCase
from torch._dynamo.utils import counters

import mixstack
from mixstack.conv import reference as conv_reference
from mixstack.core import config

pytestmark = pytest.mark.skipif(
    config.triton_interpret(), reason="tracing tests run without TRITON_INTERPRET (second process)")

F64 = torch.float64
mixstack.rotate_in      # a public name's first use registers the torch.ops.mixstack operators
SMALL = ConvCase(N=3, E=5, F=2, C=2, lmax=1)


def _inputs(case=SMALL, seed=0, dtype=F64):
    return helpers.make_conv_inputs(case, seed, dtype=dtype)


def _in_args(inp):
    return (inp["x"], inp["wigner"], inp["radial"], inp["src"], inp["edge_scalar"], inp["scalar_weight"],
            inp["edge_weight"])


def test_gradcheck_of_both_operators_through_their_reference_bodies():
    inp = _inputs()
    x, w, rad, src, h, sw, ew = (t.detach().requires_grad_() if t.is_floating_point() else t
                                 for t in _in_args(inp))
    y = inp["y"].detach().requires_grad_()

    def fn_in(x, w, rad, h, sw, ew):
        return torch.ops.mixstack.rotate_in(x, w, rad, src, h, sw, ew, 1)

    def fn_out(y, w, ew):
        return torch.ops.mixstack.rotate_out_sum(y, w, inp["dst"], ew, SMALL.N, False, 1)[0]

    assert torch.autograd.gradcheck(fn_in, (x, w, rad, h, sw, ew))
    assert torch.autograd.gradgradcheck(fn_in, (x, w, rad, h, sw, ew))
    assert torch.autograd.gradcheck(fn_out, (y, w, ew))


def test_gradgradcheck_of_rotate_out_keeping_its_input():
    inp = _inputs()
    y, w, ew = (inp[k].detach().requires_grad_() for k in ("y", "wigner", "edge_weight"))
    assert torch.autograd.gradgradcheck(
        lambda y, w, ew: mixstack.rotate_out_sum(y, w, inp["dst"], SMALL.N, edge_weight=ew), (y, w, ew))


@pytest.mark.parametrize("case", [ConvCase(N=5, E=31, F=2, C=4, lmax=3),
                                  ConvCase(N=3, E=12, F=1, C=2, lmax=2, scalar=False, weight=False)], ids=str)
def test_the_spelled_out_backward_equals_autograd_of_the_forward(case):
    inp = _inputs(case)
    leaves = [t.detach().requires_grad_() if t is not None and t.is_floating_point() else t
              for t in _in_args(inp)]
    u = conv_reference.rotate_in(leaves[0], leaves[1], leaves[2], leaves[3], edge_scalar=leaves[4],
                                 scalar_weight=leaves[5], edge_weight=leaves[6])
    gu = torch.randn(u.shape, dtype=F64)
    floats = [t for t in leaves if t is not None and t.is_floating_point()]
    want = torch.autograd.grad(u, floats, gu)
    got = [g for g in conv_reference.rotate_in_backward(gu, *[t.detach() if t is not None else t for t in leaves])
           if g is not None]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    ys = inp["y"].sum(1).detach().requires_grad_()
    w_ = inp["wigner"].detach().requires_grad_()
    ew = None if inp["edge_weight"] is None else inp["edge_weight"].detach().requires_grad_()
    out = conv_reference.rotate_out_from_sum(ys, w_, inp["dst"], case.N, lmax=case.lmax, edge_weight=ew)
    go = torch.randn(out.shape, dtype=F64)
    want = torch.autograd.grad(out, [t for t in (ys, w_, ew) if t is not None], go)
    got = [g for g in conv_reference.rotate_out_backward(go, ys.detach(), w_.detach(), inp["dst"],
                                                         None if ew is None else ew.detach()) if g is not None]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_level_0_runs_and_logs_the_reference_forward_and_backward():
    inp = _inputs(dtype=torch.float32)
    with mixstack.use_level(0), mixstack.dispatch_log() as log:
        helpers.run_rotate_in(inp)
        helpers.run_rotate_out(inp)
    assert log == {"conv_in:reference": 1, "conv_in_bwd:reference": 1, "conv_out:reference": 1,
                   "conv_out_bwd:reference": 1}


def _bad(inp, **changes):
    d = dict(inp)
    d.update(changes)
    return d


@pytest.mark.parametrize("change, error, match", [
    (lambda i: _bad(i, x=i["x"][:, :3]), ValueError, "x's dimension 1 must hold"),
    (lambda i: _bad(i, wigner=i["wigner"][:, :2]), ValueError, "wigner must have shape"),
    (lambda i: _bad(i, radial=i["radial"][:, :, :1]), ValueError, "radial must have shape"),
    (lambda i: _bad(i, src=i["src"].float()), TypeError, "src must have dtype int64"),
    (lambda i: _bad(i, src=i["src"][:-1]), ValueError, "src must have shape"),
    (lambda i: _bad(i, edge_scalar=None), ValueError, "edge_scalar and scalar_weight go together"),
    (lambda i: _bad(i, scalar_weight=i["scalar_weight"][:, :1]), ValueError, "scalar_weight must have shape"),
    (lambda i: _bad(i, edge_weight=i["edge_weight"].float()), TypeError, "edge_weight must have the dtype of x"),
])
def test_rotate_in_names_the_argument_it_cannot_take(change, error, match):
    inp = change(_inputs())
    with pytest.raises(error, match=match):
        mixstack.rotate_in(inp["x"], inp["wigner"], inp["radial"], inp["src"], edge_scalar=inp["edge_scalar"],
                           scalar_weight=inp["scalar_weight"], edge_weight=inp["edge_weight"])


@pytest.mark.parametrize("change, error, match", [
    (lambda i: _bad(i, y=i["y"][:, :, :-1]), ValueError, "y must have shape"),
    (lambda i: _bad(i, wigner=i["wigner"][:, :, :3]), ValueError, "wigner's dimension 2"),
    (lambda i: _bad(i, dst=i["dst"][:-1]), ValueError, "dst must have shape"),
    (lambda i: _bad(i, n_atoms=-1), ValueError, "n_atoms must be >= 0"),
    (lambda i: _bad(i, n_atoms=2.0), TypeError, "n_atoms must be an int"),
])
def test_rotate_out_sum_names_the_argument_it_cannot_take(change, error, match):
    inp = change({**_inputs(), "n_atoms": SMALL.N})
    with pytest.raises(error, match=match):
        mixstack.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], inp["n_atoms"], edge_weight=inp["edge_weight"])


@pytest.mark.slow
def test_opcheck_of_the_four_operators():
    inp = _inputs(dtype=torch.float32)
    args = [t.requires_grad_() if t is not None and t.is_floating_point() else t for t in _in_args(inp)]
    torch.library.opcheck(torch.ops.mixstack.rotate_in, (*args, 1))
    u = torch.ops.mixstack.rotate_in(*args, 1)
    flags = (True, True, True, True, True, True)
    no_autograd = ("test_schema", "test_faketensor")        # the backward ops have no autograd of their own
    torch.library.opcheck(torch.ops.mixstack.rotate_in_backward,
                          (torch.randn_like(u), *[a.detach() if a.is_floating_point() else a for a in args],
                           list(flags), 1), test_utils=no_autograd)
    y, w, ew = (inp[k].detach().requires_grad_() for k in ("y", "wigner", "edge_weight"))
    torch.library.opcheck(torch.ops.mixstack.rotate_out_sum, (y, w, inp["dst"], ew, SMALL.N, True, 1))
    out, ys = torch.ops.mixstack.rotate_out_sum(y, w, inp["dst"], ew, SMALL.N, True, 1)
    torch.library.opcheck(torch.ops.mixstack.rotate_out_sum_backward,
                          (torch.randn_like(out), ys.detach()[:, None], w.detach(), inp["dst"], ew.detach(),
                           [True, True, True], 1), test_utils=no_autograd)


def _conv_frame(x, wigner, radial, h, sw, ew, y, src, dst):
    """Both operators and their backward, as a compiled region sees them."""
    u = torch.ops.mixstack.rotate_in(x, wigner, radial, src, h, sw, ew, 1)
    out, _ = torch.ops.mixstack.rotate_out_sum(y, wigner, dst, ew, x.shape[0], True, 1)
    return u.square().sum() + (out * out).sum()


@pytest.mark.slow
def test_compiled_fullgraph_dynamic_matches_eager_across_edge_counts_without_recompiling():
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_conv_frame, fullgraph=True, dynamic=True)
    for n_edges in (9, 14):
        inp = _inputs(ConvCase(N=4, E=n_edges, F=2, C=3, lmax=1), dtype=torch.float32)
        floats = [inp[k].detach().requires_grad_() for k in ("x", "wigner", "radial", "edge_scalar",
                                                               "scalar_weight", "edge_weight", "y")]
        got = torch.autograd.grad(compiled(*floats, inp["src"], inp["dst"]), floats)
        want = torch.autograd.grad(_conv_frame(*floats, inp["src"], inp["dst"]), floats)
        for g, w in zip(got, want):
            helpers.assert_close_rel(g, w, f"compiled gradient (E={n_edges})")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_exported_operators_run_at_another_edge_count():
    class Frame(torch.nn.Module):
        def forward(self, x, wigner, radial, h, sw, ew, y, src, dst):
            return _conv_frame(x, wigner, radial, h, sw, ew, y, src, dst)

    inp = _inputs(ConvCase(N=4, E=9, F=2, C=3, lmax=1), dtype=torch.float32)
    names = ("x", "wigner", "radial", "edge_scalar", "scalar_weight", "edge_weight", "y", "src", "dst")
    e = torch.export.Dim("e", min=2)
    shapes = {"x": None, "wigner": {0: e}, "radial": {0: e}, "h": {0: e}, "sw": {0: e}, "ew": {0: e},
              "y": {0: e}, "src": {0: e}, "dst": {0: e}}
    ep = torch.export.export(Frame(), tuple(inp[k] for k in names), dynamic_shapes=shapes)
    targets = {n.target for n in ep.graph.nodes}
    assert torch.ops.mixstack.rotate_in.default in targets and torch.ops.mixstack.rotate_out_sum.default in targets
    other = _inputs(ConvCase(N=4, E=13, F=2, C=3, lmax=1), seed=1, dtype=torch.float32)
    helpers.assert_close_rel(ep.module()(*(other[k] for k in names)), _conv_frame(*(other[k] for k in names)),
                             "exported frame")


def test_the_linear_radial_operators_reference_bodies_match_autograd():
    """``mixstack::rotate_in_linear`` and its backward operator on the CPU (their bodies run the
    reference branch, below autograd): the backward operator's gradients equal autograd's through
    the reference forward, and the forward operator is differentiable through its autograd."""
    case = ConvCase(N=3, E=5, F=2, C=2, lmax=1)
    inp = _inputs(case)
    g = torch.Generator().manual_seed(3)
    rows, hdim = 3 * case.lmax + 2, 4
    hidden = torch.randn(case.E, hdim, generator=g, dtype=F64)
    weight = torch.randn(case.F, rows, case.C, hdim, generator=g, dtype=F64)
    bias = torch.randn(case.F, rows, case.C, generator=g, dtype=F64)
    leaves = [t.detach().requires_grad_() for t in (inp["x"], inp["wigner"], hidden, inp["edge_scalar"],
                                                     inp["edge_weight"])]
    x, w, hid, h, ew = leaves
    u = conv_reference.rotate_in(x, w, mixstack.LinearRadial(hid, weight, bias), inp["src"], edge_scalar=h,
                                 edge_weight=ew)
    gu = torch.randn(u.shape, generator=g, dtype=F64)
    want = torch.autograd.grad(u, leaves, gu)
    got = torch.ops.mixstack.rotate_in_linear_backward(gu, x.detach(), w.detach(), hid.detach(), weight, bias,
                                                       inp["src"], h.detach(), ew.detach(), [True] * 5, 1)
    for name, a, b in zip(("x", "wigner", "hidden", "edge_scalar", "edge_weight"), got, want):
        torch.testing.assert_close(a, b, msg=name)
    u_op = torch.ops.mixstack.rotate_in_linear(x, w, hid, weight, bias, inp["src"], h, ew, 1)
    torch.testing.assert_close(u_op, u)
    for a, b in zip(torch.autograd.grad(u_op, leaves, gu), want):
        torch.testing.assert_close(a, b)
