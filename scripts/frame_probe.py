"""Diagnostics of one energy + forces frame of the bench model: the kernels that take the device
time, and what is alive at the frame's peak memory.

    PYTHONPATH=. python3 scripts/frame_probe.py --cell diamond --atoms 4400 --levels 3,2 --out DIR

Per level it writes ``kernels-L<level>.txt`` (the profiler's operators and kernels by self
device time, one frame) and ``memory-L<level>.txt`` (the allocations alive at the peak of one
frame, largest first, each with the Python frames that made it; from
``torch.cuda.memory._record_memory_history``).  A probe, not a bench: the bench model measures
frames; this says where inside one the time and the memory go.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch

from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell, frame_fn
from mixstack.potential import SO2Potential
from mixstack.potential.neighbors import atoms_inputs


def kernel_table(frame, inp, rows: int = 45) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        frame(inp)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=90)


def _frames(entry, depth: int = 6, where=("mixstack", "torch/autograd")) -> str:
    keep = [f for f in entry.get("frames", []) if any(w in f["filename"] for w in where)]
    return " <- ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in keep[:depth])


def peak_report(frame, inp, rows: int = 30, where=("mixstack", "torch/autograd")) -> str:
    """The allocations of one ``frame(inp)`` alive together at its peak, grouped by the Python
    frames (from files whose path holds one of ``where``) that made them, largest first."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    frame(inp)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snap["device_traces"] for e in trace]
    live: dict = {}
    now = peak = 0
    peak_live: dict = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > peak:
                peak, peak_live = now, dict(live)
        elif e["action"] in ("free_completed",):
            old = live.pop(e["addr"], None)
            if old is not None:
                now -= old["size"]
    lines = [f"allocated before the frame: {base / 2**20:.0f} MiB; peak above it (allocations in the "
             f"frame alive together): {peak / 2**20:.0f} MiB; torch peak: "
             f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", ""]
    groups: dict = collections.defaultdict(lambda: [0, 0])
    for e in peak_live.values():
        key = _frames(e, where=where)
        groups[key][0] += e["size"]
        groups[key][1] += 1
    for key, (size, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"{size / 2**20:9.0f} MiB  x{n:<3d} {key}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="diamond")
    p.add_argument("--atoms", type=int, default=4400)
    p.add_argument("--levels", default="3,2")
    p.add_argument("--out", default="probe")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = SO2Potential(**DEFAULT_MODEL, device="cuda").eval()
    inp = atoms_inputs(build_cell(args.cell, args.atoms), model.cutoff, device="cuda")
    for level in args.levels.split(","):
        frame = frame_fn(level, model)
        for _ in range(3):
            frame(inp)
        (out / f"kernels-L{level}.txt").write_text(kernel_table(frame, inp))
        (out / f"memory-L{level}.txt").write_text(peak_report(frame, inp))
        print(f"== L{level}\n" + (out / f"memory-L{level}.txt").read_text()[:3000])


if __name__ == "__main__":
    main()
