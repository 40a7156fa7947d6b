"""Freeze the potential on CUDA step by step, flushing each step (a probe for crashes):
trace, AOTInductor compile, load, call; compares the loaded file with the live module.

    PYTHONPATH=. python scripts/probe_freeze.py LEVEL [--save PATH | --load PATH]
    PYTHONPATH=. python scripts/probe_freeze.py --matrix    # each case in its own process

``--save`` freezes and exits without loading; ``--load`` only loads and calls
(a fresh process: tells a crash of loading from one of loading where the
compiler ran).  ``--matrix`` runs a plain ``nn.Linear`` package, and level 1
saved and loaded in two processes.
"""
import faulthandler
import subprocess
import sys
import tempfile

import torch

faulthandler.enable()


def _inputs():
    from ase.build import bulk
    from mixstack.potential import SO2Potential, atoms_inputs
    model = SO2Potential(lmax=2, focus_dim=16, n_focus=2, cutoff=4.0, seed=3, energy_scale=10.0,
                         device="cuda").eval()
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=1)
    big = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((3, 3, 2))
    big.rattle(0.05, seed=2)
    return model, atoms_inputs(atoms, model.cutoff, device="cuda"), atoms_inputs(big, model.cutoff, device="cuda")


def plain_linear():
    """AOTInductor on this machine at all: an ``nn.Linear`` package, compiled and loaded."""
    m = torch.nn.Linear(8, 4).cuda()
    x = torch.randn(3, 8, device="cuda")
    ep = torch.export.export(m, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=tempfile.mkdtemp() + "/lin.pt2")
    print("plain: compiled; loading", flush=True)
    got = torch._inductor.aoti_load_package(path)(x)
    print("plain: ok", (got - m(x)).abs().max().item(), flush=True)


def main(argv):
    if argv[:1] == ["--matrix"]:
        d = tempfile.mkdtemp()
        runs = [["--plain"], ["1", "--save", f"{d}/l1.pt2"], ["1", "--load", f"{d}/l1.pt2"]]
        for args in runs:
            r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
            tail = [ln for ln in (r.stdout + r.stderr).splitlines() if "Warning" not in ln][-6:]
            print(f"== {' '.join(args)}: rc {r.returncode}", *tail, sep="\n  ", flush=True)
        return 0
    if argv[:1] == ["--plain"]:
        plain_linear()
        return 0
    import mixstack
    level = int(argv[0]) if argv else 1
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    load = argv[argv.index("--load") + 1] if "--load" in argv else None
    model, example, other = _inputs()
    path = load or save or tempfile.mkdtemp() + "/cu.pt2"
    with mixstack.use_level(level):
        if not load:
            print("freezing", flush=True)
            mixstack.freeze(model, example, path, tune=False)
        want = model(*other)
    if save:
        print("saved", path, flush=True)
        return 0
    print("loading", flush=True)
    frozen = mixstack.load(path)
    print("calling", flush=True)
    got = frozen(*other)
    torch.cuda.synchronize()
    for name, g, w in zip(("energy", "forces", "stress"), got[:3], want[:3]):
        print(name, ((g.double() - w.double()).norm() / w.double().norm().clamp_min(1e-12)).item(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
