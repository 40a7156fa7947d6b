"""One rank's share without LAMMPS: a periodic cell as local atoms plus a shell of image atoms.

``DomainEvaluator`` must give the periodic energy exactly from the local
energies, the periodic forces once ghost forces are added to their owners,
and the stress from ``sum_i x_i f_i`` over local and ghost atoms (what
``virial_fdotr_compute`` sums) — the three things LAMMPS relies on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402

from mixstack.lammps.domain import DomainEvaluator, local_graph  # noqa: E402
from mixstack.potential import SO2Potential  # noqa: E402
from mixstack.potential.calculator import MixstackCalculator  # noqa: E402

KW = dict(lmax=1, focus_dim=8, n_focus=1, n_layers=2, radial_hidden=16, cutoff=2.6, energy_scale=10.0)


def _with_ghosts(atoms, shell: float):
    """Positions of the atoms, then of every image within ``shell`` of the (orthogonal) cell,
    the owner of each, and all pairs within the cutoff (``dst`` the centre)."""
    pos, lengths = atoms.get_positions(), atoms.cell.lengths()
    reach = np.ceil(shell / lengths).astype(int)
    images, owners = [pos], [np.arange(len(atoms))]
    for s in np.ndindex(*(2 * reach + 1)):
        shift = np.array(s) - reach
        if not shift.any():
            continue
        p = pos + shift @ atoms.cell.array
        inside = np.all((p > -shell) & (p < lengths + shell), axis=1)
        images.append(p[inside])
        owners.append(np.flatnonzero(inside))
    x, owner = np.concatenate(images), np.concatenate(owners)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    dst, src = np.nonzero((d < KW["cutoff"]) & (d > 0))
    return x, owner, src, dst


@pytest.mark.parametrize("n_blocks", [1, 2])
def test_local_energies_ghost_forces_and_virial_equal_the_periodic_ones(n_blocks):
    atoms = bulk("C", "diamond", a=3.567, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=4)
    atoms.numbers[::5] = 14
    model = SO2Potential(**KW, n_blocks=n_blocks, dtype=torch.float64)
    evaluator = DomainEvaluator(model, [6, 14])
    x, owner, src, dst = _with_ghosts(atoms, evaluator.receptive_field + 0.3)
    types = np.where(atoms.numbers[owner] == 6, 1, 2)
    n = len(atoms)
    energy, forces, local = evaluator.compute(n, x, types, np.stack((src, dst)).astype(np.int32))
    assert evaluator.stats.atoms < x.shape[0]           # the outer shell never enters
    calc = MixstackCalculator(model)
    assert energy == pytest.approx(calc.get_potential_energy(atoms), rel=1e-12)
    np.testing.assert_allclose(local, calc.get_potential_energies(atoms), rtol=1e-10, atol=1e-12)
    folded = np.zeros((n, 3))
    np.add.at(folded, owner, forces)
    np.testing.assert_allclose(folded, calc.get_forces(atoms), rtol=0, atol=1e-11)
    virial = x.T @ forces                                # sum_i x_i f_i, local and ghost
    stress = -virial / atoms.get_volume()
    want = calc.get_stress(atoms)
    np.testing.assert_allclose(stress[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]], want, rtol=0, atol=1e-11)


def test_local_graph_keeps_the_edges_within_n_blocks_minus_one_hops_of_a_local_atom():
    # a chain 0 - 1 - 2 - 3 - 4 with atom 0 local, both directions
    a = np.array([0, 1, 1, 2, 2, 3, 3, 4])
    b = np.array([1, 0, 2, 1, 3, 2, 4, 3])
    a, b = torch.from_numpy(a), torch.from_numpy(b)
    g = local_graph(1, 5, a, b, n_blocks=2)
    assert g.atoms.tolist() == [0, 1, 2]                 # atoms within 2 hops
    edges = {(int(s), int(d)) for s, d in g.edge_index.T}
    assert edges == {(1, 0), (0, 1), (2, 1)}             # centres within 1 hop
    assert g.slots.shape[0] == 3
    g = local_graph(1, 5, a, b, n_blocks=3)
    assert g.atoms.tolist() == [0, 1, 2, 3]
    assert {(int(s), int(d)) for s, d in g.edge_index.T} == {(1, 0), (0, 1), (2, 1), (1, 2), (3, 2)}


def test_local_graph_sorts_edges_by_centre_then_source_for_a_fixed_sum_order():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 30, 400), rng.integers(0, 30, 400)
    keep = src != dst
    g = local_graph(10, 30, torch.from_numpy(src[keep]), torch.from_numpy(dst[keep]), n_blocks=2)
    s, d = g.edge_index.numpy()
    assert np.all(np.diff(d) >= 0)
    assert np.all((np.diff(d) > 0) | (np.diff(s) >= 0))
    e = s.size
    for i, row in enumerate(g.slots.numpy()):
        assert row[row < e].tolist() == np.flatnonzero(d == i).tolist()


def test_an_evaluator_needs_an_so2potential_and_atomic_numbers():
    with pytest.raises(TypeError, match="SO2Potential"):
        DomainEvaluator(torch.nn.Linear(2, 2), [6])
    with pytest.raises(ValueError, match="numbers"):
        DomainEvaluator(SO2Potential(**KW), [])
