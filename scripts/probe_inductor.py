"""Which compiled piece of the potential loses the forces on the GPU (a probe, not a test).

The compiled level-0 baseline's forces were wrong on the H200 (torch 2.11,
Triton 3.6) while its energy was right; compiling whole interaction blocks
reproduced it.  This compiles one piece of each block at a time (edge
inputs, stack, rotation back, aggregation, node update), then the whole
model under a few Inductor options, and prints each run's force error
against the float64 model.

    PYTHONPATH=. python scripts/probe_inductor.py cu-bcc 500
"""

from __future__ import annotations

import copy
import sys

import torch

from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell
from mixstack.potential import SO2Potential, atoms_inputs

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe_model import forces, report  # noqa: E402

PIECES = ("edge_inputs", "stack", "from_edge_frame", "aggregate", "node_update")
OPTIONS = {
    "split_reductions=False": {"split_reductions": False},
}


def main(cell="cu-bcc", atoms_n="500"):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    atoms = build_cell(cell, int(atoms_n), seed=0)
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device=dev).eval()
    model64 = copy.deepcopy(model).double()
    inp = atoms_inputs(atoms, model.cutoff, device=dev)
    e64, f64 = forces(model64, atoms_inputs(atoms, model.cutoff, device=dev, dtype=torch.float64), 0)
    n = len(atoms)
    print(f"{cell}-{n}, torch {torch.__version__}", flush=True)
    report("eager", forces(model, inp, 0), e64, f64, n)
    report("compile all", forces(copy.deepcopy(model), inp, 0, True), e64, f64, n)
    for piece in PIECES:
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        for block in m.blocks:
            target = block.stack if piece == "stack" else block
            name = "forward" if piece == "stack" else piece
            setattr(target, name, torch.compile(getattr(target, name), dynamic=False))
        report(f"compile {piece}", forces(m, inp, 0), e64, f64, n)
    for label, opts in OPTIONS.items():
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        energy = torch.compile(m.energy, dynamic=False, options=opts)
        with torch.enable_grad():
            pos = inp.positions.detach().requires_grad_(True)
            e, _ = energy(pos, *inp[1:])
            (g,) = torch.autograd.grad(e, pos)
        report(f"all, {label}", (e.detach().double(), -g.double()), e64, f64, n)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
