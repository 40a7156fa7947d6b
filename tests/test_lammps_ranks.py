"""LAMMPS on 1, 2 and 4 MPI ranks gives the ASE calculator's energy, forces and stress.

Each rank count is one ``mpirun`` of ``lammps_driver.py`` over every job (a
cubic one-element cell a triclinic two-element cell and a one-unit cell smaller
than the ghost cutoff, each with a float64 and a float32 model).  At 2 and 4
ranks a sub-domain is thinner than the receptive field, so ghosts come from
several exchanges and from periodic images of the rank's own atoms.  Float64 agrees to ~1e-12 (only the order of
sums differs); float32 to float32 rounding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lammps_helpers import DRIVER, mpirun, require_lammps

require_lammps()
pytestmark = pytest.mark.slow          # three mpirun launches (about 30 s on a 2-core CPU)

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402

from mixstack.potential import SO2Potential  # noqa: E402
from mixstack.potential.calculator import MixstackCalculator  # noqa: E402

KW = dict(lmax=1, focus_dim=8, n_focus=1, n_blocks=2, n_layers=2, radial_hidden=16, cutoff=3.0, energy_scale=10.0)
RANKS = (1, 2, 4)
# (energy, forces, stress) tolerance relative to the largest magnitude of each
TOL = {"float64": 1e-10, "float32": 2e-5}


def _cells():
    diamond = bulk("C", "diamond", a=3.567, cubic=True).repeat((2, 2, 2))
    diamond.rattle(0.05, seed=1)
    sic = bulk("SiC", "zincblende", a=4.36).repeat((3, 3, 3))          # fcc primitive: triclinic
    sic.rattle(0.05, seed=2)
    unit = bulk("C", "diamond", a=3.567, cubic=True)                   # box < ghost cutoff: self-images
    unit.rattle(0.05, seed=3)
    return {"diamond": diamond, "sic": sic, "unit": unit}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{(ranks, job): LAMMPS result}`` and ``{job: ASE result}``."""
    from mixstack.lammps import plugin_path
    plugin_path()                                   # build once here, not on every rank
    tmp = tmp_path_factory.mktemp("lammps_ranks")
    jobs, reference = [], {}
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).removeprefix("torch.")
        model = SO2Potential(**KW, seed=3, dtype=dtype)
        model_path = tmp / f"model-{name}.pt"
        model.save(model_path)
        for cell, atoms in _cells().items():
            structure = tmp / f"{cell}.extxyz"
            atoms.write(structure)
            atoms = ase.io.read(structure)           # the positions LAMMPS gets (the file rounds them)
            job = f"{cell}-{name}"
            jobs.append({"name": job, "structure": str(structure), "model": str(model_path), "skin": 0.5})
            calc = MixstackCalculator(model)
            reference[job] = {"energy": calc.get_potential_energy(atoms), "forces": calc.get_forces(atoms),
                              "stress": calc.get_stress(atoms), "receptive": KW["n_blocks"] * KW["cutoff"],
                              "cell": atoms.cell.cellpar()[:3]}
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(jobs))
    got = {}
    for n in RANKS:
        out = tmp / f"ranks{n}.npz"
        mpirun(n, [DRIVER, str(plan), str(out)])
        with np.load(out) as data:
            for job in reference:
                got[n, job] = {k: data[f"{job}/{k}"] for k in ("energy", "forces", "stress")}
    return got, reference


JOBS = [f"{c}-{d}" for d in ("float64", "float32") for c in ("diamond", "sic", "unit")]


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("ranks", RANKS)
def test_energy_forces_and_stress_equal_the_ase_calculators(runs, ranks, job):
    got, reference = runs
    want, have = reference[job], got[ranks, job]
    tol = TOL[job.rsplit("-", 1)[1]]
    assert float(have["energy"]) == pytest.approx(want["energy"], rel=tol, abs=tol * len(want["forces"]))
    scale = np.abs(want["forces"]).max()
    np.testing.assert_allclose(have["forces"], want["forces"], rtol=0, atol=tol * scale)
    np.testing.assert_allclose(have["stress"], want["stress"], rtol=0, atol=tol * np.abs(want["stress"]).max())


def test_the_four_rank_domains_are_thinner_than_the_receptive_field(runs):
    """The case the multi-exchange ghost shell exists for (LAMMPS splits a cube 1 x 2 x 2)."""
    _, reference = runs
    for job, want in reference.items():
        assert min(want["cell"]) / 2 < want["receptive"], job
