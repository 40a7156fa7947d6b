"""``MixstackCalculator`` in ASE: properties, units, and energy conservation in NVE MD."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
from ase import Atoms, units  # noqa: E402
from ase.build import bulk  # noqa: E402
from ase.calculators.calculator import PropertyNotImplementedError  # noqa: E402
from ase.md.verlet import VelocityVerlet  # noqa: E402

from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402
from mixstack.potential.calculator import MixstackCalculator  # noqa: E402

KW = dict(lmax=1, focus_dim=16, n_focus=2, n_blocks=2, n_layers=2, cutoff=4.0)


def _cu(rattle=0.05):
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
    atoms.rattle(rattle, seed=7)
    return atoms


def test_calculator_returns_the_models_energy_forces_and_voigt_stress():
    model = SO2Potential(**KW, energy_scale=10.0)
    atoms = _cu()
    atoms.calc = MixstackCalculator(model)
    e, f, s, ei = model.eval()(*atoms_inputs(atoms, model.cutoff))
    assert atoms.get_potential_energy() == pytest.approx(e.item(), rel=1e-7)
    assert atoms.get_potential_energy(force_consistent=True) == pytest.approx(e.item(), rel=1e-7)
    np.testing.assert_allclose(atoms.get_potential_energies(), ei.numpy(), rtol=1e-6)
    forces = atoms.get_forces()
    assert forces.shape == (len(atoms), 3) and forces.dtype == np.float64
    np.testing.assert_allclose(forces, f.numpy(), rtol=1e-6, atol=1e-9)
    stress = atoms.get_stress()                                         # Voigt: xx yy zz yz xz xy
    s = s.double().numpy()
    np.testing.assert_allclose(stress, [s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]], rtol=1e-6)
    assert np.abs(stress).max() > 0


def test_the_same_atoms_are_one_calculation_and_any_move_a_new_one(monkeypatch):
    """``check_state`` compares exactly (``ExactStateCheck``): energy, forces and stress of the same
    atoms are one frame; a 1e-12 Å move is another."""
    model = SO2Potential(**KW, energy_scale=10.0)
    atoms = _cu()
    calc = MixstackCalculator(model)
    frames = []
    real = MixstackCalculator.calculate
    monkeypatch.setattr(MixstackCalculator, "calculate", lambda self, *a, **k: frames.append(1) or real(self, *a, **k))
    atoms.calc = calc
    atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
    assert len(frames) == 1
    atoms.positions[2, 0] += 1e-12
    atoms.get_forces(), atoms.get_potential_energy()
    assert len(frames) == 2


@pytest.mark.slow
def test_stress_matches_ases_numerical_stress_of_the_same_calculator():
    atoms = _cu(rattle=0.1)
    atoms.calc = MixstackCalculator(SO2Potential(**KW, energy_scale=10.0, dtype=torch.float64))
    try:
        from ase.calculators.fd import calculate_numerical_stress
        numeric = calculate_numerical_stress(atoms, eps=1e-5)
    except ImportError:                                                 # ASE < 3.24
        numeric = atoms.calc.calculate_numerical_stress(atoms, d=1e-5)
    np.testing.assert_allclose(atoms.get_stress(), numeric, rtol=1e-5, atol=1e-9)


def test_open_systems_have_energy_and_forces_but_no_stress():
    atoms = Atoms("CO2", positions=[[0, 0, 0], [1.16, 0, 0], [-1.16, 0, 0.1]])
    atoms.calc = MixstackCalculator(SO2Potential(**KW))
    assert np.isfinite(atoms.get_potential_energy())
    assert np.abs(atoms.get_forces()).max() > 0
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        atoms.get_stress()


@pytest.mark.parametrize("numbers, why", [([29, 200], "got 200"), ([0, 29], "got 0"), ([], "no atoms")])
def test_calculator_names_atomic_numbers_it_cannot_take_and_an_empty_structure(numbers, why):
    from ase import Atoms
    atoms = Atoms(numbers=numbers, positions=[[0.0, 0.0, 0.0], [1.5, 0.0, 0.0]][:len(numbers)],
                  cell=[6.0, 6.0, 6.0], pbc=True)
    atoms.calc = MixstackCalculator(SO2Potential(lmax=1, focus_dim=16, n_blocks=1, cutoff=3.0))
    with pytest.raises(ValueError, match=why):
        atoms.get_potential_energy()


def test_calculator_rejects_what_is_neither_a_module_nor_a_path():
    with pytest.raises(TypeError, match="nn.Module or the path"):
        MixstackCalculator(42)


def test_cuda_graphs_default_off_on_the_cpu_and_refused_where_they_cannot_run(tmp_path):
    model = SO2Potential(**KW)
    calc = MixstackCalculator(model)
    assert calc.graphs is None and not calc.neighbors.pad            # a CPU module: eager, unpadded
    with pytest.raises(ValueError, match="cuda_graphs=True needs a live module on a CUDA device, not a module on cpu"):
        MixstackCalculator(model, cuda_graphs=True)


def test_graphed_frames_run_the_function_eagerly_on_cpu_tensors_and_check_their_arguments():
    from mixstack.potential.graphs import GraphedFrames
    calls = []

    def frame(a, b):
        calls.append(1)
        return a + b, a * b

    graphed = GraphedFrames(frame)
    out = graphed(torch.ones(3), torch.full((3,), 2.0))
    assert torch.equal(out[0], torch.full((3,), 3.0)) and torch.equal(out[1], torch.full((3,), 2.0))
    assert calls == [1] and graphed.captures == 0 and graphed.replays == 0
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedFrames(frame, warmup=0)
    with pytest.raises(ValueError, match="max_graphs must be >= 1"):
        GraphedFrames(frame, max_graphs=0)


class _ScaledForces(MixstackCalculator):
    """A wrong calculator (forces 3% off the energy gradient): the drift check must catch it."""

    def calculate(self, *args, **kwargs):
        super().calculate(*args, **kwargs)
        self.results["forces"] = 1.03 * self.results["forces"]


def _nve_energies(calc_cls, steps=50, dt_fs=0.5):
    model = SO2Potential(**KW, energy_scale=100.0, dtype=torch.float64)
    atoms = _cu(rattle=0.08)
    atoms.calc = calc_cls(model)
    rng = np.random.default_rng(0)
    momenta = rng.normal(size=(len(atoms), 3)) * np.sqrt(atoms.get_masses()[:, None] * units.kB * 300)
    atoms.set_momenta(momenta - momenta.mean(0))
    md = VelocityVerlet(atoms, timestep=dt_fs * units.fs)
    total, potential = [], []
    for _ in range(steps):
        md.run(1)
        total.append(atoms.get_total_energy())
        potential.append(atoms.get_potential_energy())
    return np.array(total), np.array(potential)


@pytest.mark.parametrize("calc_cls,conserves", [(MixstackCalculator, True), (_ScaledForces, False)],
                         ids=["model", "wrong-forces-control"])
@pytest.mark.slow
def test_nve_total_energy_drift_is_bounded(calc_cls, conserves):
    """50 steps of 0.5 fs of velocity Verlet on a warm (300 K), rattled 16-atom bcc Cu cell.

    Bound: the total energy stays within 1% of the potential energy's range over
    the run (the energy the atoms exchange between kinetic and potential).
    Verlet's energy error for a mode of angular frequency w is about
    (w dt)^2 / 8 of that exchange: ~1e-4 for w = 2 pi x 10 THz at 0.5 fs, so
    1% leaves ~100x headroom (measured here: 2.5e-5 of the exchange), while forces that are not
    the exact gradient of the energy — off by a few percent, a missing term, a
    wrong sign — leave a drift of that fraction of the exchange (the control,
    3% off: 3.0e-2 of it).
    """
    total, potential = _nve_energies(calc_cls)
    exchange = potential.max() - potential.min()
    assert exchange > 1e-3                                               # the run is not trivial
    drift = np.abs(total - total[0]).max()
    assert bool(drift < 0.01 * exchange) is conserves, f"drift {drift:.2e} eV, exchange {exchange:.2e} eV"
