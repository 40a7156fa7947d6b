"""``mixstack md``: molecular dynamics of an ``SO2Potential`` in LAMMPS (MPI ranks) or ASE (one process).

    mpirun -np 2 python -m mixstack md --structure diamond --atoms 512 --steps 200 --ensemble nvt

The structure is a file ASE reads or a builder (``diamond``, ``cu-bcc``: the
rattled cells of ``mixstack bench model``); velocities are Maxwell-Boltzmann
at ``--temperature`` from ``--seed`` with zero total momentum, the same on
every rank and in both engines, so an ASE run (``--engine ase``) is the
single-process reference of a LAMMPS run.  Ensembles: NVE (velocity
Verlet), NVT (Nosé-Hoover in LAMMPS, Langevin in ASE) and NPT (LAMMPS,
isotropic Nosé-Hoover).  LAMMPS prints its usual thermo lines and run
summary; ``--json`` writes a record with the thermo table, steps per second,
LAMMPS's timing breakdown and, per rank, its device (``placement``: one GPU
per node-local rank) and what the model calls cost (atoms and edges,
host-device copies, seconds per phase, peak device memory, the stack's paths).  ``--warmup``
steps run untimed first; ``--forces`` writes the step-0 energy and forces by
atom ID (the scaling driver compares rank counts with it).

``run_md`` is the entry point (it never prints); ``mixstack.cli.md`` is the command.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..dispatch.levels import set_level
from ..potential.cells import MODEL_NAMES, SCALING_LITE_MODEL, SCALING_MODEL, build_cell, model_size  # noqa: F401
from . import logfile

log = logging.getLogger(__name__)

SCHEMA = "mixstack-md/1"
BUILDERS = ("diamond", "cu-bcc")
ENSEMBLES = ("nve", "nvt", "npt")
ENGINES = ("lammps", "ase")
THERMO = ("Step", "Time", "Temp", "PotEng", "KinEng", "TotEng", "Press", "Volume")


@dataclass(frozen=True)
class MDConfig:
    """One MD run.  Units: fs, K, bar, Å."""

    structure: str = "diamond"
    atoms: int = 512                   # builders: about this many atoms
    repeat: tuple[int, int, int] = (1, 1, 1)
    model: str = "small"               # an SO2Potential.save file, or one of MODEL_NAMES
    float64: bool = False              # MODEL_NAMES: build the model in float64
    ensemble: str = "nve"
    steps: int = 100
    timestep: float = 1.0
    temperature: float = 300.0
    pressure: float = 1.0
    tdamp: float | None = None         # default 100 time steps
    pdamp: float | None = None         # default 1000 time steps
    thermo: int | None = None          # default steps // 20
    traj: str | None = None
    traj_every: int | None = None      # default: every thermo line
    engine: str = "lammps"
    device: str | None = None
    level: int | None = None
    skin: float = 1.0
    seed: int = 0
    log: str | None = None             # the LAMMPS log file (default: a temporary one)
    screen: bool = True                # LAMMPS screen output (rank 0)
    warmup: int = 0                    # LAMMPS: steps run before the timed run, outside every statistic
    forces: str | None = None          # LAMMPS: write the step-0 energy and forces by atom ID here (.npz)

    def __post_init__(self):
        checks = [("ensemble", self.ensemble, ENSEMBLES), ("engine", self.engine, ENGINES)]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name in ("atoms", "timestep", "skin"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if len(self.repeat) != 3 or min(self.repeat) < 1:
            raise ValueError(f"repeat must be three integers >= 1, got {self.repeat}")
        if self.engine == "ase" and self.ensemble == "npt":
            raise ValueError("engine ase runs nve and nvt; use engine lammps for npt")
        if self.engine == "ase" and (self.warmup or self.forces):
            raise ValueError("warmup and forces are options of engine lammps")

    @property
    def thermo_every(self) -> int:
        return self.thermo or max(1, self.steps // 20)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------ inputs

def prepare_atoms(cfg: MDConfig):
    """The structure with its initial velocities (identical on every rank and in both engines):
    Maxwell-Boltzmann momenta at ``cfg.temperature`` from ``cfg.seed``, total momentum zero."""
    from ase import units
    if cfg.structure in BUILDERS:
        atoms = build_cell(cfg.structure, cfg.atoms, seed=cfg.seed)
    elif os.path.exists(cfg.structure):
        import ase.io
        atoms = ase.io.read(cfg.structure)
    else:
        raise ValueError(f"structure: {cfg.structure!r} is neither a file nor one of {', '.join(BUILDERS)}")
    atoms = atoms.repeat(cfg.repeat)
    masses = atoms.get_masses()[:, None]
    rng = np.random.default_rng(cfg.seed)
    momenta = rng.standard_normal((len(atoms), 3)) * np.sqrt(masses * units.kB * cfg.temperature)
    momenta -= masses * (momenta.sum(0) / masses.sum())
    atoms.set_momenta(momenta)
    return atoms


def load_model(cfg: MDConfig):
    """The potential: a checkpoint, or a new (untrained) model of a named size."""
    from ..potential import SO2Potential
    if cfg.model in MODEL_NAMES:
        return SO2Potential(**model_size(cfg.model), seed=cfg.seed,
                            dtype=torch.float64 if cfg.float64 else torch.float32)
    if not os.path.exists(cfg.model):
        raise ValueError(f"model: {cfg.model!r} is neither a checkpoint file nor one of {', '.join(MODEL_NAMES)}")
    return SO2Potential.load(cfg.model)


def _device(cfg: MDConfig) -> torch.device:
    from ..measure.env import resolve_device
    return resolve_device(cfg.device)


# ------------------------------------------------------------------ LAMMPS

def _fix_commands(cfg: MDConfig) -> list[str]:
    dt_ps = cfg.timestep * 1e-3
    tdamp = (cfg.tdamp or 100 * cfg.timestep) * 1e-3
    pdamp = (cfg.pdamp or 1000 * cfg.timestep) * 1e-3
    t = cfg.temperature
    fix = {"nve": "fix md all nve",
           "nvt": f"fix md all nvt temp {t!r} {t!r} {tdamp!r}",
           "npt": f"fix md all npt temp {t!r} {t!r} {tdamp!r} iso {cfg.pressure!r} {cfg.pressure!r} {pdamp!r}"}
    return [f"timestep {dt_ps!r}", fix[cfg.ensemble]]


def _dump_commands(cfg: MDConfig, elements: list[str]) -> list[str]:
    if not cfg.traj:
        return []
    every = cfg.traj_every or cfg.thermo_every
    names = " ".join(elements)
    if cfg.traj.endswith(".xyz"):
        return [f"dump traj all xyz {every} {cfg.traj}", f"dump_modify traj element {names} sort id"]
    return [f"dump traj all custom {every} {cfg.traj} id element x y z vx vy vz fx fy fz",
            f"dump_modify traj element {names} sort id"]


def _set_cpu_threads(size: int) -> None:
    """On a CPU, ranks share the cores: without OMP_NUM_THREADS, give each rank its share."""
    if size > 1 and not os.environ.get("OMP_NUM_THREADS"):
        threads = max(1, (os.cpu_count() or 1) // size)
        torch.set_num_threads(threads)
        log.info("%d ranks on the CPU: %d torch threads each (set OMP_NUM_THREADS to override)", size, threads)


def _gather(value, size: int) -> list:
    """``value`` of every rank on rank 0 (through mpi4py; this rank's alone without it)."""
    if size == 1:
        return [value]
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as exc:
        log.warning("mpi4py is not usable (%s): the record holds rank 0's model statistics only", exc)
        return [value]
    return MPI.COMM_WORLD.gather(value, root=0) or []


def _use_device(placement) -> torch.device:
    """Make ``placement.device`` this process's device; empty its cache and reset its peak memory, so
    that the record's peak belongs to this run."""
    device = torch.device(placement.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return device


def write_single_point(lmp, path: str, rank: int) -> None:
    """``run 0``, then (rank 0) ``path``: ``energy`` (eV) and ``forces (N, 3)`` (eV/Å, LAMMPS's frame;
    row ``k`` is atom ID ``k + 1``).  Every rank must call it (the forces are gathered)."""
    lmp.command("run 0")
    energy = lmp.get_thermo("pe")
    n = lmp.get_natoms()
    forces = np.ctypeslib.as_array(lmp.gather_atoms("f", 1, 3)).reshape(n, 3).copy()
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        np.savez(path, energy=np.float64(energy), forces=forces)


def run_lammps(cfg: MDConfig, atoms, model) -> dict:
    """Run ``cfg`` in LAMMPS on the ranks of this MPI job; the record is complete on rank 0.

    Each rank runs the model on its own device (``placement.rank_device``:
    ``cuda`` without an index means one GPU per node-local rank, round robin).
    With ``cfg.forces`` a single point (``run 0``) comes first; ``cfg.warmup``
    steps follow; the statistics and LAMMPS's timing cover the timed run alone.
    """
    from ..dispatch.log import dispatch_log
    from .domain import CallStats
    from .pair import attach, new_lammps
    from .placement import multicast_off, rank_device
    from .system import create_system, elements_of
    multicast_off()
    tmp, rank = None, 0
    log_path = cfg.log
    if log_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="mixstack-md-")
        log_path = os.path.join(tmp.name, "log.lammps")
    args = ["-log", log_path] + ([] if cfg.screen else ["-screen", "none"])
    lmp = new_lammps(args)
    try:
        rank, size = lmp.extract_setting("world_rank"), lmp.extract_setting("world_size")
        placement = rank_device(cfg.device)
        device = _use_device(placement)
        if device.type == "cpu":
            _set_cpu_threads(size)
        elements = elements_of(atoms)
        create_system(lmp, atoms, elements, skin=cfg.skin)
        pair = attach(lmp, model, elements, device=device)
        lmp.commands_list(_fix_commands(cfg) + [
            "thermo_style custom step time temp pe ke etotal press vol",
            "thermo_modify norm no flush yes",
            f"thermo {cfg.thermo_every}",
        ] + _dump_commands(cfg, elements))
        if cfg.forces:
            write_single_point(lmp, cfg.forces, rank)
        if cfg.warmup:
            lmp.command(f"run {cfg.warmup}")
        pair.evaluator.stats = CallStats()            # the timed run's calls only
        # after a run, "pre no" skips the setup's force call: one model call per timed step
        with dispatch_log() as paths:
            start = time.perf_counter()
            lmp.command(f"run {cfg.steps}" + (" pre no" if cfg.forces or cfg.warmup else ""))
            wall = time.perf_counter() - start
        own = {"rank": rank, **placement.to_dict(), **pair.stats.to_dict(), "paths": dict(sorted(paths.items()))}
        stats = _gather(own, size)
        pair.detach()
        parsed = logfile.read(log_path) if rank == 0 else {}
    finally:
        lmp.close()
        if tmp is not None:
            tmp.cleanup()
    loop = parsed.get("loop_seconds") or wall
    return {"rank": rank, "ranks": size, "device": str(device), "receptive_field": pair.receptive_field,
            "wall_seconds": wall,
            "loop_seconds": loop, "thermo": parsed.get("thermo", {}), "lammps_sections": parsed.get("sections"),
            "lammps_performance": parsed.get("performance"), "model_calls": stats, "rank_calls": own}


# ------------------------------------------------------------------ ASE

def run_ase(cfg: MDConfig, atoms, model) -> dict:
    """Run ``cfg`` with ASE's integrators and ``MixstackCalculator`` in this process."""
    import ase.io
    from ase import units
    from ase.md.langevin import Langevin
    from ase.md.verlet import VelocityVerlet

    from ..potential.calculator import MixstackCalculator
    device = _device(cfg)
    atoms.calc = MixstackCalculator(model, device=device)
    dt = cfg.timestep * units.fs
    if cfg.ensemble == "nve":
        dyn = VelocityVerlet(atoms, timestep=dt)
    else:
        tdamp = (cfg.tdamp or 100 * cfg.timestep) * units.fs
        dyn = Langevin(atoms, timestep=dt, temperature_K=cfg.temperature, friction=1.0 / tdamp,
                       rng=np.random.default_rng(cfg.seed))
    rows: list[list[float]] = []

    def observe():
        pe, ke = atoms.get_potential_energy(), atoms.get_kinetic_energy()
        step = dyn.nsteps
        press = -atoms.get_stress(include_ideal_gas=True)[:3].mean() / units.bar if atoms.pbc.all() else 0.0
        rows.append([step, step * cfg.timestep * 1e-3, atoms.get_temperature(), pe, ke, pe + ke, press,
                     atoms.get_volume()])
    dyn.attach(observe, interval=cfg.thermo_every)
    if cfg.traj:
        if os.path.exists(cfg.traj):                     # a fresh file, as LAMMPS's dump writes
            os.remove(cfg.traj)
        dyn.attach(lambda: ase.io.write(cfg.traj, atoms, append=True), interval=cfg.traj_every or cfg.thermo_every)
    atoms.get_forces()                                   # the first call (warm-up), outside the timing
    start = time.perf_counter()
    dyn.run(cfg.steps)
    wall = time.perf_counter() - start
    thermo = {name: [r[k] for r in rows] for k, name in enumerate(THERMO)}
    return {"rank": 0, "ranks": 1, "device": str(device), "wall_seconds": wall, "loop_seconds": wall, "thermo": thermo,
            "model_calls": None}


# ------------------------------------------------------------------ the run

def run_md(cfg: MDConfig) -> dict:
    """Run ``cfg``; return the record (complete on rank 0; ``record["rank"]`` says which rank)."""
    if cfg.level is not None:
        set_level(cfg.level)
    atoms = prepare_atoms(cfg)
    model = load_model(cfg)
    result = (run_lammps if cfg.engine == "lammps" else run_ase)(cfg, atoms, model)
    loop = result["loop_seconds"]
    record = {"schema": SCHEMA, "config": cfg.to_dict(), "atoms": len(atoms),
              "cell_lengths": [float(v) for v in atoms.cell.lengths()], "model": dict(model.config),
              "model_dtype": str(model.dtype).removeprefix("torch."), **result}
    record["steps_per_second"] = cfg.steps / loop if loop > 0 and cfg.steps else None
    etot = record["thermo"].get("TotEng") or []
    record["max_energy_drift_per_atom"] = (max(abs(e - etot[0]) for e in etot) / len(atoms)) if etot else None
    if record["rank"] == 0:
        from ..measure.env import collect
        from .runtime import lammps_version
        record["env"] = collect(result.get("device") or _device(cfg))
        record["env"]["lammps"] = lammps_version() if cfg.engine == "lammps" else None
    return record


# ------------------------------------------------------------------ reports

def summary_line(record: dict) -> str:
    """One line: atoms, ranks, steps per second, the largest total-energy drift."""
    sps = record.get("steps_per_second")
    drift = record.get("max_energy_drift_per_atom")
    cfg = record["config"]
    parts = [f"{record['atoms']} atoms, {cfg['engine']} on {record['ranks']} rank(s), {cfg['steps']} steps "
             f"{cfg['ensemble'].upper()} in {record['loop_seconds']:.3g} s"]
    if sps:
        parts.append(f"{sps:.3g} steps/s ({sps * record['atoms']:.3g} atom-steps/s)")
    if drift is not None:
        parts.append(f"max |E_total - E_total(0)| = {drift:.3g} eV/atom")
    return "; ".join(parts)


def thermo_lines(record: dict) -> list[str]:
    """The thermo table as text (LAMMPS's columns)."""
    thermo = record.get("thermo") or {}
    if not thermo:
        return []
    names = list(thermo)
    lines = ["".join(f"{n:>14}" for n in names)]
    for k in range(len(thermo[names[0]])):
        lines.append("".join(f"{thermo[n][k]:>14.8g}" for n in names))
    return lines
