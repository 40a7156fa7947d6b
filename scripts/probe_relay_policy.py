"""The relay's sigmoid fold in the whole backward (a GPU probe, not a test).

``launch.pointwise_recomputes_gate`` decides per layout and level whether the
pointwise kernel forms the gate sigmoids itself or reads a surface a gate launch
wrote; ``probe_backward.py`` measured that one layer at a time.  This times the
whole backward (``launch.stack_backward``, every layer, the shipped GEMM configs)
both ways in one run, interleaved, at the standard shapes, exact and level 3, and
checks the two give the same bits.

    PYTHONPATH=. python scripts/probe_relay_policy.py --out policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from unittest import mock

import torch

from mixstack import launch, tuning
from mixstack.bench import timing
from mixstack.bench.shapes import STANDARD, make_inputs
from mixstack.layout import StackLayout


def probe_shape(shape, rounds, dev):
    inp = make_inputs(shape, dev, seed=0)
    layout = StackLayout(lmax=shape.lmax, focus_dim=shape.focus_dim)
    key = dict(focus_dim=shape.focus_dim, lmax=shape.lmax, n_focus=shape.focus, apply_alpha=True, device=dev)
    tasks, grads = {}, {}
    for level, compensated, family in (("exact", False, "stack_bwd_relay"), ("L3", True, "stack_compensated")):
        cfg = tuning.tuned_config(family, **key)
        out, z, y = launch.stack_forward(inp.u0, inp.alpha, inp.w0, inp.w1, inp.gw, layout, True, cfg,
                                         compensated=compensated)
        grad_out = torch.randn_like(out)
        for fold in (False, True):
            def run(_=None, fold=fold, cfg=cfg, compensated=compensated, z=z, y=y, grad_out=grad_out):
                with mock.patch.object(launch, "pointwise_recomputes_gate", lambda *a, **k: fold):
                    return launch.stack_backward(grad_out, y, z, inp.alpha, inp.w0, inp.w1, inp.gw, layout,
                                                 True, gemm_cfg=cfg, compensated=compensated)
            tag = f"{level} {'fold' if fold else 'surface'}"
            tasks[tag] = timing.Task(run=run)
            grads[tag] = run()[0]
    same = {level: bool(torch.equal(grads[f"{level} fold"], grads[f"{level} surface"])) for level in ("exact", "L3")}
    res = timing.time_interleaved(tasks, rounds=rounds, warmup=2, clock=timing.clock_for(dev))
    times = {tag: s.to_dict() for tag, s in res.items()}
    return {"times": times, "same_bits": same,
            "policy": {lvl: launch.pointwise_recomputes_gate(layout, c) for lvl, c in (("exact", False), ("L3", True))}}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--shape", action="append", choices=sorted(STANDARD))
    ap.add_argument("--edges", type=int, help="override the edge count (a smoke run under the interpreter)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    for name in args.shape or ["S1", "S2", "S3", "S4"]:
        shape = STANDARD[name]
        if args.edges:
            shape = type(shape)(name, args.edges, shape.focus, shape.focus_dim, shape.lmax, shape.layers)
        results[name] = r = probe_shape(shape, args.rounds, dev)
        print(f"== {name}  same bits {r['same_bits']}  shipped policy (fold) {r['policy']}", flush=True)
        for tag, t in r["times"].items():
            print(f"  {tag:14s} {t['median_ms']:8.3f} ms  [{t['p20_ms']:.3f}, {t['p80_ms']:.3f}]")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
