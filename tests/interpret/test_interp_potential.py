"""``SO2Potential`` on the Triton levels (through the interpreter): the force path runs the
kernels' relay backward in eval mode and matches level 0."""

from __future__ import annotations

import helpers
import pytest

import mixstack

pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402

from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402


@pytest.fixture(scope="module")
def system():
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=2, n_layers=2, cutoff=2.6,
                         energy_scale=10.0).eval()
    atoms = bulk("C", "diamond", cubic=True)
    atoms.rattle(0.05, seed=0)
    inputs = atoms_inputs(atoms, model.cutoff)
    with mixstack.use_level(0):
        ref = model(*inputs)
    return model, inputs, ref


@pytest.mark.parametrize("level", [1, 2])
def test_eval_mode_forces_run_the_kernel_relay_and_match_level_zero(system, level):
    model, inputs, ref = system
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        got = model(*inputs)
    assert log == {"fwd:triton": 2, "bwd:relay": 2}
    for name, g, w in zip(("energy", "forces", "stress", "energies"), got, ref):
        helpers.assert_close_rel(g, w, f"level {level} {name}")
    assert ref[1].norm() > 0


def test_training_mode_sends_the_backward_to_the_differentiable_reference(system):
    model, inputs, _ = system
    model.train()
    try:
        with mixstack.use_level(1), mixstack.dispatch_log() as log:
            _, forces, _, _ = model(*inputs)
        assert log == {"fwd:triton": 2, "bwd:reference": 2}
        assert forces.requires_grad                      # force losses can train the weights
    finally:
        model.eval()
