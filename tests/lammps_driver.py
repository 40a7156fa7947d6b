"""Single points in LAMMPS for the rank-count tests; run under ``mpirun`` (every rank runs it).

    mpirun -np N python tests/lammps_driver.py PLAN.json OUT.npz

``PLAN.json`` lists jobs ``{"name", "structure" (a file ASE reads), "model" (an
SO2Potential.save file), "skin"}``; each runs in a fresh LAMMPS instance, and
rank 0 writes ``<name>/energy``, ``<name>/forces`` (by atom ID) and
``<name>/stress`` (Voigt) into ``OUT.npz``.
"""

from __future__ import annotations

import json
import sys

import ase.io
import numpy as np

from mixstack.lammps import attach, create_system, new_lammps, single_point
from mixstack.potential import SO2Potential


def main(plan_path: str, out_path: str) -> int:
    with open(plan_path) as fh:
        jobs = json.load(fh)
    results, rank = {}, 0
    for job in jobs:
        atoms = ase.io.read(job["structure"])
        model = SO2Potential.load(job["model"])
        lmp = new_lammps(["-log", "none", "-screen", "none"])
        try:
            rank = lmp.extract_setting("world_rank")
            prism = create_system(lmp, atoms, skin=job.get("skin", 0.5), velocities=False)
            pair = attach(lmp, model, list(dict.fromkeys(atoms.get_chemical_symbols())))
            got = single_point(lmp, prism)
            pair.detach()
        finally:
            lmp.close()
        for key, value in got.items():
            results[f"{job['name']}/{key}"] = np.asarray(value)
    if rank == 0:
        np.savez(out_path, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
