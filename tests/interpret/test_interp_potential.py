"""``SO2Potential`` on the Triton levels (through the interpreter): the force path runs the
kernels' relay backward in eval mode and matches level 0."""

from __future__ import annotations

import copy

import helpers
import pytest
import torch

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


@pytest.mark.slow
def test_a_training_step_runs_the_stack_kernels_end_to_end_and_matches_float64():
    """Train mode: forces with create_graph, then an energy + force loss's gradient to every
    parameter.  The stack's backward, weight gradients and double backward all run as kernels
    (no bwd:reference), and every parameter's gradient matches the float64 model's."""
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
    assert log == {"fwd:triton": 2, "bwd:relay": 4, "bwd2:triton": 2, "wgrad:triton": 4}, log
    assert got.keys() == want.keys()
    stack = [n for n in got if n.startswith("blocks.1.stack.")]      # block 0 sees no |m| = 1 input
    assert len(stack) == 4 and all(got[n].abs().sum() > 0 for n in stack)
    for name, g in got.items():       # float32 level 0 itself: up to 2.2e-6 from float64 here
        helpers.assert_close_rel(g, want[name], name, tol=2e-5)
