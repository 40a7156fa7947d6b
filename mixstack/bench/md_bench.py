"""Molecular dynamics as users run it: ASE's velocity Verlet (NVE) driving ``MixstackCalculator``.

``run_md`` gives a cell Maxwell-Boltzmann velocities (a fixed seed, no net momentum), runs
``warmup`` steps untimed (a compiled variant compiles there), then ``steps`` timed steps of
``dt_fs``, and reports what MD users compare: steps per second, ns per day, µs per atom per
step (wall time of whole steps: the Verlet list's upkeep, host-device copies, the frame and
ASE's integrator), and the drift of the total energy (a least-squares slope, meV/atom/ps, with
its standard error, and the largest excursion from the first timed step) with the number of
neighbour-list rebuilds.
A compiled variant compiles the energy with dynamic shapes (``MixstackCalculator(compile=True)``):
the edge count changes from step to step.  A graphed variant (``cuda_graphs``) replays each
frame from a CUDA graph, the neighbour list padding the edges so that shapes hold between
rebuilds; the record counts the graphs captured.
"""

from __future__ import annotations

import time

import numpy as np

from ..dispatch.levels import use_level

FS_PER_NS = 1e6
SECONDS_PER_DAY = 86400.0


def drift(t_ps, per_atom_eV) -> tuple[float, float]:
    """The least-squares slope of the total energy per atom against time, in meV/atom/ps, and
    its standard error (from the residuals: two drifts closer than their errors are the same
    drift); ``nan`` for both with fewer than three points."""
    t = np.asarray(t_ps, dtype=np.float64)
    e = np.asarray(per_atom_eV, dtype=np.float64) * 1e3
    if t.size < 3:
        return float("nan"), float("nan")
    dt = t - t.mean()
    slope = float((dt * (e - e.mean())).sum() / (dt * dt).sum())
    residual = e - e.mean() - slope * dt
    se = float(np.sqrt((residual * residual).sum() / (t.size - 2) / (dt * dt).sum()))
    return slope, se


def nve(atoms, *, steps: int, warmup: int = 5, dt_fs: float = 1.0, temperature_K: float = 300.0, seed: int = 0,
        before=None) -> dict:
    """NVE of ``atoms`` (its calculator set; modified) through ASE's velocity Verlet: Maxwell-Boltzmann
    velocities (seeded, no net momentum), ``warmup`` untimed steps, then ``steps`` timed ones;
    the throughput and energy-drift fields of the record described above.  ``before()`` runs
    after the warm-up (a counter's starting value)."""
    from ase import units
    from ase.md import velocitydistribution as vd
    from ase.md.verlet import VelocityVerlet

    thermalize = getattr(vd, "thermalize_momenta", None) or vd.MaxwellBoltzmannDistribution   # ASE >= 3.29 / older
    thermalize(atoms, temperature_K=temperature_K, rng=np.random.default_rng(seed))
    vd.Stationary(atoms)
    md = VelocityVerlet(atoms, timestep=dt_fs * units.fs)
    n = len(atoms)
    md.run(warmup)
    if before is not None:
        before()
    total = [atoms.get_total_energy()]
    start = time.perf_counter()
    for _ in range(steps):
        md.run(1)
        total.append(atoms.get_total_energy())
    elapsed = time.perf_counter() - start
    per_atom = np.asarray(total) / n
    t_ps = np.arange(len(per_atom)) * dt_fs * 1e-3
    slope, slope_se = drift(t_ps, per_atom)
    rate = steps / elapsed
    return {"steps": steps, "warmup_steps": warmup, "dt_fs": dt_fs, "temperature_K": temperature_K,
            "atoms": n, "wall_s": elapsed, "steps_per_s": rate,
            "ns_per_day": rate * dt_fs / FS_PER_NS * SECONDS_PER_DAY,
            "us_per_atom_step": elapsed / steps / n * 1e6,
            "drift_mev_atom_ps": slope, "drift_se_mev_atom_ps": slope_se,
            "max_excursion_mev_atom": float(np.abs(per_atom - per_atom[0]).max()) * 1e3,
            "final_temperature_K": float(atoms.get_temperature())}


def run_md(model, atoms, level: int, *, compiled: bool, steps: int, cuda_graphs: bool = False, warmup: int = 5, dt_fs: float = 1.0,
           temperature_K: float = 300.0, seed: int = 0, skin: float = 1.0, device=None) -> dict:
    """NVE of ``atoms`` (not modified) with ``model`` at ``level``; the record described above."""
    from ..potential.calculator import MixstackCalculator
    atoms = atoms.copy()
    atoms.calc = calc = MixstackCalculator(model, device=device, skin=skin, compile=compiled,
                                                      cuda_graphs=cuda_graphs)
    rebuilds = []
    with use_level(level):
        record = nve(atoms, steps=steps, warmup=warmup, dt_fs=dt_fs, temperature_K=temperature_K, seed=seed,
                     before=lambda: rebuilds.append(calc.neighbors.rebuilds))
    return {**record, "skin": skin, "neighbour_rebuilds": calc.neighbors.rebuilds - rebuilds[0],
            "graph_captures": None if calc.graphs is None else calc.graphs.captures,
            "graph_fallback": None if calc.graphs is None else calc.graphs.fallback_reason}
