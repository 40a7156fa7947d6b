"""Diagnostics of rotate-in at the bench model's frame shape: its forward and backward (the radial
network's last layer as a ``LinearRadial``, every gradient the frame takes) timed per launch
config of the edge kernels, and the backward's operators and kernels by device time.

    PYTHONPATH=. python3 scripts/conv_probe.py --cell diamond --atoms 4400 --configs 16x4,16x2 --out DIR
    ncu ... python3 scripts/conv_probe.py --ncu-run          # one forward + backward, shipped config

A config ``BxW`` sets ``conv_config``'s ``linear_block`` (edges per program) and
``linear_warps`` for this process.  Writes ``conv_probe.json`` and ``conv_probe.md`` (times,
spread, and whether every config gives the shipped config's bits) and ``kernels-backward.txt``.
A probe, not a bench: ``mixstack bench model`` measures frames.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell
from mixstack.bench.stack_bench import exact_fp32
from mixstack.conv import functional as conv
from mixstack.conv import launchers as conv_launchers
from mixstack.conv.layout import LinearRadial
from mixstack.dispatch.levels import use_level
from mixstack.measure.timing import Task, clock_for, time_interleaved
from mixstack.potential import SO2Potential
from mixstack.potential.neighbors import atoms_inputs
from mixstack.tuning import configs


@contextlib.contextmanager
def launch_config(block: int | None, warps: int | None):
    """``conv_config`` with ``linear_block`` / ``linear_warps`` replaced (``None``: as shipped)."""
    shipped = configs.conv_config

    def patched(layout):
        cfg = shipped(layout)
        return {**cfg, **({"linear_block": block} if block else {}), **({"linear_warps": warps} if warps else {})}
    conv_launchers.conv_config = patched
    try:
        yield
    finally:
        conv_launchers.conv_config = shipped


def frame_inputs(cell: str, atoms: int, device):
    """Block 0's rotate-in inputs on a real cell: node features, Wigner rows, the radial layer,
    the edge scalar and the envelope, each a leaf that wants its gradient, as in a force frame."""
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device=device).eval().requires_grad_(False)
    inp = atoms_inputs(build_cell(cell, atoms), model.cutoff, device=device)
    src, dst = inp.edge_index
    vec = inp.positions[src] - inp.positions[dst] + inp.shifts @ inp.cell
    r = torch.linalg.vector_norm(vec, dim=-1)
    block = model.blocks[0]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((inp.positions.shape[0], (model.lmax + 1) ** 2, model.focus_dim), device=device, generator=gen)
    with use_level(3):
        wigner = conv.edge_wigner(vec, model.lmax)
        rbf, env = model.radial_terms(r)
        radial, h, _ = block.edge_weights_split(x, src, dst, rbf)
    leaves = [t.detach().requires_grad_(True) for t in (x, wigner, radial.hidden, h, env)]
    layer = (radial.weight, radial.bias)
    n_focus = radial.weight.shape[0]
    grad_u = torch.randn((n_focus, src.shape[0], (3 * model.lmax + 1) * model.focus_dim), device=device,
                         generator=gen)
    return leaves, layer, src, grad_u


def forward(leaves, layer, src):
    x, wigner, hidden, h, env = leaves
    with use_level(3):
        return conv.rotate_in(x, wigner, LinearRadial(hidden, *layer), src, edge_scalar=h, edge_weight=env)


def backward(u, leaves, grad_u):
    return torch.autograd.grad(u, leaves, grad_u)


def parse_configs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        b, w = item.lower().split("x")
        out.append((int(b), int(w)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cell", default="diamond")
    p.add_argument("--atoms", type=int, default=4400)
    p.add_argument("--configs", default="16x4,16x2,32x8,64x8")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default="conv-probe")
    p.add_argument("--device", default="cuda", help="cpu with TRITON_INTERPRET=1: a smoke run")
    p.add_argument("--ncu-run", action="store_true", help="one warm-up and one forward + backward, shipped config")
    args = p.parse_args()
    device = torch.device(args.device)
    with exact_fp32():
        leaves, layer, src, grad_u = frame_inputs(args.cell, args.atoms, device)
        if args.ncu_run:
            for _ in range(2):
                backward(forward(leaves, layer, src), leaves, grad_u)
            return
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cfgs = parse_configs(args.configs)
        results, tasks = {}, {}
        for b, w in cfgs:
            name = f"{b}x{w}"
            try:
                with launch_config(b, w):
                    u = forward(leaves, layer, src)
                    grads = backward(u, leaves, grad_u)
                results[name] = {"u": u.detach(), "grads": [g.detach() for g in grads]}
            except Exception as exc:                                  # recorded; the others still run
                results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
                continue

            def fwd(b=b, w=w):
                with launch_config(b, w):
                    return forward(leaves, layer, src)

            def setup(b=b, w=w):
                with launch_config(b, w):
                    return forward(leaves, layer, src)

            def bwd(u, b=b, w=w):
                with launch_config(b, w):
                    return backward(u, leaves, grad_u)
            tasks[f"fwd {name}"] = Task(run=fwd)
            tasks[f"bwd {name}"] = Task(run=bwd, setup=setup)
        samples = time_interleaved(tasks, rounds=args.rounds, warmup=2, clock=clock_for(device))
        ref = results[f"{cfgs[0][0]}x{cfgs[0][1]}"]
        rows = []
        for name, res in results.items():
            row = {"config": name, "failed": res.get("failed")}
            if "u" in res and "u" in ref:
                row["bitwise_equal_to_first"] = bool(torch.equal(res["u"], ref["u"])) and all(
                    torch.equal(a, b) for a, b in zip(res["grads"], ref["grads"]))
            for pass_ in ("fwd", "bwd"):
                s = samples.get(f"{pass_} {name}")
                row[pass_] = None if s is None else s.to_dict()
            rows.append(row)
        (out / "conv_probe.json").write_text(json.dumps({"cell": args.cell, "atoms": args.atoms,
                                                         "edges": int(src.shape[0]), "rows": rows}, indent=1))
        lines = [f"# rotate-in at {args.cell}, {int(src.shape[0])} edges (ms, median [p20-p80])\n",
                 "| config | forward | backward | bits = first |", "|---|---:|---:|---|"]
        for row in rows:
            cell = [("failed" if row[k] is None else
                     f"{row[k]['median_ms']:.3f} [{row[k]['p20_ms']:.3f}-{row[k]['p80_ms']:.3f}]") for k in ("fwd", "bwd")]
            lines.append(f"| {row['config']} | {cell[0]} | {cell[1]} | {row.get('bitwise_equal_to_first', row['failed'])} |")
        (out / "conv_probe.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        u = forward(leaves, layer, src)
        cuda = device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            backward(u, leaves, grad_u)
            if cuda:
                torch.cuda.synchronize()
        (out / "kernels-backward.txt").write_text(prof.key_averages().table(
            sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=25, max_name_column_width=80))


if __name__ == "__main__":
    main()
