"""``mixstack freeze``: tune a potential's stack keys, export it and compile it with
AOTInductor into a ``.pt2`` file that ``mixstack.load`` runs."""

from __future__ import annotations

from .common import COUNT, COUNT0, MODEL_OPTIONS, POSITIVE, existing_file, writable_file

HELP = "export a potential with AOTInductor into a .pt2 file (docs/contract.md §6)"
DESCRIPTION = ("Tune the model's mixing-stack keys on the local GPU (CUDA, level "
               ">= 2), then torch.export the energy, forces and stress and compile them with "
               "AOTInductor into a .pt2 that mixstack.load (or MixstackCalculator) runs. The "
               "model: a checkpoint written by SO2Potential.save, or a new one from the options.")


def add_arguments(p) -> None:
    p.add_argument("out", help="the .pt2 file to write")
    p.add_argument("--checkpoint", help="an SO2Potential.save file (default: a new model)")
    p.add_argument("--structure", default="diamond",
                   help="example structure: diamond, cu-bcc, or a file ASE reads (default diamond)")
    for opt, text in (("--lmax", "lmax (default 2)"), ("--focus-dim", "channels Cf (default 16)"),
                      ("--focus", "focus streams (default 2)"), ("--layers", "stack layers (default 3)"),
                      ("--blocks", "interaction blocks (default 2)")):
        p.add_argument(opt, type=COUNT, help=f"new model: {text}")
    p.add_argument("--cutoff", type=POSITIVE, help="new model: cutoff in Å (default 5)")
    p.add_argument("--float64", action="store_true", help="new model: float64 weights")
    p.add_argument("--seed", type=COUNT0, default=0, help="new model: initialisation seed (default 0)")
    p.add_argument("--device", help="where to trace and compile: cpu, cuda or cuda:N (default: cpu, or the checkpoint's)")
    p.add_argument("--no-tune", action="store_true", help="do not tune missing keys first")
    p.add_argument("--private-cxx-runtime", action="store_true", default=None,
                   help="link the package with its own hidden copy of libstdc++, for a machine whose "
                        "Python process and C++ compiler disagree on it (default: MIXSTACK_PRIVATE_CXX_RUNTIME)")


def _example(args):
    """The example structure: a named cell, or a file ASE reads."""
    if args.structure in ("diamond", "cu-bcc"):
        from ..potential.cells import build_cell
        return build_cell(args.structure, 16, seed=args.seed)
    existing_file("--structure", args.structure)
    try:
        from ase.io import read
    except ImportError as exc:
        raise ImportError('reading a structure needs ASE; `pip install -e ".[potential]"` from a clone of mixstack') from exc
    try:
        return read(args.structure)
    except Exception as exc:                 # ASE raises many types for a file it cannot parse
        raise ValueError(f"--structure {args.structure}: ASE could not read it "
                         f"({type(exc).__name__}: {exc})") from exc


def run(args, argv=None) -> int:
    import torch

    from ..export import freeze
    from ..measure.env import resolve_device
    from ..potential import SO2Potential

    writable_file("out", args.out)
    device = None if args.device is None else resolve_device(args.device)
    if args.checkpoint:
        model = SO2Potential.load(existing_file("--checkpoint", args.checkpoint), device=device)
    else:
        kw = {key: getattr(args, opt) for opt, key in MODEL_OPTIONS.items()
              if getattr(args, opt, None) is not None}
        model = SO2Potential(**kw, seed=args.seed, device=device,
                             dtype=torch.float64 if args.float64 else None)
    example = _example(args)
    print(f"mixstack freeze: {model.__class__.__name__}({model.extra_repr()}) on "
          f"{next(model.parameters()).device}, example {example.get_chemical_formula()} "
          f"({len(example)} atoms)")
    path = freeze(model, example, args.out, tune=not args.no_tune, private_cxx_runtime=args.private_cxx_runtime,
                  progress=lambda msg: print(f"  {msg}", flush=True))
    print(f"wrote {path}")
    from ..packages import package_kernels
    print("\n".join(package_kernels(path).lines()[1:]))
    return 0
