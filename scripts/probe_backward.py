"""Where the backward's time goes, one gated layer at a time (a GPU probe, not a test).

For each shape key: the relay's three launches alone and together, the same
relay at level 3 (the GEMM on the key's shipped ``stack_compensated`` config,
``gz``'s row maxima recorded by the pointwise kernel, the gate's logits and
logit contraction on split products), whole and launch by launch, beside the
exact one, the relay whose pointwise kernel forms the sigmoids itself (``fold``: no
gate launch, no sigmoid surface; bitwise against the relay), and the fused kernel per config, whole, each segment alone and with the
compensated GEMM phase (``--no-fused``: skipped); then the compiled
kernels' registers, spills and shared memory.  (The gate-phase-alone and
GEMM-phase-alone timings in BENCHMARKS.md came from a profiling switch the
kernel had at git 6d88a52; it was taken out again so that the shipped H200
table entry, keyed by the kernel sources' hash, stays valid.)  Times come from the one timing loop (``bench.timing``), interleaved
in rotating order; ``h`` is restored from a pristine copy before every sample
(untimed).  Writes JSON to ``--out``, prints a table.

    PYTHONPATH=. python scripts/probe_backward.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from mixstack import launch, tuning
from mixstack.bench import timing
from mixstack.bench.shapes import BenchShape, make_inputs
from mixstack.kernels.fused import fused_backward_kernel
from mixstack.kernels.gate import gate_backward_kernel, gate_kernel
from mixstack.kernels.gemm import block_gemm_kernel
from mixstack.layout import StackLayout

KEYS = {  # name: (edges, F, Cf, lmax)
    "cf32_l3_f2": (2 ** 18, 2, 32, 3),
    "cf32_l6_f2": (2 ** 17 + 2 ** 16, 2, 32, 6),
    "cf64_l3_f1": (2 ** 18, 1, 64, 3),
    # the tuner's sets at Cf 64, lmax 1 and 2 (where 64 rows x 4 warps made ptxas collapse
    # the pointwise kernel and the forward gate, ``launch.gate_config``)
    "cf64_l1_f2": (2 ** 18, 2, 64, 1),
    "cf64_l2_f2": (187245, 2, 64, 2),
}
PW_BEFORE = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 1}
FUSED = {"cf32_l3_f2": [(32, 128, 4, 2), (32, 64, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2)],
         "cf32_l6_f2": [(32, 128, 4, 2), (64, 64, 4, 2)],
         "cf64_l3_f1": [(32, 128, 4, 2), (64, 64, 4, 2)]}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def kernel_resources():
    out = []
    for fn in (fused_backward_kernel, gate_kernel, gate_backward_kernel, block_gemm_kernel):
        for caches in getattr(fn, "device_caches", {}).values():
            for key, k in caches[0].items():
                md = k.metadata
                out.append({"kernel": fn.__name__, "regs": k.n_regs, "spills": k.n_spills,
                            "shared": getattr(md, "shared", None), "warps": getattr(md, "num_warps", None),
                            "stages": getattr(md, "num_stages", None), "key": str(key)[-300:]})
    return out


def probe_key(name, edges, n_focus, cf, lmax, rounds, fused_variants=True):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # cpu: TRITON_INTERPRET=1
    shape = BenchShape(name, edges, n_focus, cf, lmax, 4, True)
    inp = make_inputs(shape, dev, seed=0)
    layout = StackLayout(lmax=lmax, focus_dim=cf)
    _, z, _ = launch.stack_forward(inp.u0, inp.alpha, inp.w0, inp.w1, inp.gw, layout, True)
    h0 = torch.randn(n_focus, edges, layout.row, device=dev)
    h = torch.empty_like(h0)
    w0t = inp.w0.transpose(-1, -2).contiguous()
    w1t = inp.w1.transpose(-1, -2).contiguous()
    sg = h.new_empty((n_focus, edges, layout.gate_width))
    gz = torch.empty_like(h)
    layer = z.shape[0] - 1

    def restore():
        h.copy_(h0)

    def relay(steps, fold=False, pw=None):
        return lambda _=None: launch._relay_layer(h, z, inp.gw, w0t, w1t, layer, edges, n_focus, layout,
                                                  None, sg, gz, steps=steps, fold=fold, pointwise_cfg=pw)

    variants = {"relay": relay((0, 1, 2)), "relay.gate": relay((0,)), "relay.pointwise": relay((1,)),
                "relay.gemm": relay((2,))}
    # the pointwise kernel forming the sigmoids itself (no gate launch, no sigmoid surface),
    # at its default rows and at the other row count
    def other_rows(cfg):
        return dict(cfg, BLOCK_M=64 if cfg["BLOCK_M"] == 32 else 32)
    pw_other = other_rows(launch.pointwise_config(layout))
    variants["relay fold"] = relay((1, 2), fold=True)
    variants["relay.pointwise fold"] = relay((1,), fold=True)
    variants[f"relay.pointwise fold M{pw_other['BLOCK_M']}"] = relay((1,), fold=True, pw=pw_other)
    # the pointwise kernel at the config every Cf-64 key had before ``launch.gate_config``
    # steered lmax <= 2 away from ptxas's collapse (same bits: a launch config, not the math)
    variants["relay M64 w4"] = relay((0, 1, 2), pw=PW_BEFORE)
    variants["relay.pointwise M64 w4"] = relay((1,), pw=PW_BEFORE)
    comp_cfg = tuning.tuned_config("stack_compensated", focus_dim=cf, lmax=lmax, n_focus=n_focus,
                                   apply_alpha=True, device=dev)
    split = launch.split_weights(w0t, w1t)
    gate_split = launch.split_matrices(inp.gw)

    amax = h.new_empty((n_focus, edges, 2))      # gz's row maxima, recorded by the pointwise kernel

    def relay3(steps, fold=False, pw=None):
        return lambda _=None: launch._relay_layer(h, z, inp.gw, w0t, w1t, layer, edges, n_focus, layout,
                                                  comp_cfg, sg, gz, steps=steps, split=split, amax=amax,
                                                  gate_split=gate_split, fold=fold, pointwise_cfg=pw)
    variants["relay L3"] = relay3((0, 1, 2))
    variants["relay.gate L3"] = relay3((0,))
    variants["relay.pointwise L3"] = relay3((1,))
    variants["relay.gemm L3"] = relay3((2,))
    variants["relay fold L3"] = relay3((1, 2), fold=True)
    variants["relay.pointwise fold L3"] = relay3((1,), fold=True)
    variants[f"relay.pointwise fold M{pw_other['BLOCK_M']} L3"] = relay3((1,), fold=True, pw=pw_other)
    variants["relay.pointwise M64 w4 L3"] = relay3((1,), pw=PW_BEFORE)
    # the whole forward (every layer) for scale: exact, and level 3
    fwd_args = (inp.u0, inp.alpha, inp.w0, inp.w1, inp.gw, layout, True)
    variants["forward, all layers"] = lambda _=None: launch.stack_forward(*fwd_args)
    variants["forward L3, all layers"] = lambda _=None: launch.stack_forward(*fwd_args, comp_cfg, compensated=True)
    scratches = {}
    for bm, bn, w, s in FUSED.get(name, ()) if fused_variants else ():
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
        tag = f"fused M{bm} N{bn} w{w} s{s}"
        programs = launch._fused_programs(h, (edges + bm - 1) // bm * n_focus)
        scratch = scratches.setdefault(bm, h.new_empty((programs, bm, max(layout.m0, layout.m1))))

        def fused(segments=(0, 1), cfg=cfg, scratch=scratch, split=None):
            return lambda _=None: launch._fused_layer(h, z, inp.gw, w0t, w1t, layer, edges, n_focus, layout,
                                                      cfg, scratch, segments=segments, split=split)
        variants[tag] = fused()
        variants[tag + " L3"] = fused(split=split)
        variants[tag + " .seg0"] = fused(segments=(0,))
        variants[tag + " .seg1"] = fused(segments=(1,))

    # bitwise check of the full fused layer against the relay
    restore(); variants["relay"](); sync(); ref = h.clone()
    restore(); variants["relay L3"](); sync(); ref3 = h.clone()
    equal = {}      # exact fused: bitwise against the relay; level 3: relative difference to the L3 relay
    # another schedule (fold) or launch config (M64 w4) of the same math: the same bits
    for tag, want in (("relay fold", ref), ("relay fold L3", ref3), ("relay M64 w4", ref)):
        restore(); variants[tag](); sync()
        equal[tag] = bool(torch.equal(h, want))
    for tag in variants:
        if tag.startswith("fused") and "." not in tag.split()[-1]:
            restore(); variants[tag](); sync()
            if tag.endswith(" L3"):
                equal[tag] = f"rel diff {((h - ref3).norm() / ref3.norm()).item():.1e}"
            else:
                equal[tag] = bool(torch.equal(h, ref))
    tasks = {tag: timing.Task(run=fn, setup=restore) for tag, fn in variants.items()}
    res = timing.time_interleaved(tasks, rounds=rounds, warmup=2, clock=timing.clock_for(dev))
    rows = {tag: s.to_dict() for tag, s in res.items()}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"edges": edges, "F": n_focus, "Cf": cf, "lmax": lmax, "compensated_config": comp_cfg,
            "times": rows, "bitwise": equal}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--key", action="append", choices=sorted(KEYS))
    ap.add_argument("--edges", type=int, help="override the edge count (a smoke run under the interpreter)")
    ap.add_argument("--no-fused", action="store_true", help="time the relay variants only")
    args = ap.parse_args(argv)
    results = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "keys": {}}
    for name in args.key or list(KEYS):
        edges, n_focus, cf, lmax = KEYS[name]
        results["keys"][name] = probe_key(name, args.edges or edges, n_focus, cf, lmax, rounds=args.rounds,
                                          fused_variants=not args.no_fused)
        print(f"== {name}", flush=True)
        for tag, r in results["keys"][name]["times"].items():
            eq = results["keys"][name]["bitwise"].get(tag, "")
            print(f"  {tag:32s} {r['median_ms']:8.3f} ms  [{r['p20_ms']:.3f}, {r['p80_ms']:.3f}] {eq}")
    results["resources"] = kernel_resources()
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    print("== resources")
    for r in results["resources"]:
        print(f"  {r['kernel']:24s} regs {r['regs']:4d} spills {r['spills']:5d} smem {r['shared']} "
              f"w{r['warps']} s{r['stages']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
