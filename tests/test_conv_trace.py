"""The convolution's reference formulas under a trace: no per-edge batched products (which
Inductor lowers to hundreds of tiny cuBLAS launches), the same values as eagerly."""

from __future__ import annotations

import pytest
import torch
from conv_cases import InCase, OutCase, in_inputs, out_inputs
from torch.fx.experimental.proxy_tensor import make_fx

import mixstack
from mixstack.conv.reference import contract

BATCHED = {torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}


def _batched_products(graph) -> list:
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target in BATCHED]


@pytest.mark.parametrize("spec, shapes", [
    ("ekn,enc->ekc", [(7, 3, 5), (7, 5, 4)]),
    ("ekn,ekc->enc", [(7, 3, 5), (7, 3, 4)]),
    ("ekc,enc->ekn", [(7, 3, 4), (7, 5, 4)]),
    ("eiofc,efic->efoc", [(7, 3, 3, 2, 4), (7, 2, 3, 4)]),
])
def test_contract_is_the_einsum_eagerly_and_a_reduction_under_a_trace(spec, shapes):
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes)
    want = torch.einsum(spec, a, b)
    assert torch.equal(contract(spec, a, b), want)                         # eagerly: the einsum itself
    for mode in ("real", "fake", "symbolic"):
        graph = make_fx(lambda x, y: contract(spec, x, y), tracing_mode=mode)(a, b)
        assert not _batched_products(graph), (mode, graph.code)
        assert not any(n.target is torch.ops.aten.mm.default for n in graph.graph.nodes), graph.code
        torch.testing.assert_close(graph(a, b), want, rtol=1e-12, atol=1e-12)


def _values(op, inp: dict, floats: list, cotangent):
    """``op``'s output and the gradients of ``floats`` for ``cotangent`` (``torch.func.vjp``)."""
    def f(*xs):
        return op({**inp, **dict(zip(floats, xs))})
    out, pull = torch.func.vjp(f, *(inp[k] for k in floats))
    return (out, *pull(cotangent))


def _check_trace(op, inp: dict):
    floats = [k for k, v in inp.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    ints = [k for k, v in inp.items() if isinstance(v, torch.Tensor) and not v.is_floating_point()]
    with mixstack.use_level(0):
        out = op(inp)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        want = _values(op, inp, floats, cot)

        def traced(cotangent, *tensors):
            return _values(op, {**inp, **dict(zip(floats + ints, tensors))}, floats, cotangent)
        args = (cot, *(inp[k] for k in floats + ints))
        graph = make_fx(traced, tracing_mode="symbolic")(*args)
        got = graph(*args)
    assert not _batched_products(graph), graph.code
    assert len(got) == len(want) == 1 + len(floats)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("case", [InCase(N=5, E=9, F=2, C=4, lmax=2, radial="full", mix="basis1"),
                                  InCase(N=5, E=9, F=1, C=4, lmax=3, radial="degree", mix="channel", streams=False)],
                         ids=str)
def test_rotate_in_and_its_backward_trace_without_batched_products(case):
    inp = in_inputs(case, dtype=torch.float64)

    def op(d):
        mix = None if d["kernel"] is None else mixstack.DegreeMix(d["kernel"], d.get("basis"))
        return mixstack.rotate_in(d["x"], d["wigner"], d["radial"], d["src"], edge_weight=d["edge_weight"],
                                  streams=case.F if case.streams else None, degree_mix=mix)
    _check_trace(op, {k: v for k, v in inp.items() if v is not None} | {"kernel": inp["kernel"]})


@pytest.mark.parametrize("case", [OutCase(N=5, E=9, F=2, C=4, lmax=2, weight="edge", blocks=False, order=False,
                                          scale=False)], ids=str)
def test_rotate_out_sum_and_its_backward_trace_without_batched_products(case):
    inp = out_inputs(case, dtype=torch.float64)

    def op(d):
        return mixstack.rotate_out_sum(d["y"], d["wigner"], d["dst"], case.N, edge_weight=d["edge_weight"],
                                       streams="sum")
    _check_trace(op, {k: v for k, v in inp.items() if v is not None})


def test_a_kernel_target_trace_records_the_convolutions_operators():
    """Under ``kernel_target("cuda")`` a CPU trace (as deepmd-kit's freeze makes for a GPU package)
    records ``mixstack::rotate_in``, ``rotate_out_sum`` and their backwards, whose kernels the
    package compiles; without it, the reference formulas.  The graph run on the CPU (the
    operators' reference branch) gives the eager values."""
    from mixstack.dispatch import guards

    case = InCase(N=5, E=9, F=1, C=16, lmax=2, radial="full", mix=None, streams=False)
    inp = in_inputs(case, dtype=torch.float32)
    dst = torch.sort(inp["src"].flip(0))[0]

    def frame(x, wigner, radial):
        x = x.detach().requires_grad_(True)
        u = mixstack.rotate_in(x, wigner, radial, inp["src"])
        agg = mixstack.rotate_out_sum(u.transpose(0, 1), wigner, dst, case.N)
        return agg, torch.autograd.grad(agg.square().sum(), [x])[0]

    def traced(**target):
        ctx = guards.kernel_target(**target) if target else torch.enable_grad()
        with mixstack.use_level(2), ctx, torch.enable_grad():
            graph = make_fx(frame, tracing_mode="symbolic", _allow_non_fake_inputs=True)(
                inp["x"], inp["wigner"], inp["radial"])
        return graph, {str(n.target) for n in graph.graph.nodes if "mixstack" in str(n.target)}

    args = (inp["x"], inp["wigner"], inp["radial"])
    plain, plain_ops = traced()
    graph, ops = traced(device="cuda")
    assert plain_ops == set()
    assert {"mixstack.rotate_in.default", "mixstack.rotate_out_sum.default",
            "mixstack.rotate_in_backward.default", "mixstack.rotate_out_sum_backward.default"} <= ops, ops
    with mixstack.use_level(0), torch.enable_grad():
        want = frame(*args)
    for got in (graph(*args), plain(*args)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
