"""A rank's GPU: ``--device cuda`` picks ``cuda:{local rank % GPUs}`` on a real machine, and the
pair style's evaluator runs on its own device (made current for the call, Triton launches
there) with the CPU's energies and forces to float32 rounding.  Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("ase")

from ase.build import bulk  # noqa: E402

import mixstack  # noqa: E402
from mixstack.lammps.domain import DomainEvaluator  # noqa: E402
from mixstack.lammps.placement import rank_device  # noqa: E402
from mixstack.potential import SO2Potential  # noqa: E402


def test_local_ranks_map_to_the_gpus_of_this_machine():
    count = torch.cuda.device_count()
    got = [rank_device("cuda", environ={"MPI_LOCALRANKID": str(r)}).device for r in range(count + 2)]
    assert got == [f"cuda:{r % count}" for r in range(count + 2)]


@pytest.mark.parametrize("level", [2, 3])
def test_the_evaluator_runs_on_its_own_gpu_like_the_cpu(level):
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=2)
    x = atoms.get_positions()
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    dst, src = np.nonzero((d < 3.3) & (d > 0))
    pairs = np.stack((src, dst)).astype(np.int32)
    types = np.ones(len(atoms), dtype=np.int32)
    model = SO2Potential(lmax=1, focus_dim=32, n_focus=1, n_layers=2, cutoff=3.3, radial_hidden=16, seed=1,
                         energy_scale=10.0)
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    cpu = DomainEvaluator(model, [29], device="cpu")
    e_cpu, f_cpu, _ = cpu.compute(len(atoms), x, types, pairs)
    gpu = DomainEvaluator(model, [29], device=last)
    torch.cuda.set_device(0)
    with mixstack.use_level(level):
        e_gpu, f_gpu, _ = gpu.compute(len(atoms), x, types, pairs)
    assert torch.cuda.current_device() == 0                     # restored after the call
    assert gpu.stats.peak_memory_bytes and gpu.stats.calls == 1
    assert e_gpu == pytest.approx(e_cpu, rel=1e-5)
    np.testing.assert_allclose(f_gpu, f_cpu, atol=1e-4 * np.abs(f_cpu).max())
