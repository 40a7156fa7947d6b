"""``SO2Potential``: symmetry, forces and stress as derivatives, periodic images, neighbour lists."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

ase_build = pytest.importorskip("ase.build")
from mixstack.potential import PotentialConfig, SO2Potential, atoms_inputs, neighbor_arrays  # noqa: E402
from mixstack.potential.blocks import EquivariantMixingStack  # noqa: E402

F64 = torch.float64
SMALL = dict(lmax=2, focus_dim=16, n_focus=2, n_blocks=2, n_layers=3, cutoff=4.0, energy_scale=10.0)


@pytest.fixture(scope="module")
def model64():
    return SO2Potential(**SMALL, seed=1, dtype=F64).eval()


@pytest.fixture(scope="module")
def model32():
    return SO2Potential(**SMALL, seed=1).eval()


def _cu(reps=(2, 1, 1), rattle=0.08, seed=0):
    atoms = ase_build.bulk("Cu", "bcc", a=2.87, cubic=True).repeat(reps)
    atoms.rattle(rattle, seed=seed)
    return atoms


def _mixed():
    """A rattled triclinic cell with three species (one heavy, one light, one exotic)."""
    atoms = ase_build.bulk("NaCl", "rocksalt", a=5.0) * (2, 1, 1)
    atoms.set_cell(atoms.cell.array + np.array([[0, 0.3, 0], [0.2, 0, 0], [0, 0, 0.1]]), scale_atoms=True)
    atoms.numbers[0] = 92                                            # U: any Z works
    atoms.rattle(0.1, seed=3)
    return atoms


def _run(model, atoms):
    return model(*atoms_inputs(atoms, model.cutoff, dtype=model.dtype))


def _rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q * np.linalg.det(q)


def _rotated(atoms, Q, shift=(0.0, 0.0, 0.0)):
    out = atoms.copy()
    out.set_cell(atoms.cell.array @ Q.T, scale_atoms=False)
    out.positions = atoms.positions @ Q.T + np.asarray(shift)
    return out


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64)
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("seed", [0, 1])
def test_float64_energy_is_invariant_and_forces_and_stress_rotate(model64, seed):
    atoms = _mixed()
    e, f, s, ei = _run(model64, atoms)
    Q = _rotation(seed)
    e2, f2, s2, ei2 = _run(model64, _rotated(atoms, Q, shift=(0.4, -1.3, 2.2)))
    Qt = torch.tensor(Q, dtype=F64)
    assert abs(e2 - e).item() <= 1e-12 * abs(e).item()
    assert _rel(ei2, ei) < 1e-12
    assert _rel(f2, f @ Qt.T) < 1e-11
    assert _rel(s2, Qt @ s @ Qt.T) < 1e-11
    assert f.norm() > 1e-3 and s.norm() > 1e-4                      # not trivially zero


def test_float32_symmetry_holds_to_float32_rounding(model32):
    atoms = _mixed()
    e, f, s, _ = _run(model32, atoms)
    Q = _rotation(5)
    e2, f2, s2, _ = _run(model32, _rotated(atoms, Q, shift=(3.0, 0.5, -0.7)))
    Qt = torch.tensor(Q, dtype=torch.float32)
    # Per-atom energies ~1 eV summed over 8 atoms, forces through ~10 layers: rounding ~1e-7..1e-6.
    assert abs(e2 - e).item() <= 1e-5 * abs(e).item()
    assert _rel(f2, f @ Qt.T) < 1e-5
    assert _rel(s2, Qt @ s @ Qt.T) < 1e-5


def test_a_free_w1_breaks_rotation_equivariance(monkeypatch):
    """Negative control: the equivariance check above sees a stack without the [[U, V], [-V, U]] structure."""
    model = SO2Potential(**SMALL, seed=1, dtype=F64).eval()
    free = {id(s): torch.randn_like(s.w1()) * 0.2 for s in model.stacks()}
    monkeypatch.setattr(EquivariantMixingStack, "w1", lambda self: free[id(self)])
    atoms = _mixed()
    _, f, _, _ = _run(model, atoms)
    Q = _rotation(0)
    _, f2, _, _ = _run(model, _rotated(atoms, Q))
    assert _rel(f2, f @ torch.tensor(Q, dtype=F64).T) > 1e-7        # >= 1e4 x the tolerance above


def test_translation_and_wrapping_an_atom_into_another_image_change_nothing(model64):
    atoms = _mixed()
    e, f, s, ei = _run(model64, atoms)
    moved = atoms.copy()
    moved.positions += np.array([0.77, -2.1, 0.35])
    moved.positions[2] += atoms.cell.array[0] - 2 * atoms.cell.array[2]   # same atom, another image
    e2, f2, s2, ei2 = _run(model64, moved)
    assert abs(e2 - e).item() <= 1e-12 * abs(e).item()
    assert _rel(f2, f) < 1e-11 and _rel(s2, s) < 1e-11 and _rel(ei2, ei) < 1e-12


@pytest.mark.slow
def test_forces_are_minus_the_finite_difference_gradient_of_the_energy(model64):
    atoms = _cu()
    inp = atoms_inputs(atoms, model64.cutoff, dtype=F64)
    _, forces, _, _ = model64(*inp)
    h = 1e-4
    fd = torch.zeros_like(forces)
    for a in range(len(atoms)):
        for k in range(3):
            pos = [inp.positions.clone() for _ in range(2)]
            pos[0][a, k] += h
            pos[1][a, k] -= h
            ep, em = (model64.energy(p, *inp[1:])[0].item() for p in pos)
            fd[a, k] = -(ep - em) / (2 * h)
    assert forces.norm() > 1e-2
    assert _rel(forces, fd) < 1e-6


@pytest.mark.slow
def test_stress_is_the_finite_difference_strain_derivative_over_the_volume(model64):
    atoms = _mixed()
    inp = atoms_inputs(atoms, model64.cutoff, dtype=F64)
    _, _, stress, _ = model64(*inp)
    volume = atoms.get_volume()
    h = 1e-5
    fd = torch.zeros(3, 3, dtype=F64)
    for i in range(3):
        for j in range(3):
            eps = torch.zeros(3, 3, dtype=F64)
            eps[i, j] = eps[j, i] = h / (2 if i != j else 1)
            ep = model64.energy(*inp, strain=eps)[0].item()
            em = model64.energy(*inp, strain=-eps)[0].item()
            fd[i, j] = (ep - em) / (2 * h) / volume
    assert stress.norm() > 1e-4
    assert _rel(stress, fd) < 1e-6


@pytest.mark.parametrize("unit,reps", [("fcc-primitive", (2, 2, 2)), ("diamond", (1, 2, 1))])
def test_a_periodic_cell_and_its_supercell_give_the_same_per_atom_energies(model64, unit, reps):
    if unit == "fcc-primitive":                      # one atom, cell far smaller than the cutoff
        cell = ase_build.bulk("Cu", "fcc", a=3.6)
    else:
        cell = ase_build.bulk("C", "diamond", cubic=True)
        cell.rattle(0.05, seed=2)
    e, f, s, ei = _run(model64, cell)
    e2, f2, s2, ei2 = _run(model64, cell.repeat(reps))
    n = int(np.prod(reps))
    assert _rel(ei2, ei.repeat(n)) < 1e-12
    assert abs(e2 - n * e).item() <= 1e-12 * abs(n * e).item()
    torch.testing.assert_close(s2, s, rtol=1e-10, atol=1e-14)
    if f.norm() > 0:
        assert _rel(f2, f.repeat(n, 1)) < 1e-10


def test_an_open_system_with_isolated_atoms_has_no_stress_and_zero_force_on_loners(model64):
    from ase import Atoms
    atoms = Atoms("H2OXe", positions=[[0, 0, 0], [0.9, 0, 0], [0, 1.1, 0.2], [20, 20, 20]])
    e, f, s, ei = _run(model64, atoms)
    assert torch.isfinite(e) and torch.equal(s, torch.zeros_like(s))
    assert torch.equal(f[3], torch.zeros(3, dtype=F64))
    assert f[:3].norm() > 0


def test_neighbor_list_matches_ase_and_is_sorted_with_consistent_slots():
    from ase.neighborlist import neighbor_list
    atoms = _mixed()
    edge_index, shifts, slots = neighbor_arrays(atoms.positions, atoms.cell.array, atoms.pbc, 4.0)
    i, j, S = neighbor_list("ijS", atoms, 4.0)
    ours = {(int(c), int(n), *map(int, sh)) for n, c, sh in zip(edge_index[0], edge_index[1], shifts)}
    assert ours == {(int(a), int(b), *map(int, sh)) for a, b, sh in zip(i, j, S)}
    assert np.all(np.diff(edge_index[1]) >= 0)                       # sorted by centre
    e = edge_index.shape[1]
    for atom in range(len(atoms)):
        mine = slots[atom][slots[atom] < e]
        assert np.array_equal(np.sort(mine), np.flatnonzero(edge_index[1] == atom))
        assert np.all(slots[atom][len(mine):] == e)


def test_the_ase_fallback_gives_the_same_list_as_vesin(monkeypatch):
    pytest.importorskip("vesin")
    atoms = _mixed()
    want = neighbor_arrays(atoms.positions, atoms.cell.array, atoms.pbc, 4.0)
    monkeypatch.setitem(sys.modules, "vesin", None)                  # import vesin -> ImportError
    got = neighbor_arrays(atoms.positions, atoms.cell.array, atoms.pbc, 4.0)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


def test_same_seed_same_model_and_checkpoint_round_trip(tmp_path):
    a, b = SO2Potential(**SMALL, seed=4), SO2Potential(**SMALL, seed=4)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert not torch.equal(SO2Potential(**SMALL, seed=5).embedding.weight, a.embedding.weight)
    a.save(tmp_path / "m.pt")
    c = SO2Potential.load(tmp_path / "m.pt")
    atoms = _cu()
    assert torch.equal(_run(a, atoms)[1], _run(c, atoms)[1])


# A checkpoint's config as ``SO2Potential.save`` has always written it: the constructor's keywords.
CHECKPOINT_CONFIG = {"lmax": 2, "focus_dim": 16, "n_focus": 2, "cutoff": 4.0, "seed": 4, "n_blocks": 2,
                     "n_layers": 3, "n_radial": 8, "radial_hidden": 32, "avg_neighbors": 12.0, "envelope_p": 6,
                     "energy_scale": 10.0}


def test_the_hyperparameters_come_as_a_config_or_as_keywords_and_old_checkpoints_load(tmp_path):
    by_keywords = SO2Potential(**SMALL, seed=4)
    by_config = SO2Potential(PotentialConfig(**SMALL), seed=4)
    assert by_keywords.config == by_config.config == CHECKPOINT_CONFIG
    assert list(by_keywords.config) == list(CHECKPOINT_CONFIG)
    for (name, p), (name_, q) in zip(by_keywords.state_dict().items(), by_config.state_dict().items()):
        assert name == name_ and torch.equal(p, q), name
    # as an earlier mixstack wrote it, before PotentialConfig: a dict of the constructor's keywords
    torch.save({"kind": "mixstack.SO2Potential", "config": dict(CHECKPOINT_CONFIG), "dtype": "float32",
                "state_dict": by_keywords.state_dict()}, tmp_path / "old.pt")
    loaded = SO2Potential.load(tmp_path / "old.pt")
    assert loaded.config == CHECKPOINT_CONFIG
    assert list(loaded.state_dict()) == list(by_keywords.state_dict())
    with pytest.raises(TypeError, match="'lamx'"):
        SO2Potential(lamx=2)
    with pytest.raises(ValueError, match="n_blocks"):
        SO2Potential(n_blocks=0)


def test_training_mode_forces_are_differentiable_in_the_weights():
    model = SO2Potential(lmax=1, focus_dim=16, n_blocks=2, n_layers=2, cutoff=4.0).train()
    _, forces, _, _ = model(*atoms_inputs(_cu(), model.cutoff))
    # Block 0 sees scalars only (its |m| = 1 input is zero); block 1's U carries the angular path.
    grads = torch.autograd.grad(forces.square().sum(), [model.blocks[1].stack.u, model.blocks[0].stack.w0,
                                                        model.embedding.weight])
    assert all(g.abs().sum() > 0 for g in grads)


def test_import_mixstack_does_not_import_ase():
    code = "import sys, mixstack; assert 'ase' not in sys.modules and 'vesin' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_eval_mode_hands_the_stack_detached_weights_and_training_mode_live_ones(monkeypatch):
    """Weights that require grad would send the stack's backward to the reference formulas (see
    mixstack.stack.ops); inference must not pay for that, training must keep the weight gradients."""
    from mixstack.potential import blocks
    seen = []

    def spy(u0, alpha, w0, w1, gw, **kw):
        seen.append((w0.requires_grad, w1.requires_grad, gw.requires_grad))
        return real(u0, alpha, w0, w1, gw, **kw)

    real = blocks.mixing_stack
    monkeypatch.setattr(blocks, "mixing_stack", spy)
    model = SO2Potential(lmax=1, focus_dim=16, n_blocks=2, n_layers=2, cutoff=4.0)
    inputs = atoms_inputs(_cu(), model.cutoff)
    model.eval()(*inputs)
    model.train()(*inputs)
    assert seen == [(False, False, False)] * 2 + [(True, True, True)] * 2
