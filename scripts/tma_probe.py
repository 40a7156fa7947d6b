"""Level 3's TMA block GEMM against the pointer kernel, one GEMM use at a time, on a GPU.

For each use of the block GEMM in the stack (the forward's m = 0 block storing z; the |m| = 1
block with gate, residual and row maxima; the identity layer over both blocks; the relay's
in-place update ``h += gz @ W^T`` with ``res`` and ``out`` the same surface; the same update
written to another surface) it runs the pointer kernel and each TMA form on the same inputs and
reports non-finite values, mismatching rows and the largest difference; ``--time`` adds
interleaved CUDA-event medians of each GEMM at ``--time-edges`` edges; ``--one FORM:USE`` runs a
single launch (for compute-sanitizer).

    python scripts/tma_probe.py [--edges 4099] [--time] [--one tma:inplace]
"""

from __future__ import annotations

import argparse
import sys

import torch

from mixstack.core.layout import StackLayout
from mixstack.measure.timing import clock_for, time_interleaved
from mixstack.stack import launchers as L
from mixstack.stack.gemm import BlockWeights, Epilogue, Operand, block_gemm

TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
FORMS = {
    "pointer": dict(TILE),
    "tma": dict(TILE, TMA=True, persistent=False, specialised=False),
    "tma_ws": dict(TILE, TMA=True, persistent=False, specialised=True),
    "tma_persistent": dict(TILE, TMA=True, persistent=True, specialised=False),
    "tma_persistent_ws": dict(TILE, TMA=True, persistent=True, specialised=True),
}
USES = ("fwd_block0", "fwd_block1_gate", "identity", "inplace", "outofplace")


def inputs(layout, n_focus, n_edges, n_layers=4, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)   # noqa: E731
    a = r(n_focus, n_edges, layout.row)
    gz = r(n_focus, n_edges, layout.row)
    w0 = r(n_layers, n_focus, layout.m0, layout.m0) / layout.m0 ** 0.5
    w1 = r(n_layers, n_focus, layout.m1, layout.m1) / layout.m1 ** 0.5
    sg = torch.sigmoid(r(n_focus, n_edges, layout.gate_width))
    alpha = torch.softmax(r(n_edges, n_focus), -1)
    return a, gz, w0, w1, sg, alpha


def prepare(use, cfg, layout, data):
    """One GEMM use with ``cfg``: ``(launch, surfaces it writes)``, the surfaces allocated here."""
    a, gz, w0, w1, sg, alpha = data
    F, E, row = a.shape
    split = L.split_weights(w0, w1)
    nan = float("nan")
    if use == "fwd_block0":
        z = torch.full((3, F, E, row), nan, device="cuda")
        return (lambda: block_gemm(Operand(a), BlockWeights(w0, w1, 0, layout, (0,), split), Epilogue(z=z), cfg),
                {"z": z[0, :, :, : layout.m0]})
    if use == "fwd_block1_gate":
        z = torch.full((3, F, E, row), nan, device="cuda")
        out = torch.full_like(a, nan)
        amax = torch.zeros(F, E, 2, device="cuda")
        return (lambda: block_gemm(Operand(a), BlockWeights(w0, w1, 0, layout, (1,), split),
                                   Epilogue(z=z, sg=sg, res=a, out=out, amax_out=amax), cfg),
                {"z": z[0, :, :, layout.m0:], "out": out[:, :, layout.m0:], "amax": amax[..., 1]})
    if use == "identity":
        out = torch.full((E, F, row), nan, device="cuda")
        y = torch.full((E, F, row), nan, device="cuda")
        return (lambda: block_gemm(Operand(a), BlockWeights(w0, w1, 3, layout, split=split),
                                   Epilogue(res=a, out=out, y=y, alpha=alpha, alpha_on_out=True, out_edge_major=True),
                                   cfg),
                {"out": out, "y": y})
    if use == "inplace":
        h = a.clone()
        return (lambda: block_gemm(Operand(gz), BlockWeights(w0, w1, 1, layout, split=split), Epilogue(res=h, out=h),
                                   cfg),
                {"h": h})
    if use == "outofplace":
        h = torch.full_like(a, nan)
        return (lambda: block_gemm(Operand(gz), BlockWeights(w0, w1, 1, layout, split=split), Epilogue(res=a, out=h),
                                   cfg),
                {"h": h})
    raise ValueError(f"use must be one of {USES}, got {use!r}")


def run(use, cfg, layout, data):
    launch, surfaces = prepare(use, cfg, layout, data)
    launch()
    torch.cuda.synchronize()
    return surfaces


def compare(ref, got):
    lines = []
    for name in ref:
        r, g = ref[name], got[name]
        bad = ~torch.isfinite(g)
        rows = (r != g).reshape(-1, r.shape[-1]).any(-1) if r.dim() > 1 else (r != g)
        diff = (r - g).abs().nan_to_num(float("inf")).max().item() if g.numel() else 0.0
        lines.append(f"{name}: non-finite {int(bad.sum())}/{g.numel()}, rows differing {int(rows.sum())}/"
                     f"{rows.numel()}, max |diff| {diff:.3g}, bitwise {bool(torch.equal(r, g))}")
    return "; ".join(lines)


def median_ms(fns, repeats=20):
    """Interleaved CUDA-event medians of each callable in ms, rotating the order every round."""
    samples = time_interleaved(fns, rounds=repeats, warmup=1, clock=clock_for("cuda"))
    return {n: got.median * 1e3 for n, got in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edges", type=int, default=4099)
    p.add_argument("--focus", type=int, default=2)
    p.add_argument("--focus-dim", type=int, default=32)
    p.add_argument("--lmax", type=int, default=3)
    p.add_argument("--one", help="FORM:USE, a single launch (for compute-sanitizer)")
    p.add_argument("--time", action="store_true")
    p.add_argument("--time-edges", type=int, default=300003)
    args = p.parse_args(argv)
    layout = StackLayout(args.lmax, args.focus_dim)
    data = inputs(layout, args.focus, args.edges)
    if args.one:
        form, use = args.one.split(":")
        got = run(use, FORMS[form], layout, data)
        torch.cuda.synchronize()
        print(args.one, {k: int((~torch.isfinite(v)).sum()) for k, v in got.items()})
        return 0
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "E", args.edges)
    for use in USES:
        ref = run(use, FORMS["pointer"], layout, data)
        for form in [f for f in FORMS if f != "pointer"]:
            try:
                got = run(use, FORMS[form], layout, data)
                torch.cuda.synchronize()
                print(f"{use:16s} {form:15s} {compare(ref, got)}")
            except Exception as exc:        # noqa: BLE001 - a probe reports every failure and goes on
                print(f"{use:16s} {form:15s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
    if args.time:
        data = inputs(layout, args.focus, args.time_edges)
        for use in ("fwd_block0", "fwd_block1_gate", "identity", "outofplace"):
            fns = {form: prepare(use, FORMS[form], layout, data)[0] for form in FORMS}
            t = median_ms(fns)
            k2 = {"fwd_block0": layout.m0 ** 2, "fwd_block1_gate": layout.m1 ** 2}.get(use, layout.m0 ** 2 + layout.m1 ** 2)
            flops = 3 * 2 * args.focus * args.time_edges * k2          # three fp16 products per GEMM
            print(f"time {use:16s} " + "  ".join(f"{k} {v:.3f} ms ({flops / v / 1e9:.0f} TFLOP/s fp16)"
                                                 for k, v in t.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
