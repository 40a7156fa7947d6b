"""``mixstack bench train``: one optimizer step of force-matching training, at each level.

Two workloads (docs/contract.md §8):

- **the stack** at S1-S4 (the CPU sizes C1, C4 off a GPU): ``out = stack(u0, alpha, w0, w1, gw)``;
  the "forces" ``grad_u0 = d<grad_out, out>/du0`` with ``create_graph``; the loss
  ``mean((grad_u0 - target)^2)``; its backward to ``u0``, ``alpha`` and the three weights; an SGD
  step of the weights.  So a step is the forward, the first backward (kept differentiable), the
  double backward and the weight reductions;
- **the potential**: an ``SO2Potential`` (default: the S1 stack key, two blocks) in train mode on a
  rattled cell of about 500 and 2000 atoms: energy and forces (``create_graph``), the loss
  ``(E - E_ref)^2 / N^2 + mean((F - F_ref)^2)``, its backward to every parameter, an SGD step.

Variants: ``L0-eager`` (level 0), ``L0-compile`` (``torch.compile`` of the level-0 forward; PyTorch
cannot differentiate a compiled graph twice, and the record says so where that is the case),
``L1``, ``L2``, ``L3``.  Each variant steps its own copy of the weights (a step changes them), so
interleaved variants never see each other's updates.

For each case and variant the record holds: the step time (``timing.time_interleaved``: CUDA
events, variants interleaved in rotating order, medians), the peak device memory of one step
above what was allocated before it, the ``dispatch_log`` paths of one step, and the relative
error of every gradient against a float64 evaluation (level 0, autograd, float64 copies of the
same inputs and weights; measured on the variant's first step, before any weight moved).  TF32
is off throughout (``stack_bench.exact_fp32``).

Library code: nothing here prints; progress goes to ``on_step``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..dispatch.levels import use_level
from ..dispatch.log import dispatch_log
from ..measure import env
from ..measure.report import fmt as _fmt
from ..measure.report import header_lines, markdown_table, not_run_section, require_extra, save_figure
from ..measure.shapes import SMALL, STANDARD, BenchShape, make_inputs
from ..measure.timing import Clock, Task, time_interleaved
from ..potential.cells import DEFAULT_MODEL
from ..stack import reference
from ..stack.functional import mixing_stack
from . import stack_bench
from .stack_bench import _peak_above, _rel_err

log = logging.getLogger(__name__)

SCHEMA = "mixstack-bench-train/1"
VARIANTS = {"0": "L0-eager", "0c": "L0-compile", "1": "L1", "2": "L2", "3": "L3"}
LEVEL_OF = {"0": 0, "0c": 0, "1": 1, "2": 2, "3": 3}
ATOMS = (500, 2000)
QUICK_CPU_MODEL = dict(lmax=1, focus_dim=16, n_focus=2, n_layers=2, n_blocks=2, cutoff=2.6)
LEARNING_RATE = 1e-6          # small: the weights barely move over the timed rounds
JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "bench_train.json", "bench_train.md", "bench_train.png"
# What the targets compare (docs: BENCHMARKS.md, "Training"): a variant's step time and peak
# memory as a fraction of L0-eager's in the same case.
BASELINE = "L0-eager"


class NotCompilable(RuntimeError):
    """PyTorch cannot compile this step (e.g. a double backward through a compiled graph)."""


@dataclass(frozen=True)
class TrainBenchConfig:
    """What ``run_train_bench`` runs.  ``variants``: keys of ``VARIANTS``; ``shapes``: the stack
    workload; ``atoms``: the potential workload (one cell of ``cell`` per size)."""

    shapes: tuple[BenchShape, ...] = ()
    atoms: tuple[int, ...] = ()
    cell: str = "diamond"
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))
    variants: tuple[str, ...] = tuple(VARIANTS)
    rounds: int = 10
    warmup: int = 2
    device: str | None = None
    seed: int = 0
    float64_reference: bool = True
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shapes"] = [s.to_dict() for s in self.shapes]
        d["variants"] = [VARIANTS[v] for v in self.variants]
        return d


def default_config(device=None, *, quick: bool = False) -> TrainBenchConfig:
    """S1-S4 and the potential at ~500 and ~2000 atoms, every level, on a GPU; on a CPU the small
    shapes and a ~64-atom cell with a small model at level 0 (a smoke run), saying what it leaves out."""
    device = env.resolve_device(device)
    if device.type == "cuda":
        shapes = (STANDARD["S1"],) if quick else tuple(STANDARD.values())
        return TrainBenchConfig(shapes=shapes, atoms=(500,) if quick else ATOMS, rounds=3 if quick else 10,
                                warmup=1 if quick else 2, device=str(device))
    notes = ["CPU: the small shapes, a ~64-atom cell and a small model; the standard sizes need a CUDA device"]
    variants = ("0", "0c")
    if skip_reason("1", device) is None:                 # the interpreter: far too slow by default
        notes.append("L1-L3 are left out on the CPU by default (the Triton interpreter is slow); "
                     "ask for them with --levels 0,1")
    return TrainBenchConfig(shapes=(SMALL["C1"],) if quick else tuple(SMALL.values()), atoms=(64,),
                            model=dict(QUICK_CPU_MODEL), variants=variants, rounds=2 if quick else 5, warmup=1,
                            device=str(device), notes=tuple(notes))


def parse_variants(text: str) -> tuple[str, ...]:
    """``"0,0c,1,2,3"`` (or names like ``"L0-eager"``) -> variant keys (``stack_bench.parse_variants``,
    without the stack bench's ``2f``)."""
    keys = stack_bench.parse_variants(text)
    bad = [stack_bench.VARIANTS[k] for k in keys if k not in VARIANTS]
    if bad:
        raise ValueError(f"bench train takes the levels {', '.join(VARIANTS)} ({', '.join(VARIANTS.values())}); "
                         f"got {', '.join(bad)}")
    return keys


def skip_reason(key: str, device) -> str | None:
    """Why variant ``key`` cannot run on ``device``, or ``None`` when it can."""
    return stack_bench.skip_reason("1" if LEVEL_OF[key] > 0 else "0", device)


def plan(cfg: TrainBenchConfig) -> tuple[list[str], list[dict]]:
    """The variants that run on the config's device, and the skipped ones with why."""
    return stack_bench.plan(cfg, variants=VARIANTS, skip=skip_reason)


@contextlib.contextmanager
def _compile_refusal():
    """PyTorch refusing to differentiate a compiled step twice (AOTAutograd has no double
    backward) becomes ``NotCompilable``; every other error passes through."""
    try:
        yield
    except RuntimeError as exc:
        if "double backward" in str(exc):
            raise NotCompilable(str(exc)) from exc
        raise


def _grad_errors(got: dict, want: dict | None) -> dict:
    if want is None:
        return {}
    return {name: _rel_err(g, want[name]) for name, g in got.items() if name in want}


# ---------------------------------------------------------------- the stack

class StackStep:
    """One variant's training step on the stack: its own leaves (sharing the inputs' storage; a
    step writes only their ``.grad``) and its own copies of the weights (a step moves them).
    ``scale``: the loss is ``sum((grad_u0 - target)^2) * scale`` (the float64 reference runs the
    edges in chunks, each with the whole problem's ``1 / numel``)."""

    def __init__(self, key: str, shape: BenchShape, inp, scale: float | None = None):
        self.shape, self.level = shape, LEVEL_OF[key]
        self.u0 = inp.u0.detach().requires_grad_()
        self.alpha = inp.alpha.detach().requires_grad_(shape.apply_alpha)
        self.weights = [torch.nn.Parameter(w.detach().clone()) for w in (inp.w0, inp.w1, inp.gw)]
        self.grad_out, self.target = inp.grad_out, inp.target
        self.scale = 1.0 / inp.u0.numel() if scale is None else scale
        self.opt = torch.optim.SGD(self.weights, lr=LEARNING_RATE)
        kw = dict(lmax=shape.lmax, focus_dim=shape.focus_dim, apply_alpha=shape.apply_alpha)
        if key == "0c":
            torch.compiler.reset()
            compiled = torch.compile(reference.mixing_stack, dynamic=False, fullgraph=True)
            self.forward = lambda u0, alpha, *w: compiled(u0, alpha, *w, **kw)
        else:
            self.forward = lambda u0, alpha, *w: mixing_stack(u0, alpha, *w, **kw)

    def gradients(self) -> dict:
        """The step's gradients without the optimizer step (for the float64 comparison)."""
        self._loss_backward()
        grads = {"u0": self.u0.grad, "w0": self.weights[0].grad, "w1": self.weights[1].grad,
                 "gw": self.weights[2].grad}
        if self.shape.apply_alpha:
            grads["alpha"] = self.alpha.grad
        return {k: v.detach().clone() for k, v in grads.items()}

    def _loss_backward(self):
        for t in [self.u0, self.alpha] + self.weights:
            t.grad = None
        with use_level(self.level):
            out = self.forward(self.u0, self.alpha, *self.weights)
            with _compile_refusal():
                (forces,) = torch.autograd.grad(out, self.u0, self.grad_out, create_graph=True)
                loss = (forces - self.target).square().sum() * self.scale
                loss.backward()

    def __call__(self):
        self._loss_backward()
        self.opt.step()


@dataclass
class _StackInputs:
    u0: torch.Tensor
    alpha: torch.Tensor
    w0: torch.Tensor
    w1: torch.Tensor
    gw: torch.Tensor
    grad_out: torch.Tensor
    target: torch.Tensor


def _stack_reference64(shape: BenchShape, inp: _StackInputs, chunk: int = 2 ** 16) -> dict:
    """Every gradient of the stack's step in float64 (level 0, autograd), the edges taken in chunks
    so that memory stays bounded at S3: the stack is independent per edge and the loss a sum over
    them, so the chunks' input gradients are slices of the whole and their weight gradients add."""
    n_edges = shape.edges
    scale = 1.0 / inp.u0.numel()
    total: dict = {}
    parts: dict = {"u0": [], "alpha": []}
    for e0 in range(0, n_edges, chunk):
        sl = slice(e0, min(e0 + chunk, n_edges))
        sub = _StackInputs(inp.u0[:, sl].double(), inp.alpha[sl].double(), inp.w0.double(), inp.w1.double(),
                           inp.gw.double(), inp.grad_out[sl].double(), inp.target[:, sl].double())
        grads = StackStep("0", shape, sub, scale=scale).gradients()
        parts["u0"].append(grads.pop("u0"))
        if "alpha" in grads:
            parts["alpha"].append(grads.pop("alpha"))
        for name, g in grads.items():
            total[name] = g if name not in total else total[name] + g
    total["u0"] = torch.cat(parts["u0"], 1)
    if parts["alpha"]:
        total["alpha"] = torch.cat(parts["alpha"], 0)
    return total


def _stack_inputs(shape: BenchShape, device, seed: int) -> _StackInputs:
    inp = make_inputs(shape, device, seed=seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 7)
    target = torch.randn(inp.u0.shape, generator=gen, device=device, dtype=inp.u0.dtype)
    return _StackInputs(inp.u0, inp.alpha, inp.w0, inp.w1, inp.gw, inp.grad_out, target)


# ------------------------------------------------------------ the potential

class PotentialStep:
    """One variant's training step on an ``SO2Potential``: its own model copy and optimizer."""

    def __init__(self, key: str, model, inputs, targets):
        self.level = LEVEL_OF[key]
        self.model = copy.deepcopy(model).train()
        self.inputs, (self.energy_ref, self.forces_ref) = inputs, targets
        self.n_atoms = inputs[0].shape[0]
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        if key == "0c":
            torch.compiler.reset()
            self.model.energy = torch.compile(self.model.energy, dynamic=False)

    def gradients(self) -> dict:
        self._loss_backward()
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def _loss_backward(self):
        self.model.zero_grad(set_to_none=True)
        with use_level(self.level), _compile_refusal():
            energy, forces, _, _ = self.model(*self.inputs)
            loss = (energy - self.energy_ref).square() / self.n_atoms ** 2 + \
                (forces - self.forces_ref).square().mean()
            loss.backward()

    def __call__(self):
        self._loss_backward()
        self.opt.step()


def _potential_case(cfg, n_atoms, device, dtype=torch.float32):
    """The model, the cell's inputs and fixed targets (the model's own energy and forces, shifted)."""
    from ..potential import SO2Potential
    from ..potential.cells import build_cell
    from ..potential.neighbors import atoms_inputs
    atoms = build_cell(cfg.cell, n_atoms, seed=cfg.seed)
    model = SO2Potential(**cfg.model, seed=cfg.seed, device=device)
    inputs = atoms_inputs(atoms, model.cutoff, device=device, dtype=dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed + 11)
    energy_ref = torch.tensor(-1.0 * len(atoms), device=device, dtype=dtype)
    forces_ref = 0.1 * torch.randn(len(atoms), 3, generator=gen, device=device, dtype=dtype)
    return atoms, model, inputs, (energy_ref, forces_ref)


# ------------------------------------------------------------------ running

def _measure(keys, make_step, want, device, clock, step_cb, label, rounds, warmup) -> list[dict]:
    """Probe, check and time every variant of one case (interleaved)."""
    steps, records = {}, []
    for key in keys:
        step_cb(f"{label}: warming up {VARIANTS[key]}")
        rec = {"variant": VARIANTS[key], "level": LEVEL_OF[key], "dispatch": {}, "peak_mib": None,
               "rel_error": {}, "max_rel_error": None, "note": None, "failed": None, "timing": None}
        try:
            s = make_step(key)
            rec["rel_error"] = _grad_errors(s.gradients(), want)       # first call: compiles, checks
            if rec["rel_error"]:
                rec["max_rel_error"] = max(rec["rel_error"].values())
            with dispatch_log() as paths:
                _, peak = _peak_above(device, s)
            rec["dispatch"] = dict(sorted(paths.items()))
            rec["peak_mib"] = None if peak is None else peak / 2 ** 20
            steps[key] = s
        except NotCompilable as exc:
            rec["note"] = f"PyTorch cannot compile this step: {exc}"
        except Exception as exc:                                       # recorded; the rest still runs
            log.warning("%s on %s failed: %s: %s", VARIANTS[key], label, type(exc).__name__, exc)
            rec["failed"] = f"{type(exc).__name__}: {exc}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if key == "0c" and rec["note"] is None and not rec["failed"]:
            rec["note"] = "torch.compile of the level-0 forward (outside mixstack's dispatch)"
        elif LEVEL_OF[key] > 0 and not rec["failed"] and rec["dispatch"].get("bwd:reference"):
            rec["note"] = "a backward of the stack ran the reference formulas"
        records.append(rec)
    if steps:
        tasks = {VARIANTS[k]: Task(run=s) for k, s in steps.items()}
        samples = time_interleaved(tasks, rounds=rounds, warmup=warmup, clock=clock,
                                   on_sample=lambda v, timed: step_cb(f"{label}: {v}"))
        for rec in records:
            if rec["variant"] in samples:
                rec["timing"] = samples[rec["variant"]].to_dict()
    _ratios(records)
    return records


def _ratios(records: list[dict]) -> None:
    """Each variant's step time and peak memory as a fraction of L0-eager's."""
    base = next((r for r in records if r["variant"] == BASELINE and r["timing"]), None)
    for r in records:
        r["time_vs_l0"] = (r["timing"]["median_ms"] / base["timing"]["median_ms"]
                           if base and r["timing"] else None)
        r["peak_vs_l0"] = (r["peak_mib"] / base["peak_mib"]
                           if base and r["peak_mib"] is not None and base["peak_mib"] else None)


def _stack_case(cfg, shape, keys, device, clock, step_cb) -> dict:
    inp = _stack_inputs(shape, device, cfg.seed)
    want = None
    if cfg.float64_reference:
        step_cb(f"{shape.name}: float64 reference")
        want = _stack_reference64(shape, inp)
    records = _measure(keys, lambda k: StackStep(k, shape, inp), want, device, clock, step_cb, shape.name,
                       cfg.rounds, cfg.warmup)
    return {"workload": "stack", "case": shape.name, **shape.to_dict(), "variants": records}


def _model_case(cfg, n_atoms, keys, device, clock, step_cb) -> dict:
    atoms, model, inputs, targets = _potential_case(cfg, n_atoms, device)
    label = f"{cfg.cell}-{len(atoms)}"
    want = None
    if cfg.float64_reference:
        step_cb(f"{label}: float64 reference")
        model64 = copy.deepcopy(model).double()
        from ..potential.neighbors import atoms_inputs
        inputs64 = atoms_inputs(atoms, model.cutoff, device=device, dtype=torch.float64)
        want = PotentialStep("0", model64, inputs64, tuple(t.double() for t in targets)).gradients()
    records = _measure(keys, lambda k: PotentialStep(k, model, inputs, targets), want, device, clock, step_cb,
                       label, cfg.rounds, cfg.warmup)
    return {"workload": "potential", "case": label, "atoms": len(atoms),
            "edges": int(inputs.edge_index.shape[1]), "variants": records}


def total_steps(cfg: TrainBenchConfig) -> int:
    """How many ``on_step`` calls ``run_train_bench`` makes (for a progress bar's total)."""
    n = len(plan(cfg)[0])
    per_case = 1 + n + n * (cfg.warmup + cfg.rounds)
    return (len(cfg.shapes) + len(cfg.atoms)) * per_case


def run_train_bench(cfg: TrainBenchConfig, *, on_step: Callable[[str], None] | None = None,
                    clock: Clock | None = None, command: str | None = None) -> dict:
    """Run ``cfg``; return the JSON-serialisable record (see ``markdown``)."""
    device, clock, step_cb = stack_bench.start(cfg, on_step=on_step, clock=clock)
    keys, skipped = plan(cfg)
    record = {**stack_bench.record_head(SCHEMA, command, cfg, device, skipped), "cases": []}
    with stack_bench.measuring(device):
        for shape in cfg.shapes:
            record["cases"].append(_stack_case(cfg, shape, keys, device, clock, step_cb))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        for n_atoms in cfg.atoms:
            record["cases"].append(_model_case(cfg, n_atoms, keys, device, clock, step_cb))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return record


# ------------------------------------------------------------------ reports

def summary_rows(record: dict) -> list[dict]:
    """One row per (case, variant): step time, its ratio to L0-eager, peak memory and its ratio,
    the largest gradient error against float64, the paths."""
    rows = []
    for case in record["cases"]:
        for v in case["variants"]:
            t = v.get("timing")
            rows.append({
                "case": case["case"], "variant": v["variant"],
                "step ms": "—" if t is None else f"{t['median_ms']:.4g} [{t['p20_ms']:.4g}–{t['p80_ms']:.4g}]",
                "time / L0-eager": _fmt(v.get("time_vs_l0"), ".3f"),
                "peak MiB": _fmt(v.get("peak_mib"), ".0f"),
                "peak / L0-eager": _fmt(v.get("peak_vs_l0"), ".3f"),
                "max grad err vs f64": _fmt(v.get("max_rel_error")),
                "paths": ", ".join(f"{k}×{n}" for k, n in v["dispatch"].items()) or "—",
                "note": v["failed"] or v["note"] or "",
            })
    return rows


def error_rows(record: dict) -> list[dict]:
    """One row per (case, variant, gradient): the relative error against float64."""
    return [{"case": c["case"], "variant": v["variant"], "gradient": name, "rel. error vs f64": f"{err:.2e}"}
            for c in record["cases"] for v in c["variants"] for name, err in v["rel_error"].items()]


def long_rows(record: dict) -> list[dict]:
    """One CSV row per measurement (see ``report.long_rows``)."""
    from ..measure.report import env_columns, quality_rows, timing_rows
    head = env_columns(record)
    rows = []
    for case in record["cases"]:
        for v in case["variants"]:
            base = {**head, "bench": f"train-{case['workload']}", "case": case["case"], "variant": v["variant"]}
            rows += timing_rows(base, v.get("timing"), "step_time") + quality_rows(base, v)
    return rows


def markdown(record: dict) -> str:
    parts = ["# mixstack bench train\n", "\n".join(f"- {line}" for line in header_lines(record)) + "\n"]
    parts.append(
        "## Summary\n\nOne optimizer step of force-matching training (forward, forces with create_graph, "
        "the loss's backward to every input and weight, an SGD step). Times: median [p20–p80] in ms, "
        "variants interleaved in rotating order. Peak MiB: device memory of one step above what was "
        "allocated before it. Ratios: against L0-eager in the same case. Errors: the largest relative "
        "error of any gradient against float64 (per gradient below). paths: what `mixstack.dispatch_log` "
        "recorded for one step.\n")
    parts.append(markdown_table(summary_rows(record)))
    parts.append("\n## Gradient errors against float64\n\n")
    parts.append(markdown_table(error_rows(record)))
    parts.append(not_run_section(record))
    return "\n".join(parts)


def plot(record: dict, path) -> Path:
    """Step time per variant (bars: median; whiskers: p20–p80), one panel per case."""
    matplotlib = require_extra("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = record["cases"]
    ncols = min(len(cases), 3) or 1
    nrows = max(1, math.ceil(len(cases) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.0 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        pts = [(v["variant"], v["timing"]) for v in case["variants"] if v.get("timing")]
        xs = range(len(pts))
        meds = [t["median_ms"] for _, t in pts]
        err = [[t["median_ms"] - t["p20_ms"] for _, t in pts], [t["p80_ms"] - t["median_ms"] for _, t in pts]]
        ax.bar(xs, meds, yerr=err, capsize=3, color=[f"C{i}" for i in xs])
        ax.set_xticks(list(xs), [n for n, _ in pts])
        ax.set_ylabel("ms per training step (median, p20–p80)")
        ax.set_title(f"{case['workload']} {case['case']}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    return save_figure(fig, plt, record, "mixstack bench train", path)


def write(record: dict, out_dir, *, with_plot: bool = True) -> dict[str, Path]:
    """``bench_train.json``, ``.md``, ``.csv`` and (optionally) ``bench_train.png`` in ``out_dir``."""
    from ..measure import report
    return report.write(record, out_dir, with_plot=with_plot, names=(JSON_NAME, MARKDOWN_NAME, PLOT_NAME),
                        render_markdown=markdown, render_plot=plot, render_rows=long_rows)
