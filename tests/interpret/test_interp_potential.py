"""``SO2Potential`` on the Triton levels (through the interpreter): the force path runs the
kernels (the stack's relay backward, rotate-in and rotate-out) in eval mode, matches level 0,
stays equivariant, and repeats bit for bit."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
import torch

import mixstack

pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402

from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402

EVAL_PATHS = {"fwd:triton": 2, "bwd:relay": 2, "conv_in:triton": 2, "conv_in_bwd:triton": 2,
              "conv_out:triton": 2, "conv_out_bwd:triton": 2}


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


@pytest.mark.parametrize("level", [1, 2])
def test_eval_mode_forces_run_the_kernels_and_match_level_zero(system, level):
    model, _, inputs, ref, frames = system
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        frames[level] = got = model(*inputs)
    assert log == EVAL_PATHS
    for name, g, w in zip(("energy", "forces", "stress", "energies"), got, ref):
        helpers.assert_close_rel(g, w, f"level {level} {name}")
    assert ref[1].norm() > 0


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


def test_training_mode_sends_the_backward_to_the_differentiable_reference(system):
    model, _, inputs, _, _ = system
    model.train()
    try:
        with mixstack.use_level(1), mixstack.dispatch_log() as log:
            _, forces, _, _ = model(*inputs)
        assert log == {"fwd:triton": 2, "bwd:reference": 2, "conv_in:triton": 2, "conv_in_bwd:reference": 2,
                       "conv_out:triton": 2, "conv_out_bwd:reference": 2}
        assert forces.requires_grad                      # force losses can train the weights
    finally:
        model.eval()
