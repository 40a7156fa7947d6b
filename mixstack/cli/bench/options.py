"""The options that several bench targets take, each defined once here, and the helpers that
turn them into a bench config.  A target adds the groups it takes and nothing else.  No torch
here: ``--help`` builds every parser."""

from __future__ import annotations

from dataclasses import replace

from ..common import COUNT, COUNT0, MODEL_OPTIONS, POSITIVE, count_list

# Every form ``--levels`` accepts, per bench: the key, or the variant's name (any case).  The bench
# modules hold the variants (``VARIANTS``); tests hold these lists to them.
LEVELS = ("0 or L0-eager (eager), 0c or L0-compile (torch.compile of level 0), 1 or L1, 2 or L2, "
          "2f or L2-fused (level 2 with the fused backward forced), 3 or L3, 3r or L3-rule (level 3's "
          "compensated kernels on the level-3 policy's config, also where level 3 would run level 2)")
STACK_LEVELS = (LEVELS + ", 1b or L1-blas, 2b or L2-blas (levels 1 and 2 with every exact product on "
                "cuBLAS, TF32 off)")
MODEL_LEVELS = (LEVELS + "; and 1c or L1-compile, 2c or L2-compile, 3c or L3-compile (that level under "
                "torch.compile), 1g or L1-graph, 2g or L2-graph, 3g or L3-graph (that level's frame replayed "
                "from a CUDA graph)")
TRAIN_LEVELS = "0 or L0-eager, 0c or L0-compile, 1 or L1, 2 or L2, 3 or L3"
PASSES = ("fwd", "bwd", "both")


def add_run(p, *, quick: str | None = "one shape, few rounds: a smoke run") -> None:
    """Options of every target: device, seed, rounds, results folder (and ``--quick``)."""
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--seed", type=COUNT0, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--repeats", type=COUNT, help="timed rounds per pass")
    p.add_argument("--warmup", type=COUNT0, help="untimed warm-up rounds per pass")
    if quick:
        p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--out", help="results folder, created and checked before anything runs (default: a new "
                   "<date>-<device>-<purpose> folder in the user results folder, MIXSTACK_RESULTS_DIR)")
    p.add_argument("--no-plot", action="store_true", help="write JSON, Markdown and CSV only (no matplotlib)")


def add_levels(p, forms: str) -> None:
    p.add_argument("--levels", metavar="LIST", help=f"variants, comma-separated: {forms}")


def add_passes(p) -> None:
    p.add_argument("--pass", dest="passes", action="append", metavar="PASS",
                   help="fwd, bwd (backward alone) or both (fwd+bwd); repeatable or comma-separated "
                        "(default: all three)")


def add_check_edges(p) -> None:
    p.add_argument("--check-edges", type=COUNT, help="edges checked against float64 (default 4096)")


def add_shape(p, role: str, *, lists: bool = False) -> None:
    """``--focus``, ``--focus-dim``, ``--lmax``, ``--layers`` for ``role`` (``lists``: comma-separated)."""
    kind = count_list(1) if lists else COUNT

    def default(value) -> str:
        return " (default: all)" if lists else f" (default {value})"

    p.add_argument("--focus", type=kind, metavar="F", help=f"{role}: focus streams F{default(2)}")
    p.add_argument("--focus-dim", type=kind, metavar="CF", help=f"{role}: channels Cf{default(32)}")
    p.add_argument("--lmax", type=kind, metavar="L", help=f"{role}: lmax, 1..6{default(3)}")
    if not lists:
        p.add_argument("--layers", type=COUNT, help=f"{role}: stack layers (default 4)")


def add_potential(p) -> None:
    """The potential's own sizes (with ``add_shape``: every ``MODEL_OPTIONS`` option)."""
    p.add_argument("--blocks", type=COUNT, help="model: interaction blocks (default 2)")
    p.add_argument("--cutoff", type=POSITIVE, help="model: cutoff in Å (default 5)")


def with_rounds(cfg, args):
    """``cfg`` with ``--repeats`` and ``--warmup`` where given."""
    if args.repeats is not None:
        cfg = replace(cfg, rounds=args.repeats)
    if args.warmup is not None:
        cfg = replace(cfg, warmup=args.warmup)
    return cfg


def passes(args, allowed=PASSES) -> tuple[str, ...] | None:
    """The ``--pass`` values in order, once each (``None`` when not given)."""
    if not args.passes:
        return None
    chosen = tuple(dict.fromkeys(p.strip() for item in args.passes for p in item.split(",") if p.strip()))
    bad = [p for p in chosen if p not in allowed]
    if bad or not chosen:
        raise ValueError(f"--pass takes {', '.join(allowed)}; got {', '.join(bad) or 'nothing'}")
    return chosen


def model_with(args, model: dict) -> dict:
    """``model`` (``SO2Potential`` arguments) with every ``MODEL_OPTIONS`` option given."""
    model = dict(model)
    for opt, key in MODEL_OPTIONS.items():
        if getattr(args, opt, None) is not None:
            model[key] = getattr(args, opt)
    check_lmax(model["lmax"])
    return model


def check_lmax(*values) -> None:
    bad = [v for v in values if v is not None and not 1 <= v <= 6]
    if bad:
        raise ValueError(f"--lmax must be in 1..6, got {', '.join(map(str, bad))}")
