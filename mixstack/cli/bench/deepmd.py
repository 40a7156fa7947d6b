"""``mixstack bench deepmd``: deepmd-kit's SeZM (DPA4) models at deepmd-kit's own levels against
the same models accelerated by ``mixstack.deepmd`` (docs/deepmd.md).  The options are defined
here only; the bench is ``mixstack.bench.deepmd_bench``."""

from __future__ import annotations

import argparse
import time

from ..common import COUNT, COUNT0, NONNEGATIVE, POSITIVE, command_line, name_list, results_folder, write_results

# The names the parsers spell out: the modules that define them import torch.
CONFIG_NAMES = ("water", "two_stream", "default")       # mixstack.deepmd.configs.CONFIGS
SYSTEM_NAMES = ("water", "rocksalt")                    # mixstack.bench.deepmd_bench.SYSTEMS
REST_LEVELS = (0, 1, 2, 3)                              # deepmd-kit's DP_TRITON_INFER

HELP = "deepmd-kit's SeZM models: deepmd-kit's levels against the accelerated model"
DESCRIPTION = ("Time deepmd-kit's own forward of a SeZM (DPA4) model (energy, forces and virial, its "
               "neighbour list included) at deepmd-kit's levels (dpN: DP_TRITON_INFER=N) against the same "
               "weights accelerated by mixstack.deepmd (msN: mixstack level N); suffixes c (deepmd-kit's compiled "
               "inference, DP_COMPILE_INFER=1), p or k (ms, compiled: the rest of the model's products compensated, "
               "in ATen operations or by mixstack's kernel), f (ms, compiled: the graph lowered with Inductor's own "
               "fusion), t (its TF32 inference) and g (the frame through "
               "mixstack.deepmd.FrameRunner: a kept neighbour list in fixed buffers, replayed from a CUDA graph); "
               "with peak memory and the deviation from the float64 model, busy time and stages (--breakdown) "
               "and NVE through an ASE calculator (--md-steps). Needs the "
               "[deepmd] extra: pip install -e \".[deepmd]\" from a clone of mixstack.")


def config_variants(text: str) -> tuple[str, tuple[str, ...]]:
    """``"two_stream=dp2c,ms3cg"`` -> ``("two_stream", ("dp2c", "ms3cg"))``: one config's own variants."""
    config, sep, rest = text.partition("=")
    if not sep or config.strip() not in CONFIG_NAMES:
        raise argparse.ArgumentTypeError(f"takes CONFIG=LIST, CONFIG one of {', '.join(CONFIG_NAMES)}; got {text!r}")
    return config.strip(), name_list()(rest)


def add_arguments(p) -> None:
    p.add_argument("--atoms", type=COUNT, nargs="+", default=[500], metavar="N",
                   help="system sizes, about N atoms each (default 500)")
    p.add_argument("--configs", type=name_list(CONFIG_NAMES), default="water,two_stream", metavar="LIST",
                   help=f"model configs (mixstack.deepmd.configs), comma-separated: {', '.join(CONFIG_NAMES)} "
                        "(default water,two_stream)")
    p.add_argument("--systems", type=name_list(SYSTEM_NAMES), default="water,rocksalt", metavar="LIST",
                   help=f"systems, comma-separated: {', '.join(SYSTEM_NAMES)} (default water,rocksalt)")
    p.add_argument("--variants", type=name_list(), default="dp0,dp2,dp3,ms2,ms3", metavar="LIST",
                   help="comma-separated: dpN (deepmd-kit at DP_TRITON_INFER=N) or msN (mixstack level N), "
                        "N in 0..3, then optional suffixes in this order: c (DP_COMPILE_INFER=1), t "
                        "(DP_TF32_INFER=1), g (FrameRunner, a CUDA graph on a GPU); e.g. dp2c,ms3cg "
                        "(default dp0,dp2,dp3,ms2,ms3)")
    p.add_argument("--variants-for", type=config_variants, action="append", default=[], metavar="CONFIG=LIST",
                   help="the variants of one config, replacing --variants there, e.g. two_stream=dp2c,ms3cg "
                        "(repeatable; both configs in one run, each with its own variants)")
    p.add_argument("--rest-level", type=int, choices=REST_LEVELS, default=2,
                   help="DP_TRITON_INFER of the accelerated models: deepmd-kit's kernels for the rest "
                        "of the model (default 2)")
    p.add_argument("--processes", action="store_true",
                   help="each variant in a process of its own, all built at once (a compiled variant's trace "
                        "takes minutes of one core), then timed one process at a time in the same interleaved "
                        "rounds; every variant's memory is held together")
    p.add_argument("--build-ahead", action="store_true",
                   help="with --processes: every case's variants built at once before any case is timed, so that "
                        "both configs' builds overlap (all their memory held together: a large GPU)")
    p.add_argument("--rounds", type=COUNT, default=10, help="timed rounds, interleaved (default 10)")
    p.add_argument("--warmup", type=COUNT0, default=2, help="untimed warm-up rounds (default 2)")
    p.add_argument("--breakdown", action="store_true", help="device time per stage, forward and backward (profiler)")
    p.add_argument("--breakdown-rounds", type=COUNT, default=3, help="profiled frames per variant (default 3)")
    p.add_argument("--md-steps", type=COUNT0, default=0, metavar="N",
                   help="NVE steps per variant through an ASE calculator: deepmd-kit's, or "
                        "mixstack.deepmd.DeepmdCalculator for g variants (default 0: none)")
    p.add_argument("--md-warmup", type=COUNT0, default=3, metavar="N", help="untimed NVE steps first (default 3)")
    p.add_argument("--md-dt", type=POSITIVE, default=0.5, metavar="FS", help="NVE time step in fs (default 0.5)")
    p.add_argument("--skin", type=NONNEGATIVE, default=1.0, metavar="A",
                   help="the g variants' neighbour-list skin in Å (default 1; 0: a search every frame)")
    p.add_argument("--rcut", type=POSITIVE, metavar="R", help="the configs' cutoff in Å, overridden (tiny CPU runs)")
    p.add_argument("--seconds", type=POSITIVE, metavar="S",
                   help="start no step once S seconds have gone: what is left is marked not run, the results "
                        "are written and the exit status is 0 (default: no limit)")
    p.add_argument("--seed", type=COUNT0, default=0, help="seed of the weights' perturbation and the frames (default 0)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--out", help="results folder, created and checked before anything runs (default: a new "
                   "<date>-<device>-<purpose> folder in the user results folder, MIXSTACK_RESULTS_DIR)")


def run(args, argv=None) -> int:
    t0 = time.monotonic()                                  # --seconds counts from here
    from ...bench import deepmd_bench
    from ...deepmd.compat import deepmd_pt
    from ...measure import env, report

    args.variants_for = dict(args.variants_for)            # a config named twice: the last list
    for option, keys in [("--variants", args.variants), *(("--variants-for", v) for v in args.variants_for.values())]:
        try:
            for key in keys:
                deepmd_bench.parse_variant(key)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    if args.build_ahead and not args.processes:
        raise ValueError("--build-ahead builds the variants in processes of their own: add --processes")
    unused = sorted(set(args.variants_for) - set(args.configs))
    if unused:
        raise ValueError(f"--variants-for: {', '.join(unused)} is not among --configs ({', '.join(args.configs)})")
    device = env.resolve_device(args.device)
    deepmd_pt()
    if args.md_steps:               # deepmd-kit's ASE calculator: said now, not after the frames are timed
        report.require_extra("ase", "deepmd")
    out = results_folder(args.out, device, "bench-deepmd")
    print(f"mixstack bench deepmd on {device}: configs {', '.join(args.configs)}; systems "
          f"{', '.join(args.systems)} at ~{', '.join(map(str, args.atoms))} atoms; variants "
          f"{', '.join(args.variants)}" + "".join(f" ({c}: {', '.join(v)})" for c, v in args.variants_for.items())
          + f"; {args.rounds} rounds after {args.warmup} warm-up"
          + (f"; at most {args.seconds:g} s" if args.seconds else "") + f"; into {out}", flush=True)

    def say(text):                  # each step as it ends, with the seconds since the start
        print(f"  [{time.monotonic() - t0:5.0f} s] {text}", flush=True)

    def keep(partial):              # the record so far, as each step starts and ends: a run cut off keeps it
        deepmd_bench.write(partial, out)
    record = deepmd_bench.run_deepmd_bench(args, device, command=command_line(argv), start=t0,
                                           on_case=lambda case: print(f"  {case}", flush=True),
                                           on_step=say, on_write=keep)
    if record.get("stopped"):
        print(f"  stopped: {record['stopped']}; what it left is marked not run", flush=True)
    print(deepmd_bench.markdown(record), end="")
    return write_results(deepmd_bench.write, record, out, True, [])
