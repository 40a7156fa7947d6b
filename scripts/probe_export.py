"""Trace the potential for freeze at level 1 on CUDA (a probe): run with TORCH_LOGS=+dynamic
and grep the guards; prints the operators the exported graph holds."""
import sys

from ase.build import bulk

import mixstack
from mixstack import deploy
from mixstack.potential import SO2Potential, atoms_inputs

model = SO2Potential(lmax=2, focus_dim=16, n_focus=2, cutoff=4.0, seed=3, device="cuda").eval()
atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
atoms.rattle(0.05, seed=1)
with mixstack.use_level(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    program = deploy.trace(model, atoms_inputs(atoms, model.cutoff, device="cuda"))
print(sorted({str(n.target) for n in program.graph.nodes if "mixstack" in str(n.target)}))
