"""Level 3 on TMA loads through the whole stack, forward and backward, every candidate: where and
how each differs from the pointer kernel at the same tile.

The GPU tests stop at a key's first wrong candidate; this runs every form of the TMA kernel at one
key's tiles, those the tuner never sweeps included (``swept``: ``tuning.families.tma_form_is_right``),
or ``--quick``'s forms, and reports, per output (``out``, ``grad_u0``,
``grad_alpha``), the non-finite values, the largest difference, whether the bits are equal, and
the first wrong edge rows with the E tile they fall in (``--rows``), so that a fault that follows
the pipeline's depth, the warp roles or the last partial tile shows as such.  ``--one LABEL``
runs one candidate once (for ``compute-sanitizer``).  On a CPU it runs in the interpreter
(``TRITON_INTERPRET=1``), which loads through the descriptors but neither pipelines nor
specialises.

    python scripts/tma_stack_probe.py [--edges 4099] [--focus 2] [--focus-dim 32] [--lmax 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import mixstack
from mixstack import tuning
from mixstack.measure.shapes import BenchShape, make_inputs
from mixstack.tuner.sweep import build_reason, resource_reason
from mixstack.tuning.families import GEMM_FIELDS, label, tma_form_is_right, tma_forms

OUTPUTS = ("out", "grad_u0", "grad_alpha")


def run_stack(shape: BenchShape, x) -> dict:
    """Level 3's forward and backward of ``x`` (``StackInputs``): the result and the gradients of
    ``u0`` and ``alpha``."""
    u0 = x.u0.detach().clone().requires_grad_(True)
    alpha = x.alpha.detach().clone().requires_grad_(shape.apply_alpha)
    with mixstack.use_level(3), mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(u0, alpha, x.w0, x.w1, x.gw, lmax=shape.lmax, focus_dim=shape.focus_dim,
                                    apply_alpha=shape.apply_alpha)
        wrt = [u0] + ([alpha] if shape.apply_alpha else [])
        grads = torch.autograd.grad(out, wrt, x.grad_out)
    res = {"out": out.detach(), "grad_u0": grads[0]}
    if shape.apply_alpha:
        res["grad_alpha"] = grads[1]
    res["log"] = dict(log)
    return res


def compare(ref: dict, got: dict, block_m: int, rows: int) -> dict:
    """Per output: non-finite count, largest difference, equal bits, and the first wrong edge rows
    (``(edge, E tile)``)."""
    report = {}
    for name in OUTPUTS:
        if name not in ref:
            continue
        a, b = ref[name], got[name]
        bad = ~torch.isfinite(b)
        wrong = bad | (a != b)
        edge_dim = 1 if name == "grad_u0" else 0            # grad_u0 (F, E, ROW); out (E, F, ROW); alpha (E, F)
        per_edge = wrong.movedim(edge_dim, 0).reshape(wrong.shape[edge_dim], -1).any(1)
        edges = per_edge.nonzero().flatten()[:rows].tolist()
        diff = (a - b).abs()
        report[name] = {"nonfinite": int(bad.sum()), "max_abs": float(diff[torch.isfinite(diff)].max()) if
                        bool(torch.isfinite(diff).any()) else None, "bits_equal": bool(torch.equal(a, b)),
                        "wrong_edges": int(per_edge.sum()), "first": [(e, e // block_m) for e in edges]}
    return report


def probe(shape: BenchShape, device, *, quick: bool = False, only: str | None = None, rows: int = 6):
    """Each candidate's ``compare`` against the pointer kernel at its tile (yields dicts)."""
    key = shape.tuning_key()
    x = make_inputs(shape, device, seed=0)
    forms = tuning.candidates("stack_compensated_tma", key, quick=True) if quick else tma_forms(key)
    for cfg in forms:
        name = label(cfg)
        if only is not None and name != only:
            continue
        tile = {f: cfg[f] for f in GEMM_FIELDS}
        entry = {"config": name, "swept": tma_form_is_right(cfg)}
        with tuning.registration("stack_compensated", key, tile):
            ref = run_stack(shape, x)
            try:
                with tuning.registration("stack_compensated_tma", key, cfg):
                    got = run_stack(shape, x)
            except Exception as exc:                  # noqa: BLE001 - a refusal is a result here
                why = build_reason(exc) or resource_reason(exc)
                entry["not_built" if why else "error"] = why or f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                yield entry
                continue
        entry["tma_launches"] = got["log"].get("level3:tma", 0)
        entry.update(compare(ref, got, cfg["BLOCK_M"], rows))
        yield entry


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edges", type=int, default=4099)
    p.add_argument("--focus", type=int, default=2)
    p.add_argument("--focus-dim", type=int, default=32)
    p.add_argument("--lmax", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--no-alpha", action="store_true")
    p.add_argument("--quick", action="store_true", help="the quick sweep's forms only (default: every form, those the tuner never sweeps included)")
    p.add_argument("--one", metavar="LABEL", help="one candidate by its label, e.g. 'M64 N64 w4 s3'")
    p.add_argument("--rows", type=int, default=6, help="wrong edge rows listed per output")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="a JSON-lines file of the results")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    shape = BenchShape("probe", args.edges, args.focus, args.focus_dim, args.lmax, args.layers, not args.no_alpha)
    import triton
    if args.device != "cpu":
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=args.device))
    lines = []
    for entry in probe(shape, torch.device(args.device), quick=args.quick, only=args.one, rows=args.rows):
        line = json.dumps(entry)
        print(line, flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.one and not lines:
        print(f"no candidate labelled {args.one!r} at this key", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
