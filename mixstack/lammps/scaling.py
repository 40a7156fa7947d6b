"""Strong and weak scaling of ``mixstack md`` in LAMMPS, one MPI rank per GPU.

    mixstack scaling --ranks 1,2,4 --strong diamond:50000,cu-bcc:500000 \\
        --weak diamond:100000 --levels 2,3 --out DIR
    mixstack scaling --report DIR        # the report again, from DIR/points

A *point* is one system (structure, atoms, model) at one level on one number
of ranks.  Strong points keep the system and add ranks; weak points keep
``ATOMS`` per rank.  Each point is an NVE run of ``--steps`` timed steps after
``--warmup`` untimed ones, through ``mixstack.lammps.runs.run_md``: its record
(steps per second, LAMMPS's timing breakdown, per rank the device and the
model calls' phases, copies and peak memory) lands in ``DIR/points``.  Strong
points also write their step-0 energy and forces by atom ID, and every rank
count is compared with the fewest ranks of the same system (``checks``).

The points of one (level, ranks) pair run in one ``mpirun`` (``mixstack scaling
--worker PLAN``: ``run_worker``, every rank running them in turn), so Python, CUDA and Triton start once per
launch; a launch that dies (a point out of memory aborts the MPI job) is
started again after the point that killed it.  ``--budget`` seconds bound the
whole measurement: the worker starts no point after the deadline and the
launch is killed at it; what finished is reported.  Points whose memory,
estimated from the model's bytes per edge (``BYTES_PER_EDGE``) and the ghost
shell of LAMMPS's processor grid, exceeds ``--memory-limit`` are skipped with
the estimate, and so are level-3 points of a model whose stack level 3 runs at level 2
(``level3_runs_level2``).  Ranks share GPUs round robin when there are more ranks than
GPUs (``placement``): such a run is a *dry run* of the procedure, and its
report says so; its efficiencies are not scaling figures.

Every launch runs with ``placement.MULTICAST_OFF`` in its environment.
``mixstack.lammps.scaling_report`` writes the JSON, Markdown, CSV and plot; the command
(``mixstack.cli.scaling``) parses the options, prints, and calls ``measure`` or ``report``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from . import placement, runtime

log = logging.getLogger(__name__)

POINTS_DIR = "points"
PLAN_NAME = "plan.json"
# Peak memory of one energy + forces evaluation per evaluated edge, bytes: level 0 on a CPU, an
# upper bound of a GPU's (BENCHMARKS.md, "Memory per edge, and what fits one H200").
BYTES_PER_EDGE = {"small": 22.7e3, "scaling": 25.2e3, "scaling-lite": 14.3e3, "bench": 75.3e3}
MEMORY_FRACTION = 0.95        # of a GPU's memory, the default --memory-limit


# ------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Point:
    """One run: ``atoms`` is the system's size (strong) or the size per rank (weak)."""

    series: str
    structure: str
    atoms: int
    model: str
    level: int | None
    ranks: int

    @property
    def total_atoms(self) -> int:
        """The target size of the whole system (the builder rounds it to whole unit cells)."""
        return self.atoms * self.ranks if self.series == "weak" else self.atoms

    @property
    def system(self) -> tuple:
        """What stays fixed along a scaling curve."""
        return (self.series, self.structure, self.atoms, self.model, self.level)

    @property
    def name(self) -> str:
        model = os.path.splitext(os.path.basename(self.model))[0]
        level = "default" if self.level is None else self.level
        return f"{self.series}-{self.structure}-{self.atoms}-{model}-L{level}-r{self.ranks}"

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name, "total_atoms": self.total_atoms}


def parse_list(text: str, kind=int, option: str = "--ranks") -> tuple:
    """``"1,2,4"`` -> ``(1, 2, 4)`` (duplicates dropped, order kept); the error names ``option``."""
    items = [t.strip() for t in str(text).replace(" ", ",").split(",") if t.strip()]
    try:
        values = tuple(dict.fromkeys(kind(t) for t in items))
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of {kind.__name__}s") from None
    if not values:
        raise ValueError(f"{option}: empty list")
    return values


def parse_systems(text: str, default_model: str, option: str) -> list[tuple[str, int, str]]:
    """``"diamond:50000,cu-bcc:500000:small"`` -> ``[(structure, atoms, model), ...]``."""
    from .runs import BUILDERS
    out = []
    for item in (t.strip() for t in str(text).split(",") if t.strip()):
        parts = item.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"{option}: {item!r} is not STRUCTURE:ATOMS or STRUCTURE:ATOMS:MODEL")
        structure, atoms = parts[0], parts[1]
        if structure not in BUILDERS:
            raise ValueError(f"{option}: structure {structure!r} is not one of {', '.join(BUILDERS)}")
        try:
            n = int(atoms)
        except ValueError:
            raise ValueError(f"{option}: {item!r}: ATOMS must be an integer") from None
        if n < 1:
            raise ValueError(f"{option}: {item!r}: ATOMS must be positive")
        out.append((structure, n, parts[2] if len(parts) == 3 else default_model))
    return out


def make_plan(ranks, strong, weak, levels) -> list[Point]:
    """Every point: for each level, each strong system on every rank count, then each weak one.
    ``strong`` and ``weak``: ``(structure, atoms, model)`` triples; ``levels`` may hold ``None``."""
    ranks = sorted({int(r) for r in ranks})
    if not ranks or ranks[0] < 1:
        raise ValueError(f"ranks must be positive integers, got {ranks}")
    points = []
    for level in levels:
        for series, systems in (("strong", strong), ("weak", weak)):
            for (structure, atoms, model), r in itertools.product(systems, ranks):
                points.append(Point(series, structure, int(atoms), model, level, r))
    return points


# ------------------------------------------------------------------ memory estimate

def processor_grid(lengths, ranks: int) -> tuple[int, int, int]:
    """LAMMPS's default brick grid for an orthogonal box: the factorisation of ``ranks`` whose
    sub-domains have the least surface (``Comm::procs2box``)."""
    lx, ly, lz = (float(v) for v in lengths)
    best, grid = math.inf, (ranks, 1, 1)
    for px in range(1, ranks + 1):
        if ranks % px:
            continue
        for py in range(1, ranks // px + 1):
            if (ranks // px) % py:
                continue
            pz = ranks // px // py
            a, b, c = lx / px, ly / py, lz / pz
            surface = a * b + b * c + a * c
            if surface < best - 1e-9:
                best, grid = surface, (px, py, pz)
    return grid


def edges_per_atom(structure: str, cutoff: float) -> float:
    """Neighbours within ``cutoff`` per atom of a ~500-atom rattled cell of ``structure``."""
    from ..potential.cells import build_cell
    from ..potential.neighbors import neighbor_arrays
    atoms = build_cell(structure, 500)
    edge_index, _, _ = neighbor_arrays(atoms.get_positions(), atoms.cell.array, atoms.pbc, cutoff)
    return edge_index.shape[1] / len(atoms)


def estimate_memory(point: Point, gpus: int, *, lengths=None, epa=None) -> dict | None:
    """``{"edges_per_rank", "bytes_per_gpu"}`` for a named model, ``None`` for a checkpoint.

    A rank evaluates the edges whose centre lies within one cutoff of its
    sub-domain (``domain.local_graph``); ranks on one GPU add up."""
    from ..potential.cells import model_size
    if point.model not in BYTES_PER_EDGE:
        return None
    cutoff = model_size(point.model)["cutoff"]
    if lengths is None:
        from ..potential.cells import build_cell
        lengths = build_cell(point.structure, point.total_atoms).cell.lengths()
    if epa is None:
        epa = edges_per_atom(point.structure, cutoff)
    grid = processor_grid(lengths, point.ranks)
    shell = math.prod(1 + 2 * cutoff * p / length for p, length in zip(grid, lengths))
    edges = point.total_atoms / point.ranks * epa * shell
    per_gpu = math.ceil(point.ranks / max(gpus, 1))
    return {"edges_per_rank": edges, "grid": list(grid),
            "bytes_per_gpu": edges * BYTES_PER_EDGE[point.model] * per_gpu}


def model_config(model: str) -> dict:
    """The ``SO2Potential`` arguments (and ``dtype``) of a named model or a checkpoint."""
    from ..potential.cells import MODEL_NAMES, model_size
    if model in MODEL_NAMES:
        return {**model_size(model), "dtype": "float32"}
    import torch
    blob = torch.load(model, map_location="cpu", weights_only=True)
    return {**blob["config"], "dtype": blob.get("dtype", "float32")}


def level3_runs_level2(model: str, device: str) -> str | None:
    """Why level 3 would run level 2 (or the reference) for ``model``'s stack on ``device``;
    ``None`` where its compensated kernels engage: a table entry with a config, or a config from
    the level-3 policy (docs/contract.md §3)."""
    if not device.startswith("cuda"):
        return "no GPU: the Triton levels run the reference"
    import torch

    from ..core.layout import StackLayout
    from ..dispatch.guards import unsupported_reason
    from ..stack import level3
    from ..tuning import shape_key, validity
    cfg = model_config(model)
    reason = unsupported_reason(StackLayout(cfg["lmax"], cfg["focus_dim"]), getattr(torch, cfg["dtype"]))
    if reason:
        return reason
    key = shape_key(focus_dim=cfg["focus_dim"], lmax=cfg["lmax"], n_focus=cfg["n_focus"], apply_alpha=True)
    plan = level3.resolve(key, validity.device_name(torch.device(device)))
    return None if plan.config is not None or plan.pending is not None else plan.reason


def triage(points: list[Point], gpus: int, memory_limit: float | None,
           device: str | None = None) -> tuple[list[Point], dict]:
    """``(points to run, {name: outcome})``: a point whose estimate exceeds ``memory_limit`` bytes
    per GPU is skipped with the estimate as the reason (``None`` skips none), and with a
    ``device``, a level-3 point whose model's stack level 3 runs at level 2 there (it would
    repeat the level-2 point)."""
    outcome: dict[str, dict] = {}
    runnable = []
    geometry: dict = {}
    level2_only: dict = {}
    for p in points:
        if device is not None and p.level == 3:
            if p.model not in level2_only:
                level2_only[p.model] = level3_runs_level2(p.model, device)
            if level2_only[p.model]:
                outcome[p.name] = {"status": "skipped", "why": f"level 3 runs level 2 here: {level2_only[p.model]}"}
                continue
        estimate = None
        if memory_limit and p.model in BYTES_PER_EDGE:
            key = (p.structure, p.total_atoms, p.model)
            if key not in geometry:
                from ..potential.cells import build_cell, model_size
                geometry[key] = (build_cell(p.structure, p.total_atoms).cell.lengths(),
                                 edges_per_atom(p.structure, model_size(p.model)["cutoff"]))
            estimate = estimate_memory(p, gpus, lengths=geometry[key][0], epa=geometry[key][1])
        if estimate and estimate["bytes_per_gpu"] > memory_limit:
            outcome[p.name] = {"status": "skipped", "estimate": estimate, "why": (
                f"estimated {estimate['bytes_per_gpu'] / 2**30:.0f} GiB per GPU "
                f"({estimate['edges_per_rank'] / 1e6:.2f}M edges per rank) > limit {memory_limit / 2**30:.0f} GiB")}
        else:
            runnable.append(p)
            if estimate:
                outcome[p.name] = {"status": "not run", "why": "budget", "estimate": estimate}
    return runnable, outcome


# ------------------------------------------------------------------ the worker (under mpirun)

def _write_json(path: str, doc) -> None:
    """``doc`` into ``path`` atomically (a reader never sees half a file)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


def run_worker(plan_path: str) -> int:
    """Run the plan's points in order on the ranks of this MPI job; rank 0 writes each record."""
    import gc

    import torch

    from .runs import MDConfig, run_md
    with open(plan_path) as fh:
        plan = json.load(fh)
    out = plan["points_dir"]
    for p in plan["points"]:
        if time.time() > plan["deadline"]:
            log.warning("the budget is spent: %s and later points are not run", p["name"])
            break
        name = p["name"]
        cfg = MDConfig(structure=p["structure"], atoms=p["total_atoms"], model=p["model"], level=p["level"],
                       steps=plan["steps"], warmup=plan["warmup"], thermo=plan["steps"] or 1,
                       device=plan["device"], seed=plan["seed"], screen=False,
                       log=os.path.join(out, f"{name}.log"),
                       forces=os.path.join(out, f"{name}.forces.npz") if p["series"] == "strong" else None)
        record = run_md(cfg)
        # every rank's own statistics, in case mpi4py could not gather them
        _write_json(os.path.join(out, f"{name}.rank{record['rank']}.json"), record["rank_calls"])
        if record["rank"] == 0:
            record["scaling_point"] = p
            _write_json(os.path.join(out, f"{name}.json"), record)
        del record
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0


# ------------------------------------------------------------------ the driver

def _gpu_count(device: str) -> int:
    if not device.startswith("cuda"):
        return 0
    import torch
    return torch.cuda.device_count()


def _gpu_memory(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(0).total_memory)


def _launch_env(device: str) -> dict:
    """The ranks' environment: multicast off, this mixstack importable; on a GPU one host thread
    per rank (the host's share of a step is serial, and LAMMPS's and torch's OpenMP runtimes
    contend when both get several threads); on the CPU ``mixstack md`` divides the cores."""
    env = placement.launch_env()
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    if device.startswith("cuda"):
        env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch(ranks: int, plan_path: str, log_path: str, timeout: float, device: str) -> tuple[int, bool]:
    """``mpirun -np ranks python -m mixstack scaling --worker PLAN``; ``(exit code, timed out)``.
    The whole process group is killed at ``timeout``."""
    mpirun = runtime.mpi_tool("mpirun")
    if mpirun is None:
        raise RuntimeError(f"no mpirun: install MPICH with {runtime.PIP_FIX}")
    cmd = [mpirun, "-np", str(ranks), sys.executable, "-m", "mixstack", "scaling", "--worker", plan_path]
    with open(log_path, "a") as fh:
        fh.write(f"== {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_launch_env(device),
                                preexec_fn=os.setsid)       # its own process group, killed as one
        try:
            return proc.wait(timeout=max(timeout, 1.0)), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -9, True


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def run_plan(points: list[Point], out_dir: str, *, device: str = "cuda", steps: int = 20, warmup: int = 3,
             budget: float = 3600.0, memory_limit: float | None = None, seed: int = 0,
             progress=None) -> dict:
    """Run ``points`` (see the module docstring); return the outcome of each point by name:
    ``{"status": "done" | "failed" | "skipped" | "not run", "why": ...}``."""
    from .build import plugin_path
    deadline = time.time() + budget
    points_dir = os.path.join(out_dir, POINTS_DIR)
    os.makedirs(points_dir, exist_ok=True)
    launch_log = os.path.join(out_dir, "launch.log")
    plugin_path()                                   # build once here, not on every rank
    gpus = _gpu_count(device)
    if memory_limit is None:
        total = _gpu_memory(device)
        memory_limit = MEMORY_FRACTION * total if total else None
    say = progress or (lambda text: None)
    runnable, outcome = triage(points, gpus, memory_limit, device)
    groups: dict[tuple, list[Point]] = {}
    for p in runnable:
        groups.setdefault((p.level, p.ranks), []).append(p)
        for stale in os.listdir(points_dir):            # an earlier run's files of this point
            if stale.startswith(p.name + "."):
                os.remove(os.path.join(points_dir, stale))
    for (level, ranks), group in groups.items():
        group = sorted(group, key=lambda p: (p.total_atoms, p.series, p.structure))
        while group:
            left = deadline - time.time()
            if left < 5:
                break
            plan_path = os.path.join(out_dir, f"plan-L{level}-r{ranks}.json")
            with open(plan_path, "w") as fh:
                json.dump({"points": [p.to_dict() for p in group], "points_dir": points_dir, "steps": steps,
                           "warmup": warmup, "device": device, "seed": seed, "deadline": deadline}, fh, indent=1)
            say(f"level {level}, {ranks} rank(s): {len(group)} point(s), {left:.0f} s left")
            rc, timed_out = _launch(ranks, plan_path, launch_log, left, device)
            done = [p for p in group if os.path.exists(os.path.join(points_dir, f"{p.name}.json"))]
            for p in done:
                outcome[p.name] = {**outcome.get(p.name, {}), "status": "done", "why": None}
            rest = [p for p in group if p not in done]
            if not rest:
                break
            if timed_out or time.time() >= deadline - 5:
                break
            failed = rest[0]
            outcome[failed.name] = {**outcome.get(failed.name, {}), "status": "failed",
                                    "why": f"exit {rc}:\n{_tail(launch_log)}"}
            say(f"{failed.name} failed (exit {rc}); going on with the rest")
            group = rest[1:]
    for p in points:
        outcome.setdefault(p.name, {"status": "not run", "why": "budget"})
        if outcome[p.name]["status"] == "not run":
            outcome[p.name]["why"] = "budget"
    return outcome


# ------------------------------------------------------------------ the force check

# Step-0 forces of two rank counts differ by float32 rounding: each rank centres its positions
# on its own atoms before rounding them to float32 and sums in another order.  The rounding of a
# position grows with the distance from that centre, up to the box, hence the box term.
FLOAT32_EPS = float(np.finfo(np.float32).eps)
FORCE_RTOL_BASE = 2e-5


ENERGY_RTOL = 1e-6            # |E_R - E_base| / |E_base|: eight float32 ulps (the sum runs in float64)


def force_tolerance(box_length: float, cutoff: float) -> float:
    """Largest accepted ``max |F_R - F_base| / max |F_base|``: the rank-count tests' 2e-5, plus
    16 float32 ulps per cutoff of box length (the centred positions' rounding).  Measured on a
    CPU at level 0: 5e-6 (11 Å box), 9e-6 (29 Å), 1.3e-5 (57 Å)."""
    return FORCE_RTOL_BASE + 16 * FLOAT32_EPS * box_length / cutoff


def compare_single_points(base: dict, other: dict) -> dict:
    """Energy and force deviation of ``other`` from ``base`` (arrays from ``write_single_point``)."""
    fb, fo = np.asarray(base["forces"], dtype=np.float64), np.asarray(other["forces"], dtype=np.float64)
    if fb.shape != fo.shape:
        raise ValueError(f"force arrays differ in shape: {fb.shape} against {fo.shape}")
    eb, eo = float(base["energy"]), float(other["energy"])
    n = fb.shape[0]
    scale = float(np.abs(fb).max()) or 1.0
    return {"atoms": n, "energy": eo, "energy_base": eb, "energy_diff_per_atom": abs(eo - eb) / n,
            "energy_rel": abs(eo - eb) / max(abs(eb), 1e-30),
            "force_max_abs_diff": float(np.abs(fo - fb).max()), "force_rel": float(np.abs(fo - fb).max()) / scale,
            "force_max": scale}


def check_points(points_dir: str, records: list[dict], *, keep_forces: bool = False) -> list[dict]:
    """For every strong system: each rank count's step-0 energy and forces against the fewest
    ranks that wrote them.  The force files are removed afterwards unless ``keep_forces``."""
    by_system: dict[tuple, list[dict]] = {}
    for r in records:
        p = r["scaling_point"]
        if p["series"] != "strong":
            continue
        path = os.path.join(points_dir, f"{p['name']}.forces.npz")
        if os.path.exists(path):
            by_system.setdefault(Point(**{k: p[k] for k in ("series", "structure", "atoms", "model", "level",
                                                             "ranks")}).system, []).append(r)
    checks = []
    for system, recs in by_system.items():
        recs = sorted(recs, key=lambda r: r["ranks"])
        base = recs[0]
        with np.load(os.path.join(points_dir, f"{base['scaling_point']['name']}.forces.npz")) as data:
            ref = {"energy": data["energy"], "forces": data["forces"]}
        cutoff = float(base["model"]["cutoff"])
        box = float(max(base.get("cell_lengths") or [0.0]))
        tol = force_tolerance(box, cutoff)
        for r in recs[1:]:
            with np.load(os.path.join(points_dir, f"{r['scaling_point']['name']}.forces.npz")) as data:
                got = compare_single_points(ref, {"energy": data["energy"], "forces": data["forces"]})
            checks.append({"series": system[0], "structure": system[1], "atoms": r["atoms"], "model": system[3],
                           "level": system[4], "ranks": r["ranks"], "base_ranks": base["ranks"], **got,
                           "force_tolerance": tol, "energy_tolerance": ENERGY_RTOL,
                           "ok": got["force_rel"] <= tol and got["energy_rel"] <= ENERGY_RTOL})
    if not keep_forces:
        for r in records:
            path = os.path.join(points_dir, f"{r['scaling_point']['name']}.forces.npz")
            if os.path.exists(path):
                os.remove(path)
    return checks


# ------------------------------------------------------------------ the command

def load_records(points_dir: str) -> list[dict]:
    """The point records in ``points_dir``, each with every rank's model-call statistics (from
    the ranks' own files where mpi4py did not gather them)."""
    out = []
    for name in sorted(os.listdir(points_dir)) if os.path.isdir(points_dir) else []:
        if name.endswith(".json") and not name.startswith(".") and ".rank" not in name:
            with open(os.path.join(points_dir, name)) as fh:
                doc = json.load(fh)
            if "scaling_point" not in doc:
                continue
            calls = doc.get("model_calls") or []
            if len(calls) < doc["ranks"]:
                own = []
                for k in range(doc["ranks"]):
                    path = os.path.join(points_dir, f"{doc['scaling_point']['name']}.rank{k}.json")
                    if os.path.exists(path):
                        with open(path) as fh:
                            own.append(json.load(fh))
                if len(own) > len(calls):
                    doc["model_calls"] = own
            out.append(doc)
    return out


def report(out_dir: str, *, with_plot: bool = True) -> dict:
    """The report of ``out_dir``'s finished points again (its plan, when there, for the outcome
    of the rest); the paths written.  The force files are kept."""
    points_dir = os.path.join(out_dir, POINTS_DIR)
    if not os.path.isdir(points_dir):
        raise ValueError(f"{out_dir}: no {POINTS_DIR}/ folder of point records there")
    from .scaling_report import write_report
    records = load_records(points_dir)
    plan = {}
    if os.path.exists(os.path.join(out_dir, PLAN_NAME)):
        with open(os.path.join(out_dir, PLAN_NAME)) as fh:
            plan = json.load(fh)
    checks = check_points(points_dir, records, keep_forces=True)
    return write_report(out_dir, records, checks, plan, with_plot=with_plot)


def measure(points: list[Point], out_dir: str, *, device: str, steps: int, warmup: int, budget: float,
            memory_limit: float | None, seed: int = 0, keep_forces: bool = False, with_plot: bool = True,
            command: str = "", progress=None) -> tuple[dict, bool]:
    """Run ``points`` (``run_plan``), write the plan with every point's outcome, check the forces
    and write the report: ``(the report's paths, whether everything ran and agreed)``."""
    from .scaling_report import write_report
    outcome = run_plan(points, out_dir, device=device, steps=steps, warmup=warmup, budget=budget,
                       memory_limit=memory_limit, seed=seed, progress=progress)
    plan = {"points": [p.to_dict() for p in points], "outcome": outcome, "steps": steps, "warmup": warmup,
            "device": device, "gpus": _gpu_count(device), "command": command}
    with open(os.path.join(out_dir, PLAN_NAME), "w") as fh:
        json.dump(plan, fh, indent=1)
    points_dir = os.path.join(out_dir, POINTS_DIR)
    records = load_records(points_dir)
    checks = check_points(points_dir, records, keep_forces=keep_forces)
    paths = write_report(out_dir, records, checks, plan, with_plot=with_plot)
    ok = all(c["ok"] for c in checks) and not any(o["status"] == "failed" for o in outcome.values())
    return paths, ok
