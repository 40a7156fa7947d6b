"""Where one forward + backward of the stack spends its device time, kernel by kernel, per
variant (the compiled reference ``0c`` and mixstack's levels), at grid keys.

    PYTHONPATH=. python3 scripts/stack_probe.py --key 112,4,1 --key 128,5,1 --variants 0c,1,1b,1bn,3 --out DIR

A BLAS variant with the suffix ``n`` (``1bn``, ``2bn``) runs with every block weight contiguous
(cuBLAS's plain "nn" form) instead of the route's layouts (``stack.blas.TRANSPOSED_BLOCKS``): the
two layouts side by side in one run.

Per key and variant it writes ``kernels-<key>-<variant>.txt`` (the profiler's kernels by
device time over ``--repeats`` fwd+bwd calls after a warm-up) and prints the top kernels and
the totals.  A probe, not a bench: ``mixstack bench grid`` measures the keys; this says where
inside one call the time goes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
from pathlib import Path

import torch

from mixstack.bench import grid, stack_bench
from mixstack.measure.shapes import make_inputs
from mixstack.stack.blas import transposed_blocks

PLAIN = "n"      # suffix of a BLAS variant run with every block weight contiguous


def split_variant(v: str) -> tuple[str, bool]:
    """``(bench variant, plain weights)`` of a probe variant: ``"1bn"`` -> ``("1b", True)``."""
    if v.endswith(PLAIN) and v[:-1] in stack_bench.FORCED_BLAS:
        return v[:-1], True
    if v not in stack_bench.VARIANTS:
        raise ValueError(f"unknown variant {v!r}: use {', '.join(stack_bench.VARIANTS)} or "
                         f"{', '.join(k + PLAIN for k in stack_bench.FORCED_BLAS)}")
    return v, False


def profile(call, repeats: int) -> list[tuple[str, float, int]]:
    """``(kernel, device ms per call, launches per call)``, largest first."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    count = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time_total / 1e3
            count[ev.name] += 1
    return sorted(((n, t / repeats, count[n] // repeats) for n, t in total.items()), key=lambda r: -r[1])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--key", action="append", required=True, help="Cf,lmax,F (repeatable)")
    p.add_argument("--variants", default="0c,1", help=f"comma-separated, of {', '.join(stack_bench.VARIANTS)}; "
                   f"{', '.join(k + PLAIN for k in stack_bench.FORCED_BLAS)}: a BLAS variant with plain weights")
    p.add_argument("--edge-scale", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", default=None)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    cfg = grid.GridConfig(edge_scale=args.edge_scale)
    device = torch.device("cuda")
    for text in args.key:
        cf, lmax, focus = (int(x) for x in text.split(","))
        shape = cfg.shape(cf, lmax, focus)
        inp = make_inputs(shape, device)
        u0, alpha, wrt = stack_bench.differentiable(shape, inp)
        for v in args.variants.split(","):
            base, plain = split_variant(v)
            fwd = stack_bench.forward_fn(base, shape, inp)
            scope = stack_bench._scope(base, shape, device)
            layout = (lambda: transposed_blocks(())) if plain else contextlib.nullcontext

            def call(fwd=fwd, scope=scope, layout=layout):
                with scope(), layout():
                    return torch.autograd.grad(fwd(u0, alpha), wrt, inp.grad_out)
            rows = profile(call, args.repeats)
            tot = sum(r[1] for r in rows)
            print(f"== {shape.name} E={shape.edges} {v}: {tot:.2f} ms device, {sum(r[2] for r in rows)} launches")
            for n, t, c in rows[:args.top]:
                print(f"   {t:8.3f} ms {100 * t / tot:5.1f}% x{c:<3d} {n[:110]}")
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                Path(args.out, f"kernels-{shape.name}-{v}.txt").write_text(
                    "\n".join(f"{t:.4f}\t{c}\t{n}" for n, t, c in rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
