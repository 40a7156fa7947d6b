"""torch.compile, torch.export and opcheck with CUDA tensors at level 1 (the ops run
their Triton kernels).  Skipped without CUDA."""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case, assert_close_rel
from torch._dynamo.utils import counters

import mixstack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
CASE = Case(F=2, E=4097, Cf=32, lmax=3, n_layers=4, apply_alpha=True)
EDGE_COUNTS = (4097, 5003)


def _with_edges(n_edges: int) -> Case:
    return Case(CASE.F, n_edges, CASE.Cf, CASE.lmax, CASE.n_layers, CASE.apply_alpha)


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _, _, w0, w1, gw = helpers.make_inputs(CASE, device=DEV)
        self.w0, self.w1, self.gw = (torch.nn.Parameter(t, requires_grad=False) for t in (w0, w1, gw))

    def forward(self, u0, alpha):
        return mixstack.mixing_stack(u0, alpha, self.w0, self.w1, self.gw, **CASE.kw)


def _fwd_bwd(fn, case, seed):
    u0, alpha, *_ = helpers.make_inputs(case, seed, device=DEV)
    u0.requires_grad_()
    alpha.requires_grad_()
    out = fn(u0, alpha)
    gu, ga = torch.autograd.grad(out, (u0, alpha), helpers.make_grad_out(case, seed + 100, device=DEV))
    return out.detach(), gu, ga


def test_gpu_compiled_level1_matches_eager_across_edge_counts_without_recompiling():
    torch._dynamo.reset()
    counters.clear()
    mod = _Stack()
    compiled = torch.compile(mod, fullgraph=True, dynamic=True)
    with mixstack.use_level(1):
        for seed, n_edges in enumerate(EDGE_COUNTS):
            case = _with_edges(n_edges)
            got = _fwd_bwd(compiled, case, seed)
            with mixstack.dispatch_log() as log:
                want = _fwd_bwd(mod, case, seed)
            assert log == {"fwd:triton": 1, "bwd:relay": 1}
            for name, g, w in zip(("out", "grad_u0", "grad_alpha"), got, want):
                # same Triton kernels, same configs: expected bitwise; allow rounding-level slack
                assert_close_rel(g, w, f"compiled {name} (E={n_edges})", tol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_gpu_exported_level1_program_runs_at_another_edge_count():
    mod = _Stack()
    u0, alpha, *_ = helpers.make_inputs(CASE, device=DEV)
    n_edges = torch.export.Dim("n_edges", min=2)
    with mixstack.use_level(1):
        ep = torch.export.export(mod, (u0, alpha), dynamic_shapes={"u0": {1: n_edges},
                                                                   "alpha": {0: n_edges}})
        assert torch.ops.mixstack.stack_forward.default in {n.target for n in ep.graph.nodes}
        case = _with_edges(EDGE_COUNTS[1])
        u0, alpha, *_ = helpers.make_inputs(case, 7, device=DEV)
        got = ep.module()(u0, alpha)
        want = mod(u0, alpha)
    assert torch.equal(got, want)                    # the same level-1 kernels: the same bits
    assert_close_rel(got, helpers.reference64(case, (u0, alpha, mod.w0, mod.w1, mod.gw))[0],
                     "exported forward")


def test_gpu_opcheck_stack_forward_and_stack_backward():
    case = Case(F=2, E=257, Cf=32, lmax=2, n_layers=3, apply_alpha=True)
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, device=DEV)
    u0.requires_grad_()
    alpha.requires_grad_()
    torch.library.opcheck(torch.ops.mixstack.stack_forward, (u0, alpha, w0, w1, gw, *case.op_args, 1))
    _, z, y = torch.ops.mixstack.stack_forward(u0.detach(), alpha.detach(), w0, w1, gw, *case.op_args, 1)
    grad_out = helpers.make_grad_out(case, device=DEV)
    torch.library.opcheck(torch.ops.mixstack.stack_backward,
                          (grad_out, y, z, alpha.detach(), [w0, w1, gw], case.op_spec(1), [False, False],
                           None, None, None))


@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
def test_gpu_compiled_level3_on_the_tma_kernel_gives_the_eager_bits(persistent):
    """Level 3 with a ``stack_compensated_tma`` entry under ``torch.compile``: Inductor launches
    the TMA kernel (its descriptors need Triton's scratch allocator at run time) with the eager
    call's bits.  Skipped where this Triton does not build the kernel."""
    from mixstack import tuning
    from mixstack.tuner.sweep import build_reason
    key = tuning.shape_key(focus_dim=CASE.Cf, lmax=CASE.lmax, n_focus=CASE.F, apply_alpha=CASE.apply_alpha)
    tile = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}      # a form the GPU found right
    torch._dynamo.reset()
    mod = _Stack()
    with mixstack.use_level(3), tuning.registration("stack_compensated", key, tile), \
            tuning.registration("stack_compensated_tma", key, dict(tile, persistent=persistent, specialised=True)):
        try:
            with mixstack.dispatch_log() as log:
                want = _fwd_bwd(mod, CASE, 3)
        except Exception as exc:                # noqa: BLE001 - a build refusal is a skip
            if build_reason(exc):
                pytest.skip(f"this Triton does not build the TMA kernel: {build_reason(exc)}")
            raise
        assert log.get("level3:tma") == 2
        got = _fwd_bwd(torch.compile(mod, fullgraph=True), CASE, 3)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
