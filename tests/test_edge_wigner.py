"""``mixstack.edge_wigner`` on the CPU without the interpreter: level 0 equals the potential's
formulas, the argument checks, the recursion as constant matrices (``step_matrices``) against
``_step`` in float64, and the two ``mixstack::`` operators under ``opcheck`` and
``torch.compile`` (their bodies run the tensor-op formulas here; the kernels are tested in
tests/interpret and tests/gpu)."""

from __future__ import annotations

import helpers
import pytest
import torch
from torch._dynamo.utils import counters

import mixstack
from mixstack.conv import frames as W
from mixstack.core import config
from mixstack.potential.frames import edge_frames, pack_rows, wigner_rows

pytestmark = pytest.mark.skipif(
    config.triton_interpret(), reason="tracing tests run without TRITON_INTERPRET (second process)")


@pytest.mark.parametrize("lmax", range(2, 7))
def test_step_matrices_reproduce_the_recursion_step_in_float64(lmax):
    g = torch.Generator().manual_seed(lmax)
    for l in range(2, lmax + 1):
        K = W.step_matrices(l, lmax)
        C, s = W.step_constants(lmax)[l]
        rows_in = W._kept(l - 1, lmax, 1)
        M = torch.randn(6, 2 * rows_in + 1, 2 * l - 1, generator=g, dtype=torch.float64)
        R1 = torch.randn(6, 3, 3, generator=g, dtype=torch.float64)          # any matrix: bilinear
        want = W._step(R1, M, C, s).flatten(1)
        got = torch.einsum("eij,ep,ijpq->eq", R1, M.flatten(1), K)
        assert (got - want).abs().max() <= 1e-14 * want.abs().max()
        # negative control: the same check sees one entry of K with its sign flipped
        bad = K.clone()
        bad.view(-1)[bad.abs().argmax()] *= -1
        assert (torch.einsum("eij,ep,ijpq->eq", R1, M.flatten(1), bad) - want).abs().max() > 1e-3


def test_level_zero_is_the_potentials_formulas_and_logs_the_reference():
    vec = helpers.edge_vectors(17, dtype=torch.float64).requires_grad_(True)
    with mixstack.use_level(0), mixstack.dispatch_log() as log:
        w = mixstack.edge_wigner(vec, 3)
        w.sum().backward()
    assert dict(log) == {"wigner:reference": 1, "wigner_bwd:reference": 1}
    assert torch.equal(w, pack_rows(wigner_rows(edge_frames(vec), 3, keep=1)))


@pytest.mark.parametrize("vec, lmax, error, match", [
    ([[1.0, 0.0, 0.0]], 2, TypeError, "vec must be a torch.Tensor"),
    (torch.ones(4, 3, dtype=torch.int64), 2, TypeError, "vec must have a floating dtype"),
    (torch.ones(4, 2), 2, ValueError, r"vec must have shape \(E, 3\)"),
    (torch.ones(4, 3, 1), 2, ValueError, "vec must have rank 2"),
    (torch.ones(4, 3), 0, ValueError, "lmax must be an int in 1..6"),
    (torch.ones(4, 3), 7, ValueError, "lmax must be an int in 1..6"),
    (torch.ones(4, 3), 2.0, ValueError, "lmax must be an int in 1..6"),
])
def test_edge_wigner_names_the_argument_it_cannot_take(vec, lmax, error, match):
    with pytest.raises(error, match=match):
        mixstack.edge_wigner(vec, lmax)


def test_opcheck_of_both_operators():
    vec = helpers.edge_vectors(7).requires_grad_(True)
    steps = mixstack.conv.functional.edge_wigner_constants(2)
    # not test_aot_dispatch_*, and no opcheck of the backward operator: they run its tensor-op
    # branch (this CPU's, a functorch vjp, since an operator's body runs below autograd) under
    # fake-tensor and schema-check modes, which cannot take functorch's wrappers; its
    # kernels' branch has no vjp (tests/interpret, tests/gpu)
    torch.library.opcheck(torch.ops.mixstack.edge_wigner, (vec, steps, 2, 1),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    w = torch.ops.mixstack.edge_wigner(vec, steps, 2, 1)
    # the backward operator's tensor-op branch (run here) is autograd's gradient
    g = torch.randn_like(w)
    (want,) = torch.autograd.grad(w, vec, g)
    helpers.assert_close_rel(torch.ops.mixstack.edge_wigner_backward(g, vec.detach(), steps, 2, 1), want, "grad")


def _frame(vec):
    w = mixstack.edge_wigner(vec, 3)
    return (w * w.roll(1, 0)).sum()


@pytest.mark.slow
def test_compiled_fullgraph_dynamic_matches_eager_across_edge_counts():
    """The public function under torch.compile (on this CPU it takes the tensor-op formulas; the
    kernels' branch is compiled in tests/gpu)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_frame, fullgraph=True, dynamic=True)
    for n_edges in (9, 14):
        vec = helpers.edge_vectors(n_edges, seed=n_edges).requires_grad_(True)
        with mixstack.use_level(1):
            (got,) = torch.autograd.grad(compiled(vec), vec)
            (want,) = torch.autograd.grad(_frame(vec), vec)
        helpers.assert_close_rel(got, want, f"compiled gradient (E={n_edges})")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
