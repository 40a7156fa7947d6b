"""The convolution operators' later features on the CPU without the interpreter: their reference
formulas against independent spellings (per-stream calls, loops over degrees, per-stream sums),
``gradcheck`` / ``gradgradcheck`` in float64 through the operators (whose bodies run the reference
branch here), ``edge_order``, SeZM's Wigner signs, and the errors that name the argument.  The
kernels are tested in tests/interpret/test_interp_conv_streams.py."""

from __future__ import annotations

import pytest
import torch
from conv_cases import InCase, OutCase, in_inputs, out_inputs

import mixstack
from mixstack.conv import reference as conv_reference
from mixstack.conv.frames import convention_signs, edge_wigner_reference
from mixstack.core import config

pytestmark = pytest.mark.skipif(
    config.triton_interpret(), reason="tracing tests run without TRITON_INTERPRET (second process)")

F64 = torch.float64
mixstack.rotate_in      # a public name's first use registers the torch.ops.mixstack operators


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny tensors: one intra-op thread (on a loaded 2-core machine a parallel region of two
    threads can wait tens of milliseconds for its second thread, and gradcheck runs thousands)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


TINY_IN = InCase(N=3, E=5, F=2, C=2, lmax=1, radial="degree", mix="basis2")
TINY_OUT = OutCase(N=3, E=6, F=2, C=2, lmax=1, weight="heads2")


def test_gradcheck_of_rotate_in_with_streams_per_degree_radial_and_a_degree_mix():
    inp = in_inputs(TINY_IN, dtype=F64)
    floats = [inp[k].requires_grad_() for k in ("x", "wigner", "radial", "edge_weight", "kernel", "basis")]

    def fn(x, wigner, radial, ew, kernel, basis):
        return torch.ops.mixstack.rotate_in(x, wigner, radial, inp["src"], None, None, ew, 1, 2, kernel, basis)

    assert torch.autograd.gradcheck(fn, floats)
    assert torch.autograd.gradgradcheck(fn, floats)
    # the basis left out: the backward operator's own reference branch
    assert torch.autograd.gradcheck(lambda x, w, r, ew, k: fn(x, w, r, ew, k, inp["basis"].detach()), floats[:5])


def test_gradcheck_of_rotate_out_with_blocks_heads_order_and_scale():
    inp = out_inputs(TINY_OUT, dtype=F64)
    order = mixstack.edge_order(inp["dst"], TINY_OUT.N)
    floats = [inp[k].requires_grad_() for k in ("y", "wigner", "edge_weight")]

    def fn(y, wigner, ew):
        return torch.ops.mixstack.rotate_out_sum(y, wigner, inp["dst"], ew, TINY_OUT.N, False, 1, True, *order,
                                                 inp["degree_scale"])[0]

    assert torch.autograd.gradcheck(fn, floats)
    assert torch.autograd.gradgradcheck(fn, floats)


def test_streams_and_per_degree_radial_are_per_stream_calls_of_the_plain_operator():
    case = InCase(N=4, E=9, F=3, C=2, lmax=2, radial="degree", mix=None)
    inp = in_inputs(case, dtype=F64)
    u = conv_reference.rotate_in(inp["x"], inp["wigner"], inp["radial"], inp["src"], edge_weight=inp["edge_weight"],
                                 streams=3)
    full = torch.cat((inp["radial"], inp["radial"][:, :, 1:]), 2)             # the |m| = 1 pair reads row l
    for f in range(3):
        plain = conv_reference.rotate_in(inp["x"][..., 2 * f:2 * f + 2], inp["wigner"], full[:, f:f + 1], inp["src"],
                                         edge_weight=inp["edge_weight"])
        torch.testing.assert_close(u[f], plain[0], rtol=1e-14, atol=1e-14)
    none = conv_reference.rotate_in(inp["x"], inp["wigner"], None, inp["src"], streams=3)
    ones = conv_reference.rotate_in(inp["x"], inp["wigner"], torch.ones_like(inp["radial"]), inp["src"], streams=3)
    assert torch.equal(none, ones)


@pytest.mark.parametrize("mix", ["shared", "channel", "basis2"])
def test_the_degree_mix_is_a_loop_over_each_order_blocks_degrees(mix):
    case = InCase(N=3, E=4, F=2, C=3, lmax=2, radial=None, mix=mix, weight=False)
    inp = in_inputs(case, dtype=F64)
    plain = conv_reference.rotate_in(inp["x"], inp["wigner"], None, inp["src"], streams=2)
    mixed = conv_reference.rotate_in(inp["x"], inp["wigner"], None, inp["src"], streams=2,
                                     degree_mix=mixstack.DegreeMix(inp["kernel"], inp["basis"]))
    kernel, basis = inp["kernel"], inp["basis"]
    lmax, wide = case.lmax, case.F * case.C
    want = torch.zeros_like(mixed)
    for e in range(case.E):
        for q in range(wide):
            f, c = divmod(q, case.C)
            wm = [kernel[e, k] @ basis[:, q] if basis is not None else kernel[e, k, 0 if kernel.shape[2] == 1 else q]
                  for k in range(kernel.shape[1])]
            for first, n, kfirst in ((0, lmax + 1, 0), (lmax + 1, lmax, (lmax + 1) ** 2), (2 * lmax + 1, lmax, (lmax + 1) ** 2)):
                for o in range(n):
                    want[f, e, (first + o) * case.C + c] = sum(wm[kfirst + i * n + o] * plain[f, e, (first + i) * case.C + c]
                                                               for i in range(n))
    torch.testing.assert_close(mixed, want, rtol=1e-13, atol=1e-13)


def test_blocks_are_per_stream_sums_with_each_heads_weight_and_the_row_scale():
    case = OutCase(N=4, E=10, F=2, C=4, lmax=1, weight="heads2")
    inp = out_inputs(case, dtype=F64)
    got = conv_reference.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], case.N, edge_weight=inp["edge_weight"],
                                        streams="blocks", degree_scale=inp["degree_scale"])
    rows = 3 * case.lmax + 1
    for f in range(case.F):
        head_weight = inp["edge_weight"][:, f].repeat_interleave(case.C // 2, 1).repeat(1, rows)      # (E, ROW)
        one = conv_reference.rotate_out_sum(inp["y"][:, f:f + 1] * head_weight[:, None], inp["wigner"], inp["dst"],
                                            case.N)
        torch.testing.assert_close(got[..., f * case.C:(f + 1) * case.C], one * inp["degree_scale"][:, None],
                                   rtol=1e-14, atol=1e-14)
    per_stream = conv_reference.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], case.N, streams="blocks",
                                               edge_weight=inp["edge_weight"][:, :, :1].squeeze(2))
    per_head = conv_reference.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], case.N, streams="blocks",
                                             edge_weight=inp["edge_weight"][:, :, :1].expand(-1, -1, 2))
    torch.testing.assert_close(per_stream, per_head, rtol=1e-14, atol=1e-14)


def test_edge_order_is_a_stable_sort_with_each_atoms_offsets_and_needs_no_sorted_dst():
    dst = torch.tensor([2, 0, 2, 1, 0, 2])
    perm, offsets = mixstack.edge_order(dst, 4)
    assert perm.tolist() == [1, 4, 3, 0, 2, 5] and offsets.tolist() == [0, 2, 3, 6, 6]
    empty = mixstack.edge_order(torch.zeros(0, dtype=torch.int64), 3)
    assert empty.perm.shape == (0,) and empty.offsets.tolist() == [0, 0, 0, 0]
    case = OutCase(N=5, E=12, F=2, C=2, lmax=1, weight="edge", blocks=False)
    inp = out_inputs(case, dtype=F64)
    order = mixstack.edge_order(inp["dst"], case.N)
    with mixstack.use_level(1):          # on the CPU: the operator's reference body
        got = mixstack.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], case.N, edge_weight=inp["edge_weight"],
                                      order=order)
    want = conv_reference.rotate_out_sum(inp["y"][order.perm], inp["wigner"][order.perm], inp["dst"][order.perm],
                                         case.N, edge_weight=inp["edge_weight"][order.perm])
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)


def test_sezm_signs_follow_the_parity_rule_and_flip_the_m_plus_1_row():
    signs = convention_signs(2)
    # columns l^2 + l + m: l = 1 (m = -1, 0, 1), l = 2 (m = -2 .. 2)
    assert signs[1].tolist() == [1, 1, 1, -1, -1, 1, 1, -1, 1]
    assert torch.equal(signs[0], signs[1]) and torch.equal(signs[2], -signs[1])
    vec = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert torch.equal(edge_wigner_reference(vec, 2, convention="sezm"), edge_wigner_reference(vec, 2) * signs)
    with mixstack.use_level(0):
        assert torch.equal(mixstack.edge_wigner(vec, 2, convention="sezm"), edge_wigner_reference(vec, 2) * signs)


def test_level_0_logs_the_reference_for_the_new_features():
    inp = in_inputs(TINY_IN)
    with mixstack.use_level(0), mixstack.dispatch_log() as log:
        u = mixstack.rotate_in(inp["x"].requires_grad_(), inp["wigner"], inp["radial"], inp["src"], streams=2,
                               degree_mix=mixstack.DegreeMix(inp["kernel"], inp["basis"]))
        u.sum().backward()
    assert log == {"conv_in:reference": 1, "conv_in_bwd:reference": 1}


def _in_call(inp, **changes):
    args = {"x": inp["x"], "wigner": inp["wigner"], "radial": inp["radial"], "src": inp["src"], "streams": 2,
            "degree_mix": mixstack.DegreeMix(inp["kernel"], inp["basis"])}
    args.update(changes)
    return lambda: mixstack.rotate_in(args.pop("x"), args.pop("wigner"), args.pop("radial"), args.pop("src"), **args)


@pytest.mark.parametrize("changes, error, match", [
    (lambda i: {"streams": 3}, ValueError, r"x must have F\*C channels with F = streams = 3"),
    (lambda i: {"streams": 0}, ValueError, "streams must be None or a positive int"),
    (lambda i: {"radial": i["radial"][:, :1]}, ValueError, "radial must have F = streams = 2"),
    (lambda i: {"radial": i["radial"][:, :, :1]}, ValueError, "radial must have shape"),
    (lambda i: {"degree_mix": (i["kernel"], None)}, TypeError, "degree_mix must be a mixstack.DegreeMix"),
    (lambda i: {"degree_mix": mixstack.DegreeMix(i["kernel"][:, 1:])}, ValueError, "degree_mix.kernel must have shape"),
    (lambda i: {"degree_mix": mixstack.DegreeMix(i["kernel"])}, ValueError, "degree_mix.kernel must have R = 1"),
    (lambda i: {"degree_mix": mixstack.DegreeMix(i["kernel"], i["basis"][:, 1:])}, ValueError,
     "degree_mix.basis must have shape"),
    (lambda i: {"x": i["x"][..., :2], "streams": None, "radial": i["radial"]}, ValueError,
     "degree_mix needs streams=F"),
    (lambda i: {"edge_scalar": torch.ones(5, 2), "scalar_weight": torch.ones(5, 2, 2, 2)}, ValueError,
     "edge_scalar goes without streams"),
    (lambda i: {"radial": mixstack.LinearRadial(torch.ones(5, 3), torch.ones(2, 3, 2, 3), torch.ones(2, 3, 2))},
     ValueError, "a LinearRadial radial goes without streams and degree_mix"),
])
def test_rotate_in_names_the_argument_it_cannot_take(changes, error, match):
    inp = in_inputs(TINY_IN)
    with pytest.raises(error, match=match):
        _in_call(inp, **changes(inp))()


@pytest.mark.parametrize("changes, error, match", [
    (lambda i: {"streams": "apart"}, ValueError, "streams must be 'sum'"),
    (lambda i: {"streams": "sum"}, ValueError, r"needs streams='blocks'"),
    (lambda i: {"edge_weight": i["edge_weight"][:, :, :1].expand(-1, -1, 3)}, ValueError,
     "H heads dividing the C = 2 channels"),
    (lambda i: {"edge_weight": i["edge_weight"][:, :1]}, ValueError, "edge_weight must have shape"),
    (lambda i: {"order": (i["dst"], i["dst"])}, TypeError, "order must be a mixstack.EdgeOrder"),
    (lambda i: {"order": mixstack.EdgeOrder(i["dst"], i["dst"][:3])}, ValueError, r"order.offsets must have shape"),
    (lambda i: {"order": mixstack.EdgeOrder(i["dst"][:2], torch.zeros(4, dtype=torch.int64))}, ValueError,
     "order.perm must have shape"),
    (lambda i: {"degree_scale": torch.ones(3)}, ValueError, "degree_scale must have shape"),
    (lambda i: {"degree_scale": torch.ones(4, requires_grad=True)}, ValueError, "degree_scale is a constant factor"),
])
def test_rotate_out_sum_names_the_argument_it_cannot_take(changes, error, match):
    inp = out_inputs(TINY_OUT)
    kw = {"edge_weight": inp["edge_weight"], "streams": "blocks", "order": None, "degree_scale": None}
    kw.update(changes(inp))
    with pytest.raises(error, match=match):
        mixstack.rotate_out_sum(inp["y"], inp["wigner"], inp["dst"], TINY_OUT.N, **kw)


def test_edge_order_and_edge_wigner_name_their_arguments():
    with pytest.raises(TypeError, match="dst must be a 1-d int64 or int32 tensor"):
        mixstack.edge_order(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="n_atoms must be an int >= 0"):
        mixstack.edge_order(torch.zeros(3, dtype=torch.int64), -1)
    with pytest.raises(ValueError, match="convention must be 'mixstack' or 'sezm'"):
        mixstack.edge_wigner(torch.randn(3, 3), 2, convention="e3nn")


def test_opcheck_of_the_forward_operators_with_their_later_arguments():
    # not test_aot_dispatch_*, and no opcheck of the backward operators with these arguments: their
    # tensor-op branch (this CPU's) is a functorch vjp of the forward formulas (an operator's body
    # runs below autograd), which fake-tensor tracing and schema checks cannot take (as
    # tests/test_edge_wigner.py); their kernels' branch has none (tests/interpret).  Their bodies
    # against autograd: the next test.
    forward_utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    inp = in_inputs(TINY_IN)
    args = (inp["x"].requires_grad_(), inp["wigner"], inp["radial"], inp["src"], None, None, inp["edge_weight"], 1, 2,
            inp["kernel"], inp["basis"])
    torch.library.opcheck(torch.ops.mixstack.rotate_in, args, test_utils=forward_utils)
    out_inp = out_inputs(TINY_OUT)
    order = mixstack.edge_order(out_inp["dst"], TINY_OUT.N)
    out_args = (out_inp["y"].requires_grad_(), out_inp["wigner"], out_inp["dst"], out_inp["edge_weight"], TINY_OUT.N,
                False, 1, True, *order, out_inp["degree_scale"])
    torch.library.opcheck(torch.ops.mixstack.rotate_out_sum, out_args, test_utils=forward_utils)
    torch.library.opcheck(torch.ops.mixstack.edge_wigner,
                          (torch.randn(5, 3, requires_grad=True), mixstack.conv.functional.edge_wigner_constants(2),
                           2, 1, True), test_utils=forward_utils)


def test_the_backward_operators_reference_bodies_are_autograds_gradients():
    inp = in_inputs(TINY_IN, dtype=F64)
    leaves = [inp[k].requires_grad_() for k in ("x", "wigner", "radial", "edge_weight", "kernel")]
    x, wigner, radial, ew, kernel = leaves
    u = conv_reference.rotate_in(x, wigner, radial, inp["src"], edge_weight=ew, streams=2,
                                 degree_mix=mixstack.DegreeMix(kernel, inp["basis"]))
    gu = torch.randn(u.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    want = torch.autograd.grad(u, leaves, gu)
    got = torch.ops.mixstack.rotate_in_backward(gu, x.detach(), wigner.detach(), radial.detach(), inp["src"], None,
                                                None, ew.detach(), [True, True, True, False, False, True, True], 1,
                                                kernel.detach(), inp["basis"])
    for a, b in zip((got[0], got[1], got[2], got[5], got[6]), want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    out_inp = out_inputs(TINY_OUT, dtype=F64)
    y, w, e = (out_inp[k].requires_grad_() for k in ("y", "wigner", "edge_weight"))
    out = conv_reference.rotate_out_sum(y, w, out_inp["dst"], TINY_OUT.N, edge_weight=e, streams="blocks",
                                        degree_scale=out_inp["degree_scale"])
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    want = torch.autograd.grad(out, (y, w, e), go)
    got = torch.ops.mixstack.rotate_out_sum_backward(go, y.detach(), w.detach(), out_inp["dst"], e.detach(),
                                                     [True, True, True], 1, True, out_inp["degree_scale"])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_double_backward_takes_partial_derivatives_where_one_input_depends_on_another():
    """Force-loss training: the stack's result ``y`` is computed from the Wigner rows that rotate it
    back.  The operators' graph-building backward must give the partial derivative in each input
    (not also the path through ``y``): the second-order gradients equal the reference formulas'
    under plain autograd."""
    cin, cout = InCase(N=3, E=6, F=2, C=2, lmax=1, mix="basis1", radial=None), TINY_OUT
    inp, out_inp = in_inputs(cin, dtype=F64), out_inputs(cout, dtype=F64)

    def second(rotate_in, rotate_out):
        x, wigner = inp["x"].clone().requires_grad_(), inp["wigner"].clone().requires_grad_()
        u = rotate_in(x, wigner)                                                  # (F, E, ROW)
        y = u.transpose(0, 1).tanh()                                              # y from the Wigner rows
        out = rotate_out(y, wigner)
        gx, gw = torch.autograd.grad(out.square().sum(), (x, wigner), create_graph=True)
        return torch.autograd.grad(gx.square().sum() + gw.square().sum(), (x, wigner))

    mix = (inp["kernel"], inp["basis"])
    order = mixstack.edge_order(out_inp["dst"], cout.N)
    got = second(lambda x, w: torch.ops.mixstack.rotate_in(x, w, None, inp["src"], None, None, None, 1, 2, *mix),
                 lambda y, w: torch.ops.mixstack.rotate_out_sum(y, w, out_inp["dst"], out_inp["edge_weight"], cout.N,
                                                                False, 1, True, *order, out_inp["degree_scale"])[0])
    want = second(lambda x, w: conv_reference.rotate_in(x, w, None, inp["src"], streams=2,
                                                        degree_mix=mixstack.DegreeMix(*mix)),
                  lambda y, w: conv_reference.rotate_out_sum(y, w, out_inp["dst"], cout.N, streams="blocks",
                                                             edge_weight=out_inp["edge_weight"],
                                                             degree_scale=out_inp["degree_scale"]))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)
