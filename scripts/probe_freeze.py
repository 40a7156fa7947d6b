"""Freeze the potential on CUDA step by step, flushing each step (a probe for crashes):
trace, AOTInductor compile, load, call; compares the loaded file with the live module."""
import faulthandler
import sys
import tempfile

import torch
from ase.build import bulk

import mixstack
from mixstack import deploy
from mixstack.potential import SO2Potential, atoms_inputs

faulthandler.enable()
level = int(sys.argv[1]) if len(sys.argv) > 1 else 1
model = SO2Potential(lmax=2, focus_dim=16, n_focus=2, cutoff=4.0, seed=3, energy_scale=10.0,
                     device="cuda").eval()
atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
atoms.rattle(0.05, seed=1)
example = atoms_inputs(atoms, model.cutoff, device="cuda")
big = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((3, 3, 2))
big.rattle(0.05, seed=2)
other = atoms_inputs(big, model.cutoff, device="cuda")
path = tempfile.mkdtemp() + "/cu.pt2"
with mixstack.use_level(level):
    print("tracing", flush=True)
    deploy.trace(model, example)
    print("freezing", flush=True)
    mixstack.freeze(model, example, path, tune=False)
    print("live", flush=True)
    want = model(*other)
print("loading", flush=True)
frozen = mixstack.load(path)
print("calling", flush=True)
got = frozen(*other)
torch.cuda.synchronize()
for name, g, w in zip(("energy", "forces", "stress"), got[:3], want[:3]):
    print(name, ((g.double() - w.double()).norm() / w.double().norm().clamp_min(1e-12)).item(), flush=True)
