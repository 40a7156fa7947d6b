"""``mixstack.freeze`` and ``mixstack.load``: a potential as one AOTInductor ``.pt2`` file (docs/contract.md §6).

``freeze(module, example, path)``

1. collects the mixing-stack shape keys of ``module`` (every submodule with a
   ``stack_shape_key()`` method, and every ``mixstack.MixingStack``);
2. tunes the keys without a table entry (``tuner.tune_missing``) when the
   module lives on CUDA and the active level is >= 2 — the only case where
   a tuned config changes what runs (the compensated family at level 3
   only); otherwise it logs why tuning was skipped;
3. traces ``module(positions, cell, numbers, edge_index, shifts, slots) ->
   (energy, forces, stress, energies)`` into one graph of ATen operators with
   ``make_fx`` (symbolic shapes), then ``torch.export``s that graph with dynamic
   atom, edge and per-atom-neighbour counts and compiles it with AOTInductor.

Why ``make_fx`` first: forces are ``-dE/dx`` from ``torch.autograd.grad``
*inside* the exported function, and ``torch.export`` (2.13, strict or not)
cannot trace ``autograd.grad`` itself (it fails with "fake tensor in the
exported program constant's list").  ``make_fx`` traces below autograd, so the
backward is unrolled into plain ATen ops (and, at levels >= 1 on a GPU, the
``mixstack::stack_forward`` / ``stack_backward`` operators); ``torch.export`` of
that flat graph works.  Duck shaping is switched off while tracing, so a
dynamic size that happens to equal a fixed one (16 atoms and 16 channels)
does not get fused into it.  This is NequIP's recipe for the same problem.

The trace runs at the active mixstack level on the module's device: a
frozen file holds the paths (and tuned launch configs) that level chose, and
the weights as constants.  The neighbour list stays outside
(``mixstack.potential.neighbors``).  ``load(path)`` returns a callable with
the same signature and outputs; ``cutoff``, dtype, level and model config
travel in the package's metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from . import cxx_runtime, tuner, tuning
from .core import config
from .core.version import __version__
from .dispatch import levels
from .stack import level3
from .stack.nn import MixingStack
from .tuner import sweep

log = logging.getLogger(__name__)

INPUT_NAMES = ("positions", "cell", "numbers", "edge_index", "shifts", "slots")
OUTPUT_NAMES = ("energy", "forces", "stress", "energies")


def stack_keys(module: torch.nn.Module) -> list:
    """The distinct tuning keys of the mixing stacks in ``module``, in module order."""
    keys = []
    for m in module.modules():
        if hasattr(m, "stack_shape_key"):
            keys.append(m.stack_shape_key())
        elif isinstance(m, MixingStack):
            keys.append(tuning.shape_key(focus_dim=m.focus_dim, lmax=m.lmax, n_focus=m.n_focus,
                                         apply_alpha=m.apply_alpha))
    return list(dict.fromkeys(keys))


def _module_device(module: torch.nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def tune_for_freeze(keys, device: torch.device, level: int, *, progress=None,
                    seconds: float | None = None) -> str:
    """Tune the missing ``keys`` when that can matter (CUDA, level >= 2); say what was done.

    The quick sweep of ``mixstack tune`` (pruned candidates, its rounds), bounded by ``seconds``
    (default ``MIXSTACK_FREEZE_TUNE_SECONDS``, 300; ``0`` skips it): a family the budget does
    not reach keeps its default config and is reported "out-of-time".  A family that fails is
    reported and the freeze goes on.  ``progress`` (a callable of one line) hears of each family
    and key as its sweep starts."""
    budget = config.freeze_tune_seconds() if seconds is None else float(seconds)
    if not keys:
        why = "the module holds no mixing stack"
    elif device.type != "cuda":
        why = f"the module is on {device.type}, and tuned launch configs apply to CUDA only"
    elif level < 2:
        why = f"level {level} does not read the tuning tables (level 2 and up do)"
    elif budget <= 0:
        why = "MIXSTACK_FREEZE_TUNE_SECONDS is 0"
    else:
        # a family matters only at the level its candidates run at (compensated: 3)
        names = [f for f in tuning.SWEEP_ORDER if tuning.families.family(f).candidate_level <= level]
        results = tuner.tune_missing(keys, families=names, quick=True, rounds=sweep.QUICK_ROUNDS,
                                     warmup=sweep.QUICK_WARMUP, seconds=budget, stop_on_error=False,
                                     progress=_sweep_reporter(progress))
        done = ", ".join(f"{r.family} {r.key.short()}: {r.status}" for r in results)
        log.info("freeze: tuned %d key(s) within %.0f s: %s", len(keys), budget, done)
        return f"tuned (quick sweep, at most {budget:.0f} s): {done}"
    log.info("freeze: tuning skipped: %s", why)
    return f"skipped: {why}"


def _sweep_reporter(progress):
    """A sweep's ``TuneProgress`` callback that hands ``progress`` one line as each family and
    key starts (the sweep's own steps are too many to print); ``None`` without ``progress``."""
    if progress is None:
        return None
    started = set()

    def step(ev) -> None:
        if (ev.family, ev.key) not in started:
            started.add((ev.family, ev.key))
            progress(f"tuning {ev.family} {ev.key.short()}: {ev.total} step(s)")
    return step


def check_level3(keys, device: torch.device, level: int) -> str:
    """At level 3 on CUDA, each key's level-3 plan, the policy's unchecked configs checked against
    float64 first (``stack.level3.check``): a trace makes no eager call, which is where that check
    otherwise runs, so without this a freeze would trace level 2 at every key no table covers.
    A key left at level 2 says why."""
    if level < 3 or device.type != "cuda" or not keys:
        return ""
    plans = [(key, level3.check(key, device)) for key in keys]
    return "; ".join(f"{key.short()}: {p.source if p.config is not None else f'level 2 ({p.reason})'}"
                     for key, p in plans)


@contextlib.contextmanager
def _no_duck_shapes():
    from torch.fx.experimental import _config
    saved = _config.use_duck_shape
    _config.use_duck_shape = False
    try:
        yield
    finally:
        _config.use_duck_shape = saved


class _Outputs(torch.nn.Module):
    """``module``'s four outputs as a flat tuple (the traced function)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, positions, cell, numbers, edge_index, shifts, slots):
        return tuple(self.module(positions, cell, numbers, edge_index, shifts, slots))


def _example_inputs(module, example):
    """``example``: an ``ase.Atoms`` or the six input tensors."""
    if hasattr(example, "get_positions"):
        if not hasattr(module, "inputs_of"):
            raise TypeError(f"example is an ase.Atoms, but {type(module).__name__} has no inputs_of(atoms) "
                            f"to turn it into input tensors: pass the six tensors ({', '.join(INPUT_NAMES)})")
        example = module.inputs_of(example)
    example = tuple(example)
    if len(example) != len(INPUT_NAMES) or not all(torch.is_tensor(t) for t in example):
        raise TypeError(f"example must be an ase.Atoms or six tensors ({', '.join(INPUT_NAMES)})")
    n_atoms, n_edges, k = example[0].shape[0], example[3].shape[1], example[5].shape[1]
    if min(n_atoms, n_edges, k) < 2:
        raise ValueError(f"the example structure must have at least 2 atoms, 2 edges and 2 neighbours "
                         f"of one atom (dynamic sizes are traced from it); got {n_atoms} atoms, "
                         f"{n_edges} edges, at most {k} neighbours")
    return example


def trace(module: torch.nn.Module, example) -> "torch.export.ExportedProgram":
    """The ``ExportedProgram`` of ``module``'s energy, forces, stress and per-atom energies."""
    from torch.fx.experimental.proxy_tensor import make_fx
    example = _example_inputs(module, example)
    wrapped = _Outputs(module).eval()
    with _no_duck_shapes():
        graph = make_fx(wrapped, tracing_mode="symbolic", _allow_non_fake_inputs=True,
                        _error_on_data_dependent_ops=True)(*[t.clone() for t in example])
    n_atoms, n_edges = torch.export.Dim("n_atoms", min=1), torch.export.Dim("n_edges", min=1)
    k = torch.export.Dim("max_neighbors", min=1)
    dynamic = ({0: n_atoms}, None, {0: n_atoms}, {1: n_edges}, {0: n_edges}, {0: n_atoms, 1: k})
    # Guards the solver cannot prove for every size (e.g. min(5E, 15E) == 5E, which holds
    # for all E >= 0) become runtime asserts in the program instead of export errors.
    return torch.export.export(graph, example, dynamic_shapes=dynamic, strict=False,
                               prefer_deferred_runtime_asserts_over_guards=True)


def _stage_reporter(progress):
    """``progress`` as a callable of one line: ``"auto"`` writes to stderr when it is a
    terminal (an interactive user sees the minutes go by), else only logs."""
    if progress == "auto":
        progress = (lambda msg: print(f"mixstack.freeze: {msg}", file=sys.stderr, flush=True)) \
            if sys.stderr.isatty() else None
    start = time.perf_counter()

    def report(msg: str) -> None:
        line = f"[{time.perf_counter() - start:6.1f} s] {msg}"
        log.info("freeze: %s", line)
        if progress is not None:
            progress(line)
    return report


def freeze(module: torch.nn.Module, example, path, *, tune: bool = True,
           inductor_configs: dict | None = None, progress="auto",
           private_cxx_runtime: bool | None = None) -> Path:
    """Tune (where it matters), export and AOT-compile ``module`` into the ``.pt2`` file ``path``.

    ``module``: a potential with ``forward(positions, cell, numbers, edge_index,
    shifts, slots) -> (energy, forces, stress, energies)`` and a ``cutoff``
    (``mixstack.potential.SO2Potential``).  ``example``: an ``ase.Atoms`` or
    those six tensors, on the module's device, with >= 2 atoms and edges.
    The trace runs at the active mixstack level.  Returns the path written.

    ``progress``: a callable that receives one line per stage (tuning, tracing,
    compiling: the last takes a minute or more); ``"auto"`` (default) prints the
    lines to stderr when it is a terminal; ``None``: logging only.
    ``private_cxx_runtime``: link the package with its own hidden copy of libstdc++
    (``mixstack.cxx_runtime``; default ``MIXSTACK_PRIVATE_CXX_RUNTIME``), for a machine whose
    process and compiler disagree on libstdc++.
    """
    report = _stage_reporter(progress)
    device, level = _module_device(module), levels.get_level()
    if private_cxx_runtime is None:
        private_cxx_runtime = config.private_cxx_runtime()
    keys = stack_keys(module)
    if tune:
        report(f"1/3 tuning the missing stack keys ({len(keys)} in the model)")
    tuned = tune_for_freeze(keys, device, level, progress=report) if tune else "skipped: freeze(tune=False)"
    report(f"1/3 tuning {tuned}")
    checked = check_level3(keys, device, level)
    if checked:
        report(f"1/3 level 3: {checked}")
    was_training = module.training
    module.eval()
    report(f"2/3 tracing energy, forces and stress at level {level} on {device} (make_fx, torch.export)")
    try:
        program = trace(module, example)
    finally:
        module.train(was_training)
    p = next(module.parameters())
    meta = {
        "mixstack_version": __version__, "cutoff": repr(float(module.cutoff)),
        "dtype": str(p.dtype).removeprefix("torch."), "level": str(level),
        "config": json.dumps(getattr(module, "config", {})),
        "stack_keys": ";".join(f"[{k}]" for k in keys), "tuning": tuned, "level3": checked,
        "private_cxx_runtime": "1" if private_cxx_runtime else "0",
        "inputs": ",".join(INPUT_NAMES), "outputs": ",".join(OUTPUT_NAMES),
    }
    configs = {**cxx_runtime.inductor_configs(private_cxx_runtime), **(inductor_configs or {})}
    configs["aot_inductor.metadata"] = {**configs.get("aot_inductor.metadata", {}), **meta}
    path = Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    report(f"3/3 compiling {path} with AOTInductor (a minute or more)")
    out = torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                   inductor_configs=configs)
    report(f"done: {out}")
    return Path(out)


class FrozenPotential:
    """A frozen potential: ``(positions, cell, numbers, edge_index, shifts, slots) ->
    (energy, forces, stress, energies)``, like the module it was frozen from."""

    def __init__(self, path, *, device_index: int = -1):
        self.path = Path(os.fspath(path))
        if not self.path.is_file():
            raise FileNotFoundError(f"no frozen potential at {self.path}")
        self._program = torch._inductor.aoti_load_package(str(self.path), device_index=device_index)
        self.metadata = dict(self._program.get_metadata())
        if "cutoff" not in self.metadata:
            raise ValueError(f"{self.path} was not written by mixstack.freeze (no cutoff in its metadata)")
        self.cutoff = float(self.metadata["cutoff"])
        self.dtype = getattr(torch, self.metadata["dtype"])
        dev = self.metadata.get("AOTI_DEVICE_KEY", "cpu")
        self.device = torch.device(dev if dev == "cpu" or device_index < 0 else f"{dev}:{device_index}")
        self.config = json.loads(self.metadata.get("config") or "{}")

    def __call__(self, positions, cell, numbers, edge_index, shifts, slots):
        return tuple(self._program(positions, cell, numbers, edge_index, shifts, slots))

    def __repr__(self) -> str:
        return (f"FrozenPotential({str(self.path)!r}, cutoff={self.cutoff}, dtype={self.dtype}, "
                f"device={self.device}, level={self.metadata.get('level')})")


def load(path, *, device_index: int = -1) -> FrozenPotential:
    """Load a ``.pt2`` written by ``freeze``; returns a ``FrozenPotential``."""
    return FrozenPotential(path, device_index=device_index)
