"""Deployment tracing on CPU (docs/contract.md §6): ``torch.compile(fullgraph=True, dynamic=True)``,
``torch.export`` with a dynamic edge count, and ``torch.library.opcheck`` of both ops.

CPU tensors, no interpreter: the ops run their reference branch, which is what
lets their registration, fake implementations and autograd be traced here.
"""

from __future__ import annotations

import helpers
import pytest
import torch
from helpers import Case
from torch._dynamo.utils import counters

import mixstack
from mixstack.core import config

pytestmark = pytest.mark.skipif(
    config.triton_interpret(), reason="tracing tests run without TRITON_INTERPRET (second process)")

CASE = Case(F=2, E=7, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
OTHER_E = 11


class _Stack(torch.nn.Module):
    """Calls ``mixstack.mixing_stack`` (``op=False``) or the custom op directly (``op=True``)."""

    def __init__(self, case: Case, op: bool, level: int = 1):
        super().__init__()
        _, _, w0, w1, gw = helpers.make_inputs(case)
        self.w0, self.w1, self.gw = (torch.nn.Parameter(t, requires_grad=False) for t in (w0, w1, gw))
        self.case, self.op, self.level = case, op, level

    def forward(self, u0, alpha):
        c = self.case
        if self.op:
            return torch.ops.mixstack.stack_forward(u0, alpha, self.w0, self.w1, self.gw, c.lmax, c.Cf,
                                                    c.apply_alpha, self.level)[0]
        return mixstack.mixing_stack(u0, alpha, self.w0, self.w1, self.gw, **c.kw)


def _fwd_bwd(fn, case: Case, seed: int):
    u0, alpha, *_ = helpers.make_inputs(case, seed)
    u0.requires_grad_()
    alpha.requires_grad_()
    out = fn(u0, alpha)
    gu, ga = torch.autograd.grad(out, (u0, alpha), helpers.make_grad_out(case, seed + 100))
    return out.detach(), gu, ga


@pytest.mark.parametrize("op", [False, True], ids=["mixing_stack", "custom-op"])
def test_compiled_fullgraph_dynamic_matches_eager_across_edge_counts_without_recompiling(op):
    torch._dynamo.reset()
    counters.clear()
    mod = _Stack(CASE, op)
    compiled = torch.compile(mod, fullgraph=True, dynamic=True)
    with mixstack.use_level(1):
        for i, n_edges in enumerate((CASE.E, OTHER_E)):
            case = Case(CASE.F, n_edges, CASE.Cf, CASE.lmax, CASE.n_layers, CASE.apply_alpha)
            got = _fwd_bwd(compiled, case, seed=i)
            want = _fwd_bwd(mod, case, seed=i)
            for name, g, w in zip(("out", "grad_u0", "grad_alpha"), got, want):
                assert g.shape == w.shape, name
                helpers.assert_close_rel(g, w, f"{name} (E={n_edges})")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_exported_program_with_dynamic_edge_dim_runs_at_another_edge_count():
    mod = _Stack(CASE, op=True)
    u0, alpha, *_ = helpers.make_inputs(CASE)
    n_edges = torch.export.Dim("n_edges", min=2)
    ep = torch.export.export(mod, (u0, alpha), dynamic_shapes={"u0": {1: n_edges}, "alpha": {0: n_edges}})
    assert torch.ops.mixstack.stack_forward.default in {n.target for n in ep.graph.nodes}
    run = ep.module()
    for n_e in (CASE.E, OTHER_E, 2):
        case = Case(CASE.F, n_e, CASE.Cf, CASE.lmax, CASE.n_layers, CASE.apply_alpha)
        u0, alpha, *_ = helpers.make_inputs(case, seed=n_e)
        got = run(u0, alpha)
        assert got.shape == (n_e, CASE.F, CASE.row)
        helpers.assert_close_rel(got, mod(u0, alpha), f"exported (E={n_e})")


def test_exported_mixing_stack_module_runs_at_another_edge_count():
    mod = _Stack(CASE, op=False)
    u0, alpha, *_ = helpers.make_inputs(CASE)
    n_edges = torch.export.Dim("n_edges", min=2)
    with mixstack.use_level(1):
        ep = torch.export.export(mod, (u0, alpha), dynamic_shapes={"u0": {1: n_edges},
                                                                   "alpha": {0: n_edges}})
        u0, alpha, *_ = helpers.make_inputs(Case(CASE.F, OTHER_E, CASE.Cf, CASE.lmax, CASE.n_layers), 5)
        helpers.assert_close_rel(ep.module()(u0, alpha), mod(u0, alpha), "exported mixing_stack")


OPCHECK_CASES = [CASE, Case(F=1, E=5, Cf=16, lmax=2, n_layers=1, apply_alpha=False)]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=helpers.case_id)
def test_opcheck_stack_forward(case):
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    u0.requires_grad_()
    alpha.requires_grad_()
    torch.library.opcheck(torch.ops.mixstack.stack_forward, (u0, alpha, w0, w1, gw, *case.op_args, 1))


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=helpers.case_id)
def test_opcheck_stack_backward(case):
    inputs = helpers.make_inputs(case)
    _, z, y = torch.ops.mixstack.stack_forward(*inputs, *case.op_args, 1)
    grad_out = helpers.make_grad_out(case)
    torch.library.opcheck(torch.ops.mixstack.stack_backward,
                          (grad_out, y, z, inputs[1], list(inputs[2:]), case.op_spec(1), [False, False],
                           None, None, None))


def test_a_kernel_target_makes_a_cpu_trace_record_the_operators_that_run_their_reference():
    """``guards.kernel_target("cuda")``: a ``make_fx`` trace on CPU tensors records the stack's
    ``mixstack::`` operators (as for a package compiled for the GPU) where it otherwise records the
    reference formulas; the traced graph, run on the CPU, gives the same call's eager results bit
    for bit (the operators' reference branch), and level 0's to float32 rounding."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixstack.dispatch import guards

    u0, alpha, w0, w1, gw = helpers.make_inputs(CASE, seed=3)

    def forces(u0, alpha):
        u0 = u0.detach().requires_grad_(True)
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, lmax=CASE.lmax, focus_dim=CASE.Cf)
        return out, torch.autograd.grad(out.square().sum(), [u0])[0]

    def traced_ops(**target):
        ctx = guards.kernel_target(**target) if target else torch.enable_grad()
        with mixstack.use_level(2), ctx:
            graph = make_fx(forces, tracing_mode="symbolic", _allow_non_fake_inputs=True)(u0, alpha)
        return graph, {str(n.target) for n in graph.graph.nodes if "mixstack" in str(n.target)}

    plain = traced_ops()[1]
    graph, ops = traced_ops(device="cuda")
    assert plain == set() and ops == {"mixstack.stack_forward.default", "mixstack.stack_backward.default"}
    with mixstack.use_level(2), guards.kernel_target("cuda"):
        eager = forces(u0, alpha)
    with mixstack.use_level(0):
        level0 = forces(u0, alpha)
    replayed = graph(u0, alpha)
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(replayed, level0))
    with pytest.raises(ValueError, match="must be a CUDA device"):
        with guards.kernel_target("cpu"):
            pass


def test_a_persistent_launchs_program_count_stays_symbolic_in_a_trace():
    """Traced with a dynamic edge count (make_fx, as deepmd-kit's compiled inference and
    ``mixstack.freeze`` trace), the persistent kernels' program count is the traced expression
    ``max(1, min(tiles, cap))``, not the branch the example size took."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixstack.stack.gemm import persistent_programs
    from mixstack.tuning.configs import INTERPRETER_PROGRAMS

    def programs(x):
        return x.new_empty((persistent_programs(x, x.shape[0], 4), 1))

    assert INTERPRETER_PROGRAMS == 3
    for example in (2, 50):                       # below and above the cap (size 1 would be specialised)
        traced = make_fx(programs, tracing_mode="symbolic")(torch.zeros(example))
        assert [traced(torch.zeros(n)).shape[0] for n in (2, 50)] == [2, 3]


def test_a_kernel_target_takes_the_convolutions_kernels_without_a_warning(monkeypatch):
    """Under a kernel target the convolution's operators take the level (a trace records them and
    the GPU package compiles their kernels) without a "level N runs the reference" warning in a
    freeze's log, except where their kernels cannot take the shape; an eager CPU call outside one
    still warns and runs the reference."""
    import warnings

    from mixstack.dispatch import guards, log

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(log, "_warned", set())
    t = torch.zeros(3)
    with mixstack.use_level(2), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with guards.kernel_target("cuda"):
            assert guards.conv_level(t, 16) == 2
            assert guards.conv_level(t, guards.MAX_CONV_CHANNELS + 1) == 0
            assert guards.conv_level(t.double(), 16) == 0
        assert not [w for w in seen if "runs the reference" in str(w.message)]
        assert guards.conv_level(t, 16) == 0
    ran_reference = [str(w.message) for w in seen if "runs the reference" in str(w.message)]
    assert len(ran_reference) == 1 and "level 2 runs the reference" in ran_reference[0]
