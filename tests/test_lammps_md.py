"""``mixstack md``: NVE in LAMMPS (2 ranks) conserves energy like ASE and follows its trajectory;
NVT and NPT run; the record and the trajectory are written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lammps_helpers import mpirun, require_lammps

require_lammps()

import ase.io  # noqa: E402

from mixstack.lammps import runs as md  # noqa: E402
from mixstack.potential import SO2Potential  # noqa: E402

KW = dict(lmax=1, focus_dim=8, n_focus=1, n_blocks=2, n_layers=2, radial_hidden=16, cutoff=3.0, energy_scale=10.0)
NVE = dict(structure="diamond", atoms=64, steps=40, timestep=0.5, temperature=600.0, thermo=5, seed=1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("lammps_md") / "model.pt"
    SO2Potential(**KW, seed=5, dtype=torch.float64).save(path)
    return str(path)


@pytest.mark.slow                      # an mpirun launch and two 40-step runs (about 10 s)
def test_nve_on_two_ranks_conserves_energy_like_ase_and_follows_its_trajectory(checkpoint, tmp_path):
    out, traj = tmp_path / "md.json", tmp_path / "md.lammpstrj"
    args = ["-m", "mixstack", "md", "--model", checkpoint, "--quiet", "--json", str(out), "--traj", str(traj)]
    for key, value in NVE.items():
        args += [f"--{key}", str(value)]
    mpirun(2, args)
    lmp = json.loads(out.read_text())
    ase_run = md.run_md(md.MDConfig(model=checkpoint, engine="ase", **NVE))
    assert lmp["ranks"] == 2 and len(lmp["model_calls"]) == 2
    a, b = lmp["thermo"], ase_run["thermo"]
    assert a["Step"] == b["Step"] == list(range(0, 41, 5))
    # same start, same integrator: the energies agree to far below the drift
    np.testing.assert_allclose(a["PotEng"], b["PotEng"], rtol=0, atol=1e-6 * len(a["PotEng"]))
    np.testing.assert_allclose(a["KinEng"], b["KinEng"], rtol=1e-5)
    drift_lmp, drift_ase = lmp["max_energy_drift_per_atom"], ase_run["max_energy_drift_per_atom"]
    assert drift_ase < 1e-4
    assert drift_lmp <= 1.5 * drift_ase + 1e-8
    frames = ase.io.read(traj, index=":", format="lammps-dump-text")
    assert len(frames) == 9 and len(frames[-1]) == 64
    assert lmp["steps_per_second"] > 0


@pytest.mark.parametrize("ensemble", ["nvt", "npt"])
def test_nvt_and_npt_run_in_lammps_with_pressure_from_the_virial(checkpoint, ensemble):
    cfg = md.MDConfig(model=checkpoint, ensemble=ensemble, structure="diamond", atoms=64, steps=10, timestep=0.5,
                      thermo=5, pressure=1e4, pdamp=50.0, screen=False)
    record = md.run_md(cfg)
    thermo = record["thermo"]
    assert thermo["Step"] == [0, 5, 10]
    assert all(np.isfinite(thermo["Press"])) and thermo["Press"][0] != 0.0
    if ensemble == "npt":
        assert thermo["Volume"][-1] != thermo["Volume"][0]
    else:
        assert thermo["Volume"][-1] == thermo["Volume"][0]


def test_md_config_names_the_bad_argument():
    with pytest.raises(ValueError, match="ensemble"):
        md.MDConfig(ensemble="nph")
    with pytest.raises(ValueError, match="npt"):
        md.MDConfig(engine="ase", ensemble="npt")
    with pytest.raises(ValueError, match="structure"):
        md.prepare_atoms(md.MDConfig(structure="no-such-file.xyz"))
    with pytest.raises(ValueError, match="model"):
        md.load_model(md.MDConfig(model="no-such-checkpoint.pt"))
    with pytest.raises(ValueError, match="warmup"):
        md.MDConfig(warmup=-1)
    with pytest.raises(ValueError, match="engine lammps"):
        md.MDConfig(engine="ase", forces="f.npz")
    assert md.model_size("scaling") == md.SCALING_MODEL and md.model_size("scaling") is not md.SCALING_MODEL
    with pytest.raises(ValueError, match="model"):
        md.model_size("huge")
