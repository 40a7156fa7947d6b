"""``mixstack bench model``: frame time of a whole potential (energy + forces) at each level.

Cells: diamond (``bulk("C", "diamond", cubic=True)``) and bcc Cu
(``bulk("Cu", "bcc", a=2.87, cubic=True)``), repeated to about 500, 2000 and
4400 atoms and rattled by 0.05 Å (a fixed seed) so that forces are not zero
by symmetry.  The model is an ``SO2Potential`` (default: the S1 stack key,
``lmax 3, focus_dim 32, n_focus 2, n_layers 4``, two blocks, cutoff 5 Å) in
float32, TF32 off, its parameters without gradients.  A frame is ``E`` and
``F = -dE/dx`` by autograd; the neighbour list is built once per cell, outside
the timing.

Variants: ``L0-compile`` — level 0 under ``torch.compile`` — is the
pure-PyTorch baseline; ``L1-compile``, ``L2-compile`` and ``L3-compile`` (the default) put
the whole energy function under ``torch.compile`` at that level, the custom
operators inside the graph; ``L0-eager``, ``L1``, ``L2``, ``L3`` (on request,
``--levels 0,1,2``) run the model eagerly at that level (the stack's Triton
kernels are compiled already; the rest of the model is eager); ``L1-graph``, ``L2-graph`` and
``L3-graph`` (``--levels 2g,3g``, CUDA only) replay the eager frame of that level from a CUDA
graph (``potential.graphs.GraphedFrames``), as ``MixstackCalculator`` runs it by default on a GPU:
their peak memory is the capture's (what the graph's pool keeps), after an untimed eager
first call on the capture stream, as every variant's peak follows an untimed first call (one-time
costs such as cuBLAS's workspace per stream stay outside every variant's peak).  Each compiled variant
compiles its own copy of the energy function (its own code object, hence its
own compile cache), so variants interleaved in the timing loop never hit
each other's graphs — the level is read while tracing and is not a guard.  For each cell the record
holds, per variant, the frame time (``timing.time_interleaved``, variants
interleaved in rotating order), the peak device memory of one frame, the
``dispatch_log`` paths, and the deviation of energy (eV/atom) and forces
(max and relative) from the baseline — next to the baseline's own band: its
deviation from a second run of itself and from ``L0-eager`` (another
reduction order of the same float32 math).  A deviation inside that band is
float32 rounding.

Each cell also records the neighbour list's host time (a fresh list, and the per-step cut of
a kept Verlet list, ``potential.verlet``).  ``breakdown=True`` (``--breakdown``) adds, per
variant, where the frame's time goes, stage by stage, forward and backward
(``bench.breakdown``); ``md_steps > 0`` (``--md-steps``) runs NVE molecular dynamics through
the ASE calculator, per variant, at the sizes in ``md_atoms`` (``bench.md``): steps/s, ns/day
at 1 fs, µs per atom per step and the energy drift.  ``MIXSTACK_CONV_KERNELS=0`` turns the
convolution's kernels off (levels 1-3 then run the stack's kernels inside the PyTorch
convolution): the "before" of the rotate-in / rotate-out kernels.

Library code: nothing here prints; progress goes to ``on_step``.
"""

from __future__ import annotations

import copy
import gc
import itertools
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..dispatch.levels import use_level
from ..dispatch.log import dispatch_log
from ..measure import env
from ..measure.report import fmt as _fmt
from ..measure.report import header_lines, markdown_table, not_run_section, require_extra, save_figure
from ..measure.timing import Clock, Task, time_interleaved
from ..potential.cells import CELLS, DEFAULT_MODEL, QUICK_CPU_MODEL, build_cell
from ..potential.graphs import GraphedFrames, run_on_capture_stream
from . import breakdown as breakdown_mod
from . import stack_bench
from .breakdown import own_copy
from .stack_bench import _peak_above

log = logging.getLogger(__name__)

SCHEMA = "mixstack-bench-model/1"
VARIANTS = {**{k: v for k, v in stack_bench.VARIANTS.items() if k not in stack_bench.FORCED_BLAS},
            "1c": "L1-compile", "2c": "L2-compile", "3c": "L3-compile", "1g": "L1-graph", "2g": "L2-graph", "3g": "L3-graph"}
LEVEL_OF = {**stack_bench.LEVEL_OF, "1c": 1, "2c": 2, "3c": 3, "1g": 1, "2g": 2, "3g": 3}
SIZES = (500, 2000, 4400)
JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench_model.json", "bench_model.md", "bench_model.png"


@dataclass(frozen=True)
class ModelBenchConfig:
    """What ``run_model_bench`` runs.  ``variants``: keys of ``VARIANTS``."""

    cells: tuple[str, ...] = CELLS
    atoms: tuple[int, ...] = SIZES
    # Levels 1-3 under torch.compile, like the baseline: the eager rest of the model made them
    # slower than L0-compile (BENCHMARKS.md, "Compiled frames").
    variants: tuple[str, ...] = ("0c", "0", "1c", "2c", "3c")
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))
    rounds: int = 10
    warmup: int = 2
    device: str | None = None
    seed: int = 0
    float64_reference: bool = True
    breakdown: bool = False
    breakdown_rounds: int = 3
    md_steps: int = 0
    md_atoms: tuple[int, ...] = (4400,)
    md_skin: float = 1.0
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["variants"] = [VARIANTS[v] for v in self.variants]
        return d


def default_config(device=None, *, quick: bool = False) -> ModelBenchConfig:
    """Every cell, size and level on a GPU; on a CPU one ~64-atom cell per lattice,
    level 0 eager only (a smoke run), saying what it leaves out."""
    device = env.resolve_device(device)
    if device.type == "cuda":
        return ModelBenchConfig(atoms=(500,) if quick else SIZES, rounds=3 if quick else 10,
                                warmup=1 if quick else 2, device=str(device), md_steps=0 if quick else 100)
    notes = ["CPU: ~64-atom cells and a small model; the standard sizes need a CUDA device"]
    base = ("0",) if quick else ("0c", "0")
    if quick:
        notes.append("L0-compile is left out of --quick on the CPU (its compile time); "
                     "ask for it with --levels 0c,0")
    triton = ("1", "2", "3")
    if skip_reason(triton[0], device) is None:          # the interpreter: far too slow by default
        notes.append("L1-L3 are left out on the CPU by default (the Triton interpreter is slow); "
                     "ask for them with --levels 0,1")
        triton = ()
    return ModelBenchConfig(atoms=(64,), variants=base + triton, model=dict(QUICK_CPU_MODEL),
                            rounds=2 if quick else 5, warmup=1, device=str(device), notes=tuple(notes))


def parse_variants(text: str) -> tuple[str, ...]:
    """``"0c,0,1,2c"`` (or names like ``"L1-compile"``) -> variant keys."""
    by_name = {name.lower(): key for key, name in VARIANTS.items()}
    keys = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key = item.lower()
        key = key[1:] if key.startswith("l") and key[1:] in VARIANTS else by_name.get(key, key)
        if key not in VARIANTS:
            raise ValueError(f"unknown level/variant {item!r}; use {', '.join(VARIANTS)} "
                             f"or {', '.join(VARIANTS.values())}")
        keys.append(key)
    if not keys:
        raise ValueError("no levels given")
    return tuple(dict.fromkeys(keys))


def skip_reason(key: str, device) -> str | None:
    """Why variant ``key`` cannot run on ``device``, or ``None`` when it can."""
    if key.endswith("g") and torch.device(device).type != "cuda":
        return "CUDA graphs need a CUDA device"
    return stack_bench.skip_reason("1" if LEVEL_OF[key] > 0 else "0", device)


def frame_fn(key: str, model) -> Callable:
    """``frame(inputs) -> (energy, forces)`` of variant ``key``."""
    energy = model.energy
    if key.endswith("c"):
        def energy_of(*args):
            return model.energy(*args)
        energy = torch.compile(own_copy(energy_of, key), dynamic=False)
    level = LEVEL_OF[key]

    def frame(*inp):
        with use_level(level), torch.enable_grad():
            pos = inp[0].detach().requires_grad_(True)
            e, _ = energy(pos, *inp[1:])
            (g,) = torch.autograd.grad(e, pos)
        return e.detach(), -g

    if key.endswith("g"):
        graphed = GraphedFrames(frame)

        def replayed(inp):
            with use_level(level):
                return graphed(*inp)

        # what an eager variant's untimed first call does, on the stream the graph is warmed up
        # and captured on (its cuBLAS workspace is made here, as the default stream's is by the
        # eager variants' first calls)
        replayed.first_call = lambda inp: run_on_capture_stream(frame, *inp)
        return replayed
    return lambda inp: frame(*inp)


def _deviation(got, ref, n_atoms: int) -> dict:
    (e, f), (e0, f0) = got, ref
    df = (f.double() - f0.double())
    den = torch.linalg.vector_norm(f0.double()).item()
    return {"energy_per_atom": abs(e.double().item() - e0.double().item()) / n_atoms,
            "force_max": df.abs().max().item() if df.numel() else 0.0,
            "force_rel": torch.linalg.vector_norm(df).item() / den if den > 0 else 0.0}


def _band(devs: list[dict]) -> dict | None:
    return {k: max(d[k] for d in devs) for k in devs[0]} if devs else None


def _float64_frame(model64, atoms, device):
    """Energy and forces of the float64 copy of the model at level 0, eagerly: the truth
    every variant (the baseline too) is also measured against."""
    from ..potential.neighbors import atoms_inputs
    inp = atoms_inputs(atoms, model64.cutoff, device=device, dtype=torch.float64)
    return frame_fn("0", model64)(inp)


def _run_cell(cfg, model, name, target, keys, device, clock, step, model64=None) -> dict:
    """Measure every variant of ``keys`` on one cell (see the module doc); the cell's record."""
    cell = _Cell(cfg, model, name, target, device, clock, step)
    ref64 = cell.reference64(model64) if model64 is not None else None
    torch.compiler.reset()                            # the previous cell's graphs
    variants = [cell.first_call(key) for key in keys]
    base = next((k for k in keys if k in cell.results), None)
    band = cell.deviations(base, keys, variants, ref64) if base is not None else []
    cell.time(variants)
    measured = [(rec, key) for rec, key in zip(variants, keys) if key in cell.frames]
    if cfg.breakdown:
        cell.breakdowns(measured)
    # each MD run starts from the memory of one frame: the timed variants' graphs (a frame's
    # memory each) and the previous run's calculator are released first
    cell.frames.clear()
    _release_memory(device)
    if cfg.md_steps and target in cfg.md_atoms:
        cell.md_runs(measured)
    return {"cell": name, "label": cell.label, "atoms": cell.n, "edges": int(cell.inp.edge_index.shape[1]),
            "neighbour_list": neighbour_list_times(cell.atoms, model.cutoff, device, skin=cfg.md_skin),
            "baseline": VARIANTS[base] if base else None, "band": _band(band), "variants": variants}


class _Cell:
    """One cell of ``_run_cell``: its atoms and float32 inputs, and per variant that ran its
    frame function (``frames``) and the result of its measured call (``results``)."""

    def __init__(self, cfg: ModelBenchConfig, model, name: str, target: int, device, clock, step):
        from ..potential.neighbors import atoms_inputs
        self.cfg, self.model, self.device, self.clock, self.step = cfg, model, device, clock, step
        self.atoms = build_cell(name, target, seed=cfg.seed)
        self.inp = atoms_inputs(self.atoms, model.cutoff, device=device, dtype=torch.float32)
        self.n, self.label = len(self.atoms), f"{name}-{len(self.atoms)}"
        self.frames: dict = {}
        self.results: dict = {}

    def reference64(self, model64):
        """The float64 model's frame, or ``None`` where it fails (the variants still run)."""
        self.step(f"{self.label}: float64 reference")
        try:
            return _float64_frame(model64, self.atoms, self.device)
        except Exception as exc:
            log.warning("the float64 reference on %s failed: %s: %s", self.label, type(exc).__name__, exc)
            return None

    def first_call(self, key: str) -> dict:
        """Variant ``key``'s untimed first call (compile, warm-up), then one call for its peak
        memory, dispatch paths and result; its record (``failed`` where it raised)."""
        self.step(f"{self.label}: warming up {VARIANTS[key]}")
        rec = {"variant": VARIANTS[key], "level": LEVEL_OF[key], "failed": None, "dispatch": {}}
        inp, device = self.inp, self.device
        try:
            fn = frame_fn(key, self.model)
            if key.endswith("g"):
                # after a first call like every variant's, the capture (two eager warm-ups, then
                # the recorded frame): its peak is what the graph's memory pool keeps; a replay
                # runs no host code, so it logs no paths
                fn.first_call(inp)
                with dispatch_log() as paths:
                    _, peak = _peak_above(device, lambda f=fn: f(inp))
                rec["dispatch_note"] = "paths of the capture: two warm-up frames and the recorded one"
                self.results[key] = fn(inp)
            else:
                fn(inp)                                          # compile / first call
                with dispatch_log() as paths:
                    self.results[key], peak = _peak_above(device, lambda f=fn: f(inp))
            # compiled frames log nothing: paths are decided (and not logged) while tracing
            rec.update(dispatch=dict(sorted(paths.items())),
                       peak_mib=None if peak is None else peak / 2 ** 20)
            self.frames[key] = fn
        except Exception as exc:                             # recorded; the rest still runs
            log.warning("%s on %s failed: %s: %s", VARIANTS[key], self.label, type(exc).__name__, exc)
            rec["failed"] = f"{type(exc).__name__}: {exc}"
        return rec

    def deviations(self, base: str, keys, variants: list[dict], ref64) -> list[dict]:
        """Each variant's deviation from the baseline ``base`` (and from the float64 frame); returns
        the baseline's own band: a second run of itself, and level 0 eager (another reduction order)."""
        results, n = self.results, self.n
        band = [_deviation(self.frames[base](self.inp), results[base], n)]
        if base == "0c" and "0" in results:
            band.append(_deviation(results["0"], results[base], n))
        for rec, key in zip(variants, keys):
            if key in results:
                rec["deviation"] = _deviation(results[key], results[base], n)
                if ref64 is not None:
                    rec["deviation_f64"] = _deviation(results[key], ref64, n)
        return band

    def time(self, variants: list[dict]) -> None:
        """Time the frames that ran, interleaved; each record gets its timing (``None``: not timed)."""
        timing = {}
        if self.frames:
            tasks = {VARIANTS[k]: Task(run=lambda f=f: f(self.inp)) for k, f in self.frames.items()}
            samples = time_interleaved(tasks, rounds=self.cfg.rounds, warmup=self.cfg.warmup, clock=self.clock,
                                       on_sample=lambda v, timed: self.step(f"{self.label}: {v}"))
            timing = {v: s.to_dict() for v, s in samples.items()}
        for rec in variants:
            rec["timing"] = timing.get(rec["variant"])

    def breakdowns(self, measured: list) -> None:
        """Where each measured variant's frame time goes, stage by stage (not for graph replays)."""
        for rec, key in measured:
            if key.endswith("g"):
                rec["breakdown"] = {"failed": "not measured: a graph replay shows no stages (see the eager level)"}
                continue
            self.step(f"{self.label}: breakdown of {VARIANTS[key]}")
            rec["breakdown"] = _guarded(f"the breakdown of {VARIANTS[key]} on {self.label}", breakdown_mod.measure,
                                        self.model, self.inp, key, LEVEL_OF[key], self.device, self.clock,
                                        rounds=self.cfg.breakdown_rounds, stage_order=_stage_order())

    def md_runs(self, measured: list) -> None:
        """NVE molecular dynamics through the ASE calculator with each measured variant's level."""
        from .md_bench import run_md
        for rec, key in measured:
            self.step(f"{self.label}: MD with {VARIANTS[key]}")
            rec["md"] = _guarded(f"MD with {VARIANTS[key]} on {self.label}", run_md, self.model, self.atoms,
                                 LEVEL_OF[key], compiled=key.endswith("c"), cuda_graphs=key.endswith("g"),
                                 steps=self.cfg.md_steps, seed=self.cfg.seed, skin=self.cfg.md_skin,
                                 device=self.device)
            _release_memory(self.device)


def _release_memory(device) -> None:
    """Free what released frames and calculators held (collected first: an ASE calculator and
    its atoms can form a cycle), so that the next measurement starts from the same memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _stage_order():
    from ..potential import stages
    return stages.STAGES


def _guarded(what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or ``{"failed": why}``: one part failing leaves the others' results."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        return {"failed": f"{type(exc).__name__}: {exc}"}


def neighbour_list_times(atoms, cutoff: float, device, *, skin: float = 1.0, repeats: int = 3) -> dict:
    """Host wall time (ms, median of ``repeats``) of a fresh neighbour list on ``device``
    (``atoms_inputs``) and of one call of a kept Verlet list (``VerletList``: the cut to the
    cutoff and the slots, what an MD step without a rebuild pays); list sizes beside them."""
    import statistics
    import time

    from ..potential.neighbors import atoms_inputs
    from ..potential.verlet import VerletList

    def timed(fn):
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    vl = VerletList(cutoff, skin, device=device)
    args = (atoms.get_positions(), atoms.get_cell().array, atoms.get_pbc(), atoms.get_atomic_numbers())
    vl(*args)
    return {"fresh_ms": timed(lambda: atoms_inputs(atoms, cutoff, device=device)),
            "kept_list_cut_ms": timed(lambda: vl(*args)), "skin": skin,
            "pairs_within_cutoff_plus_skin": int(vl._pairs[0].shape[1])}


def plan(cfg: ModelBenchConfig) -> tuple[list[str], list[dict]]:
    """The variants that run on the config's device, and the skipped ones with why."""
    return stack_bench.plan(cfg, variants=VARIANTS, skip=skip_reason)


def run_model_bench(cfg: ModelBenchConfig, *, on_step: Callable[[str], None] | None = None,
                    clock: Clock | None = None, command: str | None = None,
                    on_cell: Callable[[dict], None] | None = None) -> dict:
    """Run ``cfg``; return the JSON-serialisable record (see ``markdown``).  ``on_cell`` gets the
    record after every finished cell (the CLI writes it, so a run cut off keeps its cells)."""
    from ..potential import SO2Potential
    device, clock, step = stack_bench.start(cfg, on_step=on_step, clock=clock)
    keys, skipped = plan(cfg)
    # A frame never needs the parameters' gradients; with parameters that require
    # grad, torch.compile's backward computes all of them (AOTAutograd cannot know
    # that autograd.grad asks for the positions only), in every compiled variant.
    model = SO2Potential(**cfg.model, seed=cfg.seed, device=device).eval().requires_grad_(False)
    model64 = copy.deepcopy(model).double() if cfg.float64_reference else None
    record = {**stack_bench.record_head(SCHEMA, command, cfg, device, skipped), "cells": []}
    with stack_bench.measuring(device):
        for name, target in itertools.product(cfg.cells, cfg.atoms):
            record["cells"].append(_run_cell(cfg, model, name, target, keys, device, clock, step, model64))
            _release_memory(device)
            if on_cell is not None:
                on_cell(record)
    return record


# ------------------------------------------------------------------ reports

def summary_rows(record: dict) -> list[dict]:
    """One row per (cell, variant): time, memory, deviation from the baseline, band."""
    rows = []
    for cell in record["cells"]:
        band = cell["band"] or {}
        for v in cell["variants"]:
            t, d = v.get("timing"), v.get("deviation") or {}
            rows.append({
                "cell": cell["label"], "edges": cell["edges"], "variant": v["variant"],
                "frame ms": "—" if t is None else f"{t['median_ms']:.4g} [{t['p20_ms']:.4g}–{t['p80_ms']:.4g}]",
                "peak MiB": _fmt(v.get("peak_mib"), ".0f"),
                "dE eV/atom": _fmt(d.get("energy_per_atom")), "dF max eV/Å": _fmt(d.get("force_max")),
                "dF rel": _fmt(d.get("force_rel")),
                "dF rel vs f64": _fmt((v.get("deviation_f64") or {}).get("force_rel")),
                "band dE / dF max": f"{_fmt(band.get('energy_per_atom'))} / {_fmt(band.get('force_max'))}",
                "paths": ", ".join(f"{k}×{n}" for k, n in v["dispatch"].items()) or "—",
                "note": v["failed"] or ("baseline" if v["variant"] == cell["baseline"] else ""),
            })
    return rows


def long_rows(record: dict) -> list[dict]:
    """One CSV row per measurement of a ``bench model`` record (see ``report.long_rows``)."""
    from ..measure.report import env_columns, quality_rows, timing_rows
    head = env_columns(record)
    rows = []
    for cell in record["cells"]:
        nl = cell.get("neighbour_list") or {}
        for metric in ("fresh_ms", "kept_list_cut_ms"):
            if metric in nl:
                rows.append({**head, "bench": "model", "case": cell["label"], "variant": "", "part": "neighbour list",
                             "metric": f"neighbour_list_{metric[:-3]}_time", "value": nl[metric], "unit": "ms"})
        for v in cell["variants"]:
            base = {**head, "bench": "model", "case": cell["label"], "variant": v["variant"], "part": ""}
            b = v.get("breakdown") or {}
            for stage, times in b.get("stages", {}).items():
                for pass_ in breakdown_mod.PASSES:
                    rows.append({**base, "part": stage, "metric": f"stage_{pass_}_time",
                                 "value": times[f"{pass_}_ms"], "unit": "ms"})
            for name in ("busy_ms", "unattributed_ms", "idle_ms", "profiled_frame_ms", "staged_frame_ms"):
                if name in b:
                    rows.append({**base, "part": "breakdown", "metric": name[:-3], "value": b[name], "unit": "ms"})
            md = v.get("md") or {}
            for name, unit in MD_COLUMNS:
                if md.get(name) is not None:
                    rows.append({**base, "part": "md", "metric": name, "value": md[name], "unit": unit})
            rows += timing_rows(base, v.get("timing"), "frame_time") + quality_rows(base, {"peak_mib": v.get("peak_mib")})
            for kind, devs in (("baseline", v.get("deviation")), ("f64", v.get("deviation_f64"))):
                for name, value in (devs or {}).items():
                    if value is not None:
                        rows.append({**base, "metric": f"deviation_{kind}_{name}", "value": value,
                                     "unit": "eV/atom" if name == "energy_per_atom" else
                                     ("eV/Å" if name == "force_max" else "1")})
    return rows


MD_COLUMNS = (("steps_per_s", "1/s"), ("ns_per_day", "ns/day"), ("us_per_atom_step", "µs"),
              ("drift_mev_atom_ps", "meV/atom/ps"), ("max_excursion_mev_atom", "meV/atom"),
              ("neighbour_rebuilds", "1"), ("graph_captures", "1"), ("steps", "1"), ("wall_s", "s"))


def md_rows(record: dict) -> list[dict]:
    """One row per (cell, variant) that ran MD."""
    rows = []
    for cell in record["cells"]:
        for v in cell["variants"]:
            md = v.get("md")
            if not md:
                continue
            if "failed" in md:
                rows.append({"cell": cell["label"], "variant": v["variant"], "steps/s": "—", "ns/day (1 fs)": "—",
                             "µs/atom/step": "—", "drift meV/atom/ps": "—", "max |ΔE| meV/atom": "—",
                             "rebuilds": "—", "graph captures": "—", "note": md["failed"]})
                continue
            rows.append({"cell": cell["label"], "variant": v["variant"], "steps/s": f"{md['steps_per_s']:.3g}",
                         "ns/day (1 fs)": f"{md['ns_per_day']:.3g}", "µs/atom/step": f"{md['us_per_atom_step']:.3g}",
                         "drift meV/atom/ps": f"{md['drift_mev_atom_ps']:.2g}",
                         "max |ΔE| meV/atom": f"{md['max_excursion_mev_atom']:.2g}",
                         "rebuilds": str(md["neighbour_rebuilds"]),
                         "graph captures": "—" if md.get("graph_captures") is None else str(md["graph_captures"]),
                         "note": f"{md['steps']} steps of {md['dt_fs']:g} fs after {md['warmup_steps']}, "
                                 f"{md['temperature_K']:g} K start, skin {md['skin']:g} Å"})
    return rows


def markdown(record: dict) -> str:
    m = record["config"]["model"]
    parts = ["# mixstack bench model\n", "\n".join(f"- {x}" for x in header_lines(record)) + "\n",
             f"Model: SO2Potential {', '.join(f'{k}={v}' for k, v in m.items())}, float32. A frame is the "
             "energy and forces (autograd); times are median [p20–p80] ms over interleaved rounds. "
             "Deviations are from the baseline (L0-compile when it runs); the band is the baseline's "
             "deviation from a second run of itself and from L0-eager. \"vs f64\": the relative force "
             "deviation from a float64 copy of the model at level 0 (eager), the truth all variants "
             "share.\n",
             markdown_table(summary_rows(record))]
    nl = [(c["label"], c.get("neighbour_list") or {}) for c in record["cells"]]
    if any(x for _, x in nl):
        parts.append("\n## Neighbour list (host, outside the frame)\n\nA fresh list (vesin or ASE, sorted, "
                     "slots, copied to the device) and one call of a kept Verlet list (the cut to the cutoff "
                     "and the slots: an MD step without a rebuild), median ms.\n")
        parts.append(markdown_table([{"cell": label, "fresh list ms": _fmt(x.get("fresh_ms"), ".3g"),
                                      "kept list, per step ms": _fmt(x.get("kept_list_cut_ms"), ".3g"),
                                      "pairs within cutoff + skin": str(x.get("pairs_within_cutoff_plus_skin", "—"))}
                                     for label, x in nl if x]))
    for cell in record["cells"]:
        bds = {v["variant"]: v["breakdown"] for v in cell["variants"]
               if v.get("breakdown") and "failed" not in v["breakdown"]}
        if bds:
            frame_ms = {v["variant"]: (v.get("timing") or {}).get("median_ms") for v in cell["variants"]}
            parts.append(f"\n## Where the time goes: {cell['label']}\n\nDevice time per frame, ms, by stage "
                         "(`mixstack.bench.breakdown`): forward time in the stage's range, backward time "
                         "charged to the stage whose forward made the autograd node. Compiled variants "
                         "compile each stage on its own for this (the staged frame); \"frame as timed\" is "
                         "the whole-frame variant above.\n")
            parts.append(markdown_table(breakdown_mod.stage_rows(bds, frame_ms)))
        failed = [f"{v['variant']}: {v['breakdown']['failed']}" for v in cell["variants"]
                  if v.get("breakdown") and "failed" in v["breakdown"]]
        if failed:
            parts.append(f"\nBreakdown failed on {cell['label']}: " + "; ".join(failed) + "\n")
    mdr = md_rows(record)
    if mdr:
        parts.append("\n## Molecular dynamics (NVE, ASE velocity Verlet, MixstackCalculator)\n\nWall time of "
                     "whole steps (neighbour list upkeep, copies, the frame, the integrator); drift: the "
                     "least-squares slope of the total energy per atom over the timed steps; graph captures: "
                     "the frames a graphed run captured, its warm-up steps included.\n")
        parts.append(markdown_table(mdr))
    parts.append(not_run_section(record))
    return "\n".join(parts)


def plot(record: dict, path) -> Path:
    """Frame time per variant against atom count, one panel per lattice."""
    matplotlib = require_extra("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lattices = list(dict.fromkeys(c["cell"] for c in record["cells"]))
    fig, axes = plt.subplots(1, len(lattices), figsize=(6 * len(lattices), 4.2), squeeze=False)
    for ax, lat in zip(axes.flat, lattices):
        cells = [c for c in record["cells"] if c["cell"] == lat]
        for name in record["config"]["variants"]:
            pts = [(c["atoms"], v["timing"]["median_ms"]) for c in cells for v in c["variants"]
                   if v["variant"] == name and v.get("timing")]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xlabel("atoms")
        ax.set_ylabel("ms per frame (energy + forces)")
        ax.set_title(lat, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return save_figure(fig, plt, record, "mixstack bench model", path)


def write(record: dict, out_dir, *, with_plot: bool = True) -> dict[str, Path]:
    """``bench_model.json``, ``.md``, ``.csv`` and (optionally) ``bench_model.png`` in ``out_dir``."""
    from ..measure import report
    return report.write(record, out_dir, with_plot=with_plot,
                        names=(JSON_NAME, MARKDOWN_NAME, PLOT_NAME), render_markdown=markdown,
                        render_plot=plot, render_rows=long_rows)
