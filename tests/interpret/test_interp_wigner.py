"""``mixstack.edge_wigner``'s kernels through the interpreter: the packed Wigner rows and their
gradient against the float64 tensor-op formulas on partial tiles (edge counts no block divides),
edges along the axes and with tied components, bitwise run to run, the dispatch log, the double
backward through the tensor-op formulas, and negative controls."""

from __future__ import annotations

import helpers
import pytest
import torch

import mixstack
from mixstack.conv import wigner_ops as ops_wigner
from mixstack.conv.frames import edge_wigner_reference


@pytest.mark.parametrize("lmax, n_edges", [(1, 21), (2, 37), (3, 45),
                                           pytest.param(6, 19, marks=pytest.mark.slow)])
def test_kernels_match_float64_forward_and_backward(lmax, n_edges):
    assert n_edges % ops_wigner.BLOCK_E != 0                  # a partial tile
    vec = helpers.edge_vectors(n_edges, seed=lmax)
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        w, g, w64, g64 = helpers.edge_wigner_check(vec, lmax)
    assert dict(log) == {"wigner:triton": 1, "wigner_bwd:triton": 1}, dict(log)
    helpers.assert_close_rel(w, w64, f"edge_wigner lmax {lmax}")
    helpers.assert_close_rel(g, g64, f"edge_wigner grad lmax {lmax}")
    # per edge too: every special edge (axes, ties) is right, not only the bulk
    for e in range(len(helpers.SPECIAL_EDGES)):
        helpers.assert_close_rel(w[e], w64[e], f"edge {e}")
        helpers.assert_close_rel(g[e], g64[e], f"grad edge {e}", tol=1e-4)
    assert torch.equal(w[:, [0, 2], 0], torch.zeros_like(w[:, [0, 2], 0]))   # degree 0's absent rows


def test_runs_and_levels_give_the_same_bits():
    vec = helpers.edge_vectors(37, seed=3)
    runs = []
    for level in (1, 1, 3):
        with mixstack.use_level(level):
            w, g, _, _ = helpers.edge_wigner_check(vec, 3)
        runs.append((w, g))
    for w, g in runs[1:]:
        assert torch.equal(w, runs[0][0]) and torch.equal(g, runs[0][1])


def test_double_backward_runs_the_formulas_and_matches_float64():
    """A force-like loss: the first gradient with ``create_graph``, then its gradient."""
    lmax = 2
    vec = helpers.edge_vectors(23, seed=5)
    gen = torch.Generator().manual_seed(7)
    weights = torch.randn(23, 3, 9, generator=gen, dtype=torch.float64)

    def second(v, fn):
        v = v.clone().requires_grad_(True)
        (g,) = torch.autograd.grad((fn(v) * weights.to(v.dtype)).sum(), v, create_graph=True)
        (h,) = torch.autograd.grad((g ** 2).sum(), v)
        return g, h

    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        g, h = second(vec, lambda v: mixstack.edge_wigner(v, lmax))
    assert dict(log) == {"wigner:triton": 1, "wigner_bwd:reference": 1}, dict(log)
    g64, h64 = second(vec.double(), lambda v: edge_wigner_reference(v, lmax))
    helpers.assert_close_rel(g, g64, "first derivative")
    helpers.assert_close_rel(h, h64, "second derivative", tol=1e-4)


def test_no_edges_give_empty_rows_and_gradients():
    vec = torch.zeros(0, 3, requires_grad=True)
    with mixstack.use_level(1):
        w = mixstack.edge_wigner(vec, 3)
        (g,) = torch.autograd.grad(w.sum(), vec)
    assert w.shape == (0, 3, 16) and g.shape == (0, 3)


def test_a_wrong_step_matrix_is_caught():
    """Negative control: one entry of the steps' constants with its sign flipped moves the rows
    far past the tolerance (the kernels read the constants they are given)."""
    lmax = 3
    vec = helpers.edge_vectors(29, seed=9)
    steps = ops_wigner.packed_steps(lmax).clone()
    steps[steps.abs().argmax()] *= -1.0
    with mixstack.use_level(1):
        w = mixstack.edge_wigner(vec, lmax, constants=steps)
    w64 = edge_wigner_reference(vec.double(), lmax)
    assert helpers.rel_err(w, w64) > 10 * helpers.REL_TOL


def test_the_tie_rule_of_the_helper_axis_reaches_the_rows():
    """Negative control for the special edges: at the tie (1, 1, 1) the first minimum (x) is the
    helper axis; taking z instead (as a last-minimum rule would) moves the m = -1, +1 rows by
    O(1), so the per-edge comparison above would catch a wrong tie rule."""
    tie = edge_wigner_reference(torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64), 2)
    z_first = edge_wigner_reference(torch.tensor([[1.0, 1.0, 1.0 - 1e-12]], dtype=torch.float64), 2)
    assert helpers.rel_err(z_first[:, [0, 2]], tie[:, [0, 2]]) > 0.1
    torch.testing.assert_close(z_first[:, 1], tie[:, 1], rtol=0, atol=1e-9)   # m = 0 does not roll
