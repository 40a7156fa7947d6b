"""Force accuracy of the potential on the GPU against a float64 copy (a probe, not a test).

For one bench cell: level 0 eager (twice), level 0 under torch.compile
(twice), levels 1 and 2 eager, each against the float64 level-0 forces of
the same weights; prints the max and relative force deviation of each.

    PYTHONPATH=. python scripts/probe_model.py cu-bcc 500
"""

from __future__ import annotations

import copy
import sys

import torch

from mixstack import use_level
from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell
from mixstack.potential import SO2Potential, atoms_inputs


def forces(model, inp, level, compiled=False, **compile_kw):
    """``(energy, forces)`` of ``model`` at ``level``, its energy under ``torch.compile(**compile_kw)``
    when ``compiled``."""
    energy = torch.compile(model.energy, dynamic=False, **compile_kw) if compiled else model.energy
    with use_level(level), torch.enable_grad():
        pos = inp.positions.detach().requires_grad_(True)
        e, _ = energy(pos, *inp[1:])
        (g,) = torch.autograd.grad(e, pos)
    return e.detach().double(), -g.double()


def report(name, got, e64, f64, n):
    e, f = got
    df = f - f64
    print(f"  {name:22s} dE/atom {abs(e - e64).item() / n:.2e}  dF max {df.abs().max().item():.2e}"
          f"  rel {(df.norm() / f64.norm()).item():.2e}", flush=True)


def main(cell="cu-bcc", atoms_n=500, *_flags):
    dev = torch.device("cuda")
    atoms = build_cell(cell, int(atoms_n), seed=0)
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device=dev).eval()
    model64 = copy.deepcopy(model).double()
    inp = atoms_inputs(atoms, model.cutoff, device=dev, dtype=torch.float32)
    inp64 = atoms_inputs(atoms, model.cutoff, device=dev, dtype=torch.float64)
    e64, f64 = forces(model64, inp64, 0)
    print(f"{cell}-{len(atoms)}: E64 {e64.item():.6f}  |F| rms {f64.pow(2).mean().sqrt().item():.3e} "
          f"max {f64.abs().max().item():.3e}")
    if "--precision" in sys.argv:     # does the compiled baseline's error come from TF32 dots?
        report("L0 compile", forces(copy.deepcopy(model), inp, 0, True), e64, f64, len(atoms))
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch._dynamo.reset()
        report("L0 compile, ieee set", forces(copy.deepcopy(model), inp, 0, True), e64, f64, len(atoms))
        return 0
    runs = [("L0 eager", 0, False), ("L1 eager", 1, False), ("L0 compile", 0, True)]
    for name, level, compiled in runs:
        report(name, forces(model, inp, level, compiled), e64, f64, len(atoms))
    # which compiled part loses the accuracy: compile one part of a fresh copy at a time
    parts = {"blocks": lambda m: [b for b in m.blocks],
             "stacks": lambda m: [b.stack for b in m.blocks],
             "wigner": lambda m: [m.wigner],
             "radial+envelope": lambda m: [m.radial_basis, m.envelope]}
    for name, pick in parts.items():
        m = copy.deepcopy(model)
        for sub in pick(m):
            sub.forward = torch.compile(sub.forward, dynamic=False)
        report(f"compile {name}", forces(m, inp, 0), e64, f64, len(atoms))
    torch.use_deterministic_algorithms(True, warn_only=True)
    report("compile determ.", forces(copy.deepcopy(model), inp, 0, True), e64, f64, len(atoms))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
