"""An ASE ``Atoms`` as a LAMMPS system, and energy, forces and stress read back in ASE's frame.

LAMMPS keeps a triclinic cell as an upper-triangular box (``a`` along x,
``b`` in the xy plane); ``ase.calculators.lammps.Prism`` rotates positions
and velocities into that frame and forces and stress back.  Units are
``metal``: eV, Å, ps, bar; velocities are converted from ASE's units.  Every
rank passes every atom; LAMMPS keeps the ones inside its sub-domain.
"""

from __future__ import annotations

import numpy as np

VIRIAL_COMPUTE = "mixstack_virial"     # compute pressure without the kinetic term


def _ase():
    try:
        from ase.calculators.lammps import Prism, convert
        from ase.data import atomic_masses, atomic_numbers
    except ImportError as exc:
        raise ImportError('mixstack.lammps needs ASE; install it with `pip install -e ".[lammps]"` from a clone '
                          "of mixstack") from exc
    return Prism, convert, atomic_masses, atomic_numbers


def elements_of(atoms) -> list[str]:
    """The chemical symbols of ``atoms`` in order of first appearance (atom type 1, 2, ...)."""
    return list(dict.fromkeys(atoms.get_chemical_symbols()))


def create_system(lmp, atoms, elements=None, *, skin: float = 1.0, velocities: bool = True):
    """Set up units, box, types, masses and atoms (with ASE's velocities when ``velocities``).

    ``elements``: one chemical symbol per atom type (default ``elements_of(atoms)``).
    ``skin``: the neighbour-list skin in Å.  Returns the ``Prism`` that maps
    vectors between the frames.
    """
    Prism, convert, atomic_masses, atomic_numbers = _ase()
    elements = list(elements) if elements is not None else elements_of(atoms)
    symbols = atoms.get_chemical_symbols()
    missing = sorted(set(symbols) - set(elements))
    if missing:
        raise ValueError(f"elements {elements} has no atom type for {', '.join(missing)} in the structure")
    if atoms.cell.volume <= 1e-9:
        raise ValueError("atoms need a cell of non-zero volume (for a molecule: atoms.center(vacuum=10.0))")
    if skin <= 0:
        raise ValueError(f"skin must be > 0 Å, got {skin}")
    pbc = atoms.get_pbc()
    prism = Prism(atoms.cell.array, pbc)
    xhi, yhi, zhi, xy, xz, yz = (repr(float(v)) for v in prism.get_lammps_prism())
    region = (f"region box prism 0 {xhi} 0 {yhi} 0 {zhi} {xy} {xz} {yz} units box"
              if prism.is_skewed() else f"region box block 0 {xhi} 0 {yhi} 0 {zhi} units box")
    lmp.commands_list([
        "units metal",
        "atom_style atomic",
        "atom_modify map array",
        "boundary " + " ".join("p" if p else "s" for p in pbc),
        region,
        f"create_box {len(elements)} box",
        f"neighbor {float(skin)!r} bin",
        "neigh_modify every 1 delay 0 check yes",
    ] + [f"mass {t} {float(atomic_masses[atomic_numbers[e]])!r}" for t, e in enumerate(elements, start=1)])
    n = len(atoms)
    type_of = {e: t for t, e in enumerate(elements, start=1)}
    types = [type_of[s] for s in symbols]
    x = prism.vector_to_lammps(atoms.get_positions(), wrap=True).ravel()
    v = None
    if velocities:
        v = convert(prism.vector_to_lammps(atoms.get_velocities()), "velocity", "ASE", "metal").ravel()
    created = lmp.create_atoms(n, list(range(1, n + 1)), types, x, v)
    total = lmp.get_natoms()
    if total != n:
        raise RuntimeError(f"LAMMPS holds {total} atoms after creating {n} (created {created} on this rank)")
    lmp.command(f"compute {VIRIAL_COMPUTE} all pressure NULL virial")
    return prism


def thermo_columns() -> list[str]:
    """The thermo keywords ``single_point`` reads: potential energy and the virial pressure."""
    return ["pe"] + [f"c_{VIRIAL_COMPUTE}[{i}]" for i in range(1, 7)]


def single_point(lmp, prism) -> dict:
    """``run 0`` and return ``energy`` (eV), ``forces (N, 3)`` by atom ID (eV/Å) and ``stress``
    (Voigt ``xx yy zz yz xz xy``, eV/Å^3, ASE's sign: ``(1/V) dE/d(strain)``), in ASE's frame.

    Sets ``thermo_style`` to ``thermo_columns()``.
    """
    lmp.command("thermo_style custom step " + " ".join(thermo_columns()))
    lmp.command("run 0")
    # last_thermo names columns by their headers (PotEng, ...): read them by position
    values = list(lmp.last_thermo().values())[1:]
    pe = values[0]
    pxx, pyy, pzz, pxy, pxz, pyz = values[1:7]          # LAMMPS orders xx yy zz xy xz yz
    pressure = np.array([[pxx, pxy, pxz], [pxy, pyy, pyz], [pxz, pyz, pzz]])
    stress = prism.tensor2_to_ase(-pressure / lmp.extract_global("nktv2p"))   # bar -> eV/Å^3, LAMMPS's own factor
    n = lmp.get_natoms()
    forces = np.ctypeslib.as_array(lmp.gather_atoms("f", 1, 3)).reshape(n, 3)
    return {"energy": float(pe),
            "forces": prism.vector_to_ase(forces),
            "stress": stress[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]]}
