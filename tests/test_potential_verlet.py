"""The Verlet neighbour list with a skin (``mixstack.potential.verlet``) and zero-length edges:
when the list is rebuilt, that every call gives exactly the tensors of a fresh list, that the
calculator's results do not depend on the skin, and that coincident atoms or images raise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
from ase import Atoms  # noqa: E402
from ase.build import bulk  # noqa: E402

from mixstack.potential import SO2Potential  # noqa: E402
from mixstack.potential.calculator import MixstackCalculator  # noqa: E402
from mixstack.potential.neighbors import ZeroLengthEdgeError, system_inputs  # noqa: E402
from mixstack.potential.verlet import VerletList  # noqa: E402

CUTOFF, SKIN = 4.0, 1.0


def _cu(reps=(3, 3, 3)):
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat(reps)
    atoms.rattle(0.05, seed=1)
    return atoms


def _same(got, want) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, want))


def test_every_call_gives_the_tensors_of_a_fresh_list_and_rebuilds_only_when_needed():
    atoms = _cu()
    vl = VerletList(CUTOFF, SKIN)
    rng = np.random.default_rng(0)
    pos, reasons = atoms.positions.copy(), []
    for _ in range(5):
        got = vl(pos, atoms.cell.array, atoms.pbc, atoms.numbers)
        reasons.append(vl.last_reason)
        assert _same(got, system_inputs(pos, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF))
        pos = pos + rng.normal(scale=0.04, size=pos.shape)           # never 0.5 Å from the start
    assert reasons == ["no list yet", None, None, None, None] and vl.rebuilds == 1
    # the list did change under the kept skin list: pairs came within the cutoff and left it
    first = system_inputs(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF)
    assert got.edge_index.shape != first.edge_index.shape


@pytest.mark.parametrize("move, rebuilt", [(0.49, False), (0.51, True)])
def test_one_atom_moving_more_than_half_the_skin_rebuilds(move, rebuilt):
    atoms = _cu()
    vl = VerletList(CUTOFF, SKIN)
    vl(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers)
    pos = atoms.positions.copy()
    pos[7] += move * SKIN * np.array([0.6, 0.0, 0.8])
    got = vl(pos, atoms.cell.array, atoms.pbc, atoms.numbers)
    assert (vl.rebuilds == 2) == rebuilt and (vl.last_reason is not None) == rebuilt
    assert _same(got, system_inputs(pos, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF))


@pytest.mark.parametrize("what", ["cell", "pbc", "numbers"])
def test_a_change_of_cell_periodicity_or_atoms_rebuilds(what):
    atoms = _cu()
    vl = VerletList(CUTOFF, SKIN)
    vl(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers)
    cell, pbc, numbers = atoms.cell.array.copy(), atoms.pbc.copy(), atoms.numbers.copy()
    if what == "cell":
        cell[0, 0] *= 1.001                                           # a strain step, atoms not moved
    elif what == "pbc":
        pbc[2] = False
    else:
        numbers[3] = 28
    got = vl(atoms.positions, cell, pbc, numbers)
    assert vl.rebuilds == 2 and vl.last_reason.startswith("the")
    assert _same(got, system_inputs(atoms.positions, cell, pbc, numbers, CUTOFF))


def test_a_zero_skin_rebuilds_on_every_call():
    atoms = _cu((2, 2, 2))
    vl = VerletList(CUTOFF, 0.0)
    for _ in range(3):
        vl(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers)
    assert vl.rebuilds == 3


@pytest.mark.slow
def test_the_calculators_results_do_not_depend_on_the_skin():
    """A short NVE trajectory with a skin gives the bits of the same steps with a fresh list each step."""
    from ase import units
    from ase.md.verlet import VelocityVerlet
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=1, n_layers=2, cutoff=CUTOFF,
                         energy_scale=10.0)
    runs = []
    for skin in (SKIN, 0.0):
        atoms = _cu((2, 2, 2))
        atoms.set_momenta(np.random.default_rng(2).normal(scale=0.3, size=(len(atoms), 3)))
        atoms.calc = MixstackCalculator(model, skin=skin)
        md = VelocityVerlet(atoms, timestep=2 * units.fs)
        frames = []
        for _ in range(4):
            md.run(1)
            frames.append((atoms.get_potential_energy(), atoms.get_forces().copy(), atoms.get_stress().copy()))
        runs.append((frames, atoms.calc.neighbors.rebuilds))
    (with_skin, rebuilds), (fresh, fresh_rebuilds) = runs
    assert rebuilds == 1 and fresh_rebuilds == 5                      # 4 steps + the initial forces
    for (e, f, s), (e0, f0, s0) in zip(with_skin, fresh):
        assert e == e0 and np.array_equal(f, f0) and np.array_equal(s, s0)


def test_coincident_atoms_and_an_atom_on_anothers_image_raise_a_clear_error():
    atoms = Atoms("Cu2", positions=[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], cell=[5.0, 5.0, 5.0], pbc=True)
    with pytest.raises(ZeroLengthEdgeError, match=r"atoms (0 and 1|1 and 0) are 0 Å apart.*coincident"):
        system_inputs(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF)
    atoms.positions[1] = [6.0, 1.0, 1.0]                             # atom 0's image shifted by a
    with pytest.raises(ZeroLengthEdgeError, match="periodic image shifted by"):
        system_inputs(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF)
    atoms.calc = MixstackCalculator(SO2Potential(lmax=1, focus_dim=16, n_blocks=1, cutoff=CUTOFF))
    with pytest.raises(ZeroLengthEdgeError):
        atoms.get_potential_energy()


def test_atoms_moved_onto_each_other_under_a_kept_list_raise_too():
    atoms = _cu((2, 2, 2))
    vl = VerletList(CUTOFF, 20.0)                                     # a skin that never rebuilds here
    vl(atoms.positions, atoms.cell.array, atoms.pbc, atoms.numbers)
    pos = atoms.positions.copy()
    pos[1] = pos[0]
    with pytest.raises(ZeroLengthEdgeError, match="coincident"):
        vl(pos, atoms.cell.array, atoms.pbc, atoms.numbers)
    assert vl.rebuilds == 1


def test_padded_lists_keep_their_shape_and_give_the_models_results_unchanged():
    """``pad=True`` (CUDA-graph replay): the edge count is ``edge_capacity`` of the pairs within the
    cutoff, the pads are pairs beyond it in list order (edges stay sorted by centre), ``slots`` is
    a multiple of 8 wide, and the model's energy, forces and stress are those of the fresh list."""
    from mixstack.potential.verlet import SLOT_QUANTUM, edge_capacity
    atoms = _cu()
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=1, n_layers=2, cutoff=CUTOFF,
                         energy_scale=10.0, dtype=torch.float64).eval()
    vl = VerletList(CUTOFF, SKIN, dtype=torch.float64, pad=True)
    rng = np.random.default_rng(3)
    pos, shapes = atoms.positions.copy(), set()
    for _ in range(3):
        got = vl(pos, atoms.cell.array, atoms.pbc, atoms.numbers)
        fresh = system_inputs(pos, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF, dtype=torch.float64)
        n_in, n = fresh.edge_index.shape[1], got.edge_index.shape[1]
        assert n == edge_capacity(n_in) > n_in and got.slots.shape[1] % SLOT_QUANTUM == 0
        centres = got.edge_index[1]
        assert bool((centres[1:] >= centres[:-1]).all())
        length = torch.linalg.vector_norm(got.positions[got.edge_index[0]] - got.positions[centres]
                                          + got.shifts @ got.cell, dim=-1)
        assert int((length < CUTOFF).sum()) == n_in                   # every pad lies beyond the cutoff
        for a, b in zip(model(*got), model(*fresh)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        shapes.add(n)
        pos = pos + rng.normal(scale=0.04, size=pos.shape)
    assert len(shapes) == 1                                           # still between rebuilds


@pytest.mark.parametrize("n, cap", [(1, 256), (256, 256), (257, 512), (20_000, 20_480), (409_688, 417_792)])
def test_edge_capacity_rounds_up_in_steps_of_a_few_per_cent(n, cap):
    from mixstack.potential.verlet import edge_capacity
    assert edge_capacity(n) == cap and (cap - n) / n < 1 / 32 + 256 / n


@pytest.mark.parametrize("n, cap", [(1, 256), (20_000, 20_224), (316_554, 317_440)])
def test_a_finer_edge_capacity_pads_by_at_most_one_step(n, cap):
    from mixstack.potential.verlet import edge_capacity
    assert edge_capacity(n, steps=256) == cap and (cap - n) / n < 1 / 256 + 256 / n


@pytest.mark.parametrize("steps", [0, 3, 48])
def test_the_capacity_steps_must_be_a_power_of_two(steps):
    from mixstack.potential.verlet import edge_capacity
    with pytest.raises(ValueError, match="steps"):
        edge_capacity(1000, steps=steps)


def test_the_edge_capacity_holds_while_the_count_wanders_and_moves_when_it_must():
    from mixstack.potential.verlet import edge_capacity
    cap = edge_capacity(20_000)
    assert [edge_capacity(n, cap) for n in (19_500, 20_480, 19_000 + 457)] == [cap] * 3
    assert edge_capacity(cap + 1, cap) > cap                          # outgrown: grows
    assert edge_capacity(cap - 2 * 512, cap) < cap                     # two steps below: shrinks


def test_pads_are_spread_over_the_centres_and_a_rebuild_keeps_the_padded_shapes():
    """Pads evenly spaced over the list: no centre gets many more than ``pads / atoms`` of them,
    so ``slots`` is the natural width plus its spare, and the pairs a rebuild brings beyond the
    cutoff do not widen it (pads in list order crowded onto the first centres and widened
    ``slots`` at rebuilds: a recapture of the frame's graph each time)."""
    from mixstack.potential.verlet import SLOT_QUANTUM
    atoms = _cu((4, 4, 4))
    vl = VerletList(CUTOFF, SKIN, dtype=torch.float64, pad=True)
    rng = np.random.default_rng(5)
    pos, shapes = atoms.positions.copy(), []
    for step in range(6):
        got = vl(pos, atoms.cell.array, atoms.pbc, atoms.numbers)
        fresh = system_inputs(pos, atoms.cell.array, atoms.pbc, atoms.numbers, CUTOFF, dtype=torch.float64)
        n = len(atoms)
        pads = torch.bincount(got.edge_index[1], minlength=n) - torch.bincount(fresh.edge_index[1], minlength=n)
        need = got.edge_index.shape[1] - fresh.edge_index.shape[1]
        assert need > 0 and int(pads.min()) >= 0 and int(pads.max()) <= 2 * -(-need // n) + 1, (need, pads.max())
        natural = int(torch.bincount(fresh.edge_index[1]).max())
        assert got.slots.shape[1] <= -(-(natural + int(pads.max()) + SLOT_QUANTUM) // SLOT_QUANTUM) * SLOT_QUANTUM
        shapes.append((got.edge_index.shape[1], got.slots.shape[1]))
        pos = pos + rng.normal(scale=0.02, size=pos.shape)
        if step == 2:
            pos[0] += 0.6                                   # past half the skin: the next call rebuilds
    assert vl.rebuilds == 2 and len(set(shapes)) == 1, shapes
