"""Which of the convolution's operators gives wrong forces when a compiler traces its kernels.

A trace records the convolution's reference formulas (docs/contract.md §7) because the bench model
compiled with the operators' Triton kernels decomposed into the graph gave forces 4.3x off float64
on an H200; a frozen package (AOTInductor) can only hold kernels decomposed that way.  This probe
lets the kernels of one public function at a time (``rotate_in``, ``rotate_out_sum``,
``edge_wigner``) into a ``torch.compile`` trace (Inductor, static and dynamic shapes), and prints
each variant's forces against the float64 model and the eager frame, at two cells (the second, a
smaller atom count, runs the same compiled function: another edge count for dynamic shapes).

    python repro/traced_conv_kernels.py [--level 2] [--atoms 500]      # a CUDA GPU
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

import mixstack
from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell
from mixstack.bench.stack_bench import exact_fp32
from mixstack.conv import functional
from mixstack.dispatch import levels
from mixstack.potential import SO2Potential, atoms_inputs

OPS = ("rotate_in", "rotate_out_sum", "edge_wigner")


_current = {"op": None}      # the public function being called (set by the wrappers below)


def _wrapped(name: str, fn):
    def call(*args, **kwargs):
        _current["op"] = name
        try:
            return fn(*args, **kwargs)
        finally:
            _current["op"] = None
    return call


def install_wrappers() -> None:
    """Each public function, wherever a mixstack module holds it by name, wrapped to say it is
    the caller (``sys._getframe`` would break the trace instead)."""
    for name in OPS:
        fn = getattr(functional, name)
        wrapper = _wrapped(name, fn)
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("mixstack") and getattr(module, name, None) is fn:
                setattr(module, name, wrapper)


def conv_level_letting(allowed: set, original):
    """``conv_level`` that takes the kernels of the public functions in ``allowed`` under a trace."""
    def conv_level(t, channels):
        if _current["op"] in allowed and levels.get_level() > 0:
            return levels.get_level()
        return original(t, channels)
    return conv_level


def forces(model, inputs, level: int, energy=None):
    """The forces of ``model`` at ``inputs`` through ``energy`` (default ``model.energy``)."""
    energy = energy or model.energy
    with mixstack.use_level(level), torch.enable_grad(), mixstack.dispatch_log() as log:
        pos = inputs[0].detach().requires_grad_(True)
        e, _ = energy(pos, *inputs[1:])
        (g,) = torch.autograd.grad(e, pos)
    return -g.detach(), {k: v for k, v in log.items() if k.startswith(("conv", "wigner"))}


def rel(a, b) -> float:
    return (torch.linalg.vector_norm(a.double() - b.double()) / torch.linalg.vector_norm(b.double())).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--atoms", type=int, default=500)
    ap.add_argument("--shapes", default="dynamic", help="dynamic, static or both (a compile each)")
    args = ap.parse_args(argv)
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device="cuda").eval().requires_grad_(False)
    cells = [build_cell("cu-bcc", args.atoms, seed=0), build_cell("cu-bcc", int(args.atoms * 0.6), seed=1)]
    original = functional.conv_level
    install_wrappers()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, level {args.level}", flush=True)
    cases = []
    with exact_fp32():
        for atoms in cells:
            inputs = atoms_inputs(atoms, model.cutoff, device="cuda")
            f64, _ = forces(copy.deepcopy(model).double(),
                            atoms_inputs(atoms, model.cutoff, device="cuda", dtype=torch.float64), 0, None)
            eager, log = forces(model, inputs, args.level, None)
            cases.append((len(atoms), inputs, f64, eager))
            print(f"{len(atoms)} atoms, {inputs[3].shape[-1]} edges: eager level {args.level} "
                  f"{rel(eager, f64):.2e} from float64; {log}", flush=True)
        hows = ("static", "dynamic") if args.shapes == "both" else (args.shapes,)
        for allowed in [set(), set(OPS), *({op} for op in OPS)]:
            functional.conv_level = conv_level_letting(allowed, original)
            try:
                for how in hows:
                    torch.compiler.reset()
                    energy = torch.compile(lambda *a: model.energy(*a), dynamic=(how == "dynamic"))
                    for n, inputs, f64, eager in cases:        # the same compiled function at both sizes
                        try:
                            got, log = forces(model, inputs, args.level, energy)
                            print(f"  {n} atoms, kernels of {sorted(allowed) or 'none'} traced, {how}: "
                                  f"{rel(got, f64):.2e} from float64, {rel(got, eager):.2e} from eager; {log}",
                                  flush=True)
                        except Exception as exc:           # a trace or compile that fails is a finding too
                            print(f"  {n} atoms, kernels of {sorted(allowed) or 'none'} traced, {how}: "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            finally:
                functional.conv_level = original
    return 0


if __name__ == "__main__":
    sys.exit(main())
