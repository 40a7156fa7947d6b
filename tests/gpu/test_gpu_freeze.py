"""Freezing on CUDA: the exported graph holds the mixstack operators, and the
AOTInductor ``.pt2`` gives the live module's energies and forces at another
system size.  At level 2 freeze consults the tuning tables first (the key is
covered here by process-local registrations, so nothing is swept).  Skipped
without CUDA (and without ASE)."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("ase")

from ase.build import bulk  # noqa: E402
from helpers import rel_err  # noqa: E402

import mixstack  # noqa: E402
from mixstack import export, tuning  # noqa: E402
from mixstack.packages import package_kernels  # noqa: E402
from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402


def _cu(repeat, seed):
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    return atoms


# The kernels each level's package must carry: the forward GEMM and gate, the relay backward,
# the convolution around the stack; level 3 adds the split of the weights for its compensated GEMMs.
KERNELS = {1: {"block_gemm_kernel", "gate_kernel", "gate_backward_kernel", "rotate_in_kernel"},
           3: {"block_gemm_kernel", "split_weights_kernel"}}


@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_package_frozen_on_cuda_carries_mixstacks_kernels(level, tmp_path):
    """Reads the archive only: it holds where AOTInductor's loader cannot run (docs/deployment.md)."""
    model = SO2Potential(lmax=2, focus_dim=32, n_focus=2, cutoff=4.0, seed=3, energy_scale=10.0,
                         device="cuda").eval()
    example = atoms_inputs(_cu((2, 2, 2), 1), model.cutoff, device="cuda")
    with mixstack.use_level(level):
        path = mixstack.freeze(model, example, tmp_path / f"cu{level}.pt2", tune=False)
    found = package_kernels(path)
    assert found.metadata.get("AOTI_DEVICE_KEY") == "cuda", found.metadata
    assert KERNELS[min(level, 3) if level != 2 else 1] <= set(found.mixstack), found.lines()


@pytest.mark.parametrize("level", [1, 2])
def test_frozen_potential_on_cuda_holds_the_operators_and_matches_the_live_module(level, tmp_path):
    model = SO2Potential(lmax=2, focus_dim=16, n_focus=2, cutoff=4.0, seed=3, energy_scale=10.0,
                         device="cuda").eval()
    example = atoms_inputs(_cu((2, 2, 2), 1), model.cutoff, device="cuda")
    other = atoms_inputs(_cu((3, 3, 2), 2), model.cutoff, device="cuda")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mixstack.use_level(level))
        for key in export.stack_keys(model):
            stack.enter_context(tuning.registration("stack_fwd", key, None))
            stack.enter_context(tuning.registration("stack_bwd_relay", key, None))
            stack.enter_context(tuning.registration("stack_bwd_fused", key, None))
        targets = {str(n.target) for n in export.trace(model, example).graph.nodes}
        path = mixstack.freeze(model, example, tmp_path / "cu.pt2")
        want = model(*other)
    assert any("mixstack.stack_forward" in t for t in targets), sorted(targets)
    assert any("mixstack.stack_backward" in t for t in targets), sorted(targets)
    frozen = mixstack.load(path)
    assert frozen.metadata["level"] == str(level)
    if level >= 2:
        assert frozen.metadata["tuning"].startswith("tuned:") and "covered" in frozen.metadata["tuning"]
    got = frozen(*other)
    for name, g, w in zip(("energy", "forces", "stress"), got[:3], want[:3]):
        assert rel_err(g, w) <= 1e-5, (name, rel_err(g, w))
