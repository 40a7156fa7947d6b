"""The exact levels' products on cuBLAS (``tuning.products``, forced) at a wide key: float64
accuracy, level 2 bit for bit level 1, run to run, TF32 kept off whatever the caller set, a
CUDA graph's replay against the eager call, and a compiled program (Triton's products) against it
to float32 rounding.  Skipped without CUDA."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel

import mixstack
from mixstack.tuning.products import use_products

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
WIDE = Case(F=1, E=3001, Cf=112, lmax=4, n_layers=4, apply_alpha=True)     # blocks 560 and 896 wide
NAMES = ("out", "grad_u0", "grad_alpha")


def _run(level, case=WIDE, seed=0):
    """One forward and backward at ``level`` with the products on cuBLAS: ``(out, grad_u0, grad_alpha)``."""
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, seed, device=DEV)
    u0.requires_grad_()
    alpha.requires_grad_()
    with use_products("blas"), mixstack.use_level(level):
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, **case.kw)
        grads = torch.autograd.grad(out, (u0, alpha), helpers.make_grad_out(case, seed + 100, device=DEV))
    return (out.detach(), *grads)


def _same(a, b):
    return [n for n, x, y in zip(NAMES, a, b) if not torch.equal(x, y)]


def test_gpu_blas_products_match_float64_and_level2_gives_level1s_bits_run_to_run():
    one = _run(1)
    inputs = helpers.make_inputs(WIDE, 0, device=DEV)
    out, grads = helpers.reference64(WIDE, inputs, helpers.make_grad_out(WIDE, 100, device=DEV))
    for name, got, want in zip(NAMES, one, (out, grads["u0"], grads["alpha"])):
        assert_close_rel(got, want, name)
    assert _same(one, _run(1)) == []
    assert _same(one, _run(2)) == []


def test_gpu_blas_products_stay_ieee_when_the_caller_turned_tf32_on():
    want = _run(1)
    try:
        torch.set_float32_matmul_precision("high")            # TF32 for every fp32 matmul of the caller's
        got = _run(1)
    finally:
        torch.set_float32_matmul_precision("highest")
    assert _same(got, want) == []


def test_gpu_blas_products_replayed_from_a_cuda_graph_give_the_eager_bits():
    u0, alpha, w0, w1, gw = helpers.make_inputs(WIDE, 0, device=DEV)
    g = helpers.make_grad_out(WIDE, 100, device=DEV)
    x = u0.clone().requires_grad_()

    def step():
        out = mixstack.mixing_stack(x, alpha, w0, w1, gw, **WIDE.kw)
        return out.detach(), torch.autograd.grad(out, x, g)[0]

    with use_products("blas"), mixstack.use_level(1):
        want = step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()                                              # warm-up on the capture's stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):          # captured where it warmed up (cuBLAS's workspace)
            captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, want))


def test_gpu_a_compiled_program_at_a_blas_key_matches_the_eager_call():
    """A compiler's trace takes Triton's products (``tuning.products.on_blas``): the compiled
    program agrees with the eager BLAS call to float32 rounding."""
    torch._dynamo.reset()
    u0, alpha, w0, w1, gw = helpers.make_inputs(WIDE, 0, device=DEV)
    g = helpers.make_grad_out(WIDE, 100, device=DEV)

    def forces(u0, alpha):
        u0 = u0.detach().requires_grad_()
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, **WIDE.kw)
        return out, torch.autograd.grad(out, u0, g)[0]

    with use_products("blas"), mixstack.use_level(1):
        want = forces(u0, alpha)
        got = torch.compile(forces, fullgraph=False)(u0, alpha)
    for name, a, b in zip(NAMES, got, want):
        assert_close_rel(a, b, name)
