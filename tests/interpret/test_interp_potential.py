"""``SO2Potential`` on the Triton levels (through the interpreter): the force path runs the
kernels (the stack's relay backward, rotate-in and rotate-out) in eval mode, matches level 0,
stays equivariant, and repeats bit for bit."""

from __future__ import annotations

import copy

import helpers
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mixstack

pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402

from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402

EVAL_PATHS = {"fwd:triton": 2, "bwd:relay": 2, "conv_in:triton": 2, "conv_in_bwd:triton": 2,
              "conv_out:triton": 2, "conv_out_bwd:triton": 2, "wigner:triton": 1, "wigner_bwd:triton": 1}


@pytest.fixture(scope="module")
def system():
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=2, n_layers=2, cutoff=2.6,
                         energy_scale=10.0).eval()
    atoms = bulk("C", "diamond", cubic=True)
    atoms.rattle(0.05, seed=0)
    inputs = atoms_inputs(atoms, model.cutoff)
    with mixstack.use_level(0):
        ref = model(*inputs)
    return model, atoms, inputs, ref, {}


# Level 2 (the same kernels as level 1 here: no table entries) in the full suite only.
@pytest.mark.parametrize("level", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_eval_mode_forces_run_the_kernels_and_match_level_zero(system, level):
    model, _, inputs, ref, frames = system
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        frames[level] = got = model(*inputs)
    assert log == EVAL_PATHS
    for name, g, w in zip(("energy", "forces", "stress", "energies"), got, ref):
        helpers.assert_close_rel(g, w, f"level {level} {name}")
    assert ref[1].norm() > 0


class _OutputShapes(TorchDispatchMode):
    """Every operator's output shapes while active."""

    def __init__(self):
        super().__init__()
        self.shapes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.shapes.add(tuple(t.shape))
        return out


@pytest.mark.slow
def test_eval_mode_never_makes_the_radial_weights_and_train_mode_does(system):
    """Eval mode (forces) hands rotate-in the radial network's last layer (``LinearRadial``): the
    ``(E, F, 2*lmax+1, C)`` weights are never a tensor, forward or backward.  Train mode makes
    them (their gradients are wanted) as two products: the subtiles' and the edge scalar's."""
    model, _, inputs, _, _ = system
    block = model.blocks[0]
    n_edges = inputs.edge_index.shape[1]
    whole = (n_edges, block.n_focus, 2 * block.lmax + 1, block.c)

    def shapes(train: bool):
        m = model.train(train)
        pos = inputs.positions.detach().requires_grad_(True)
        with mixstack.use_level(1), _OutputShapes() as seen:
            energy, _ = m.energy(pos, *inputs[1:])
            torch.autograd.grad(energy, pos)
        return seen.shapes

    try:
        assert whole not in shapes(False)
        assert whole in shapes(True)
    finally:
        model.eval()


@pytest.mark.slow
def test_frames_at_levels_1_to_3_are_bitwise_identical_run_to_run(system):
    """Separate calls at levels 1, 2 and 3 (the first two kept from the test above where it ran)."""
    model, _, inputs, _, frames = system
    runs = []
    for level in (1, 2, 3):
        if level not in frames:
            with mixstack.use_level(level):
                frames[level] = model(*inputs)
        runs.append(frames[level])
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.slow
def test_forces_and_stress_rotate_with_the_structure_on_the_kernels(system):
    model, atoms, inputs, _, frames = system
    q, r = np.linalg.qr(np.random.default_rng(4).normal(size=(3, 3)))
    Q = q * np.sign(np.diag(r))
    Q = Q * np.linalg.det(Q)
    turned = atoms.copy()
    turned.set_cell(atoms.cell.array @ Q.T, scale_atoms=False)
    turned.positions = atoms.positions @ Q.T + np.array([0.3, -1.1, 0.7])
    Qt = torch.tensor(Q, dtype=torch.float32)
    with mixstack.use_level(1):
        e, f, s, _ = frames[1] if 1 in frames else model(*inputs)
        e2, f2, s2, _ = model(*atoms_inputs(turned, model.cutoff))
    helpers.assert_close_rel(e2, e, "energy of the rotated structure")
    helpers.assert_close_rel(f2, f @ Qt.T, "forces of the rotated structure")
    helpers.assert_close_rel(s2, Qt @ s @ Qt.T, "stress of the rotated structure")


@pytest.mark.slow
def test_a_training_step_runs_the_stack_kernels_end_to_end_and_matches_float64():
    """Train mode: forces with create_graph, then an energy + force loss's gradient to every
    parameter.  The stack's backward, weight gradients and double backward all run as kernels
    (no bwd:reference), the convolution's operators too where they do not build a graph, and every parameter's gradient matches the float64 model's."""
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=2, n_layers=2, cutoff=2.6,
                         energy_scale=10.0).train()
    model64 = copy.deepcopy(model).double()
    atoms = bulk("C", "diamond", cubic=True)
    atoms.rattle(0.05, seed=0)

    def step(m, level, dtype):
        inputs = atoms_inputs(atoms, m.cutoff, dtype=dtype)
        m.zero_grad()
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            energy, forces, _, _ = m(*inputs)
            ((energy - 1.0) ** 2 + (forces ** 2).sum()).backward()
        return {n: p.grad for n, p in m.named_parameters()}, dict(log)

    got, log = step(model, 1, torch.float32)
    want, _ = step(model64, 0, torch.float64)
    # the convolution's operators: kernels forward; their backward that builds the force graph
    # runs the reference formulas (create_graph), the loss's backward through the forward kernels
    assert log == {"fwd:triton": 2, "bwd:relay": 4, "bwd2:triton": 2, "wgrad:triton": 4,
                   "conv_in:triton": 2, "conv_out:triton": 2, "conv_in_bwd:reference": 2,
                   "conv_out_bwd:reference": 2, "conv_in_bwd:triton": 2, "conv_out_bwd:triton": 2,
                   "wigner:triton": 1, "wigner_bwd:reference": 1, "wigner_bwd:triton": 1}, log
    assert got.keys() == want.keys()
    stack = [n for n in got if n.startswith("blocks.1.stack.")]      # block 0 sees no |m| = 1 input
    assert len(stack) == 4 and all(got[n].abs().sum() > 0 for n in stack)
    for name, g in got.items():       # float32 level 0 itself: up to 2.2e-6 from float64 here
        helpers.assert_close_rel(g, want[name], name, tol=2e-5)
