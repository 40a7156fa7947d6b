"""What is alive at the peak of one energy + forces frame on the GPU (a probe, not a test).

Runs one bench-model frame per variant (``0c`` and ``2c`` by default) under
``torch.cuda.memory._record_memory_history`` and prints, for each, the peak
of allocated bytes and the largest allocations alive at that moment with the
Python line that made each: where the compiled level-2 frame's extra memory
over the compiled baseline comes from.

    PYTHONPATH=. python scripts/probe_memory.py cu-bcc 4400 [0c 2c]
"""

from __future__ import annotations

import sys

import torch

MiB = 2 ** 20


def live_at_peak(events):
    """``(peak_bytes, [(size, where), ...])``: the allocations alive when the sum of live
    allocations was largest, over a CUDA caching-allocator trace (``alloc`` and
    ``free_completed`` events with ``addr``, ``size`` and ``frames``)."""
    live, total, peak, at_peak = {}, 0, 0, {}
    for ev in events:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _where(ev.get("frames", ())))
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return peak, sorted(at_peak.values(), key=lambda sw: -sw[0])


def _where(frames) -> str:
    """The innermost frame in this project's code (mixstack or a test/script), else the innermost."""
    for f in frames:
        name = f.get("filename", "")
        if "/mixstack/" in name or "/scripts/" in name:
            return f"{name.split('/mixstack/')[-1]}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else "?"


def main(cell="cu-bcc", atoms="4400", *variants):
    from mixstack.bench.model_bench import DEFAULT_MODEL, _frame_fn, build_cell
    from mixstack.bench.runner import exact_fp32
    from mixstack.potential import SO2Potential, atoms_inputs
    dev = torch.device("cuda")
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device=dev).eval()
    inp = atoms_inputs(build_cell(cell, int(atoms), seed=0), model.cutoff, device=dev)
    with exact_fp32():
        for key in variants or ("0c", "2c"):
            frame = _frame_fn(key, model)
            frame(inp)                                   # compile and warm up outside the record
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=200000)
            frame(inp)
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            events = [ev for trace in snap["device_traces"] for ev in trace]
            peak, alive = live_at_peak(events)
            print(f"== {key}: peak of this frame's allocations {peak / MiB:.0f} MiB; largest alive then:")
            for size, where in alive[:25]:
                print(f"  {size / MiB:9.1f} MiB  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
