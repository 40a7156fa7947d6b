"""Where one deepmd-kit SeZM frame's device time goes, per bench variant: the kernels by self
device time of one frame (a ``g`` variant's graph replays), the memory it holds, and the frame's median time.

    PYTHONPATH=. python3 scripts/deepmd_probe.py --config water --atoms 4000 --variants ms3cg,dp2cg --out DIR

A probe, not a bench (``mixstack bench deepmd`` measures): it says which kernels make a variant
slow.  Writes ``kernels-<variant>.txt`` (a ``g`` variant's: its graph's replay) under ``--out``,
and for a ``g`` variant ``memory-<variant>.txt``: the allocator's pools (the graph's own) and the
same frame run eagerly, its allocations alive at its peak by where they were made.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from frame_probe import kernel_table, peak_report

from mixstack.bench import deepmd_bench as db
from mixstack.deepmd import systems
from mixstack.deepmd.frame import FrameRunner
from mixstack.measure.timing import clock_for, time_interleaved


def pools() -> str:
    """The caching allocator's reservation per memory pool: the default pool's and each CUDA
    graph's private pool (a graph's replays reuse all of its pool)."""
    sizes: dict = {}
    for seg in torch.cuda.memory._snapshot()["segments"]:
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        name = "default pool" if pool == (0, 0) else f"graph pool {pool}"
        reserved, used = sizes.get(name, (0, 0))
        sizes[name] = (reserved + seg["total_size"], used + seg["allocated_size"])
    return "\n".join(f"{name}: {r / 2**20:.0f} MiB reserved, {u / 2**20:.0f} MiB of it allocated"
                     for name, (r, u) in sizes.items())


def eager_peak(key: str, model, runner, inputs) -> str:
    """The same frame on a runner that runs it eagerly (the compiled graph too, where the variant
    has one): its allocations alive together at its peak, by where they were made."""
    eager = FrameRunner(model, skin=runner.skin, graph=False, compile=db.parse_variant(key).compiled)
    eager(*inputs)
    return "the same frame eagerly:\n" + peak_report(lambda _: eager(*inputs), None,
                                                      where=("mixstack", "deepmd", "torchinductor"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="water")
    p.add_argument("--atoms", type=int, default=4000)
    p.add_argument("--variants", default="ms3cg")
    p.add_argument("--rest-level", type=int, default=2)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    frame = systems.water(a.atoms, seed=0)
    type_map = ["O", "H"]
    args = argparse.Namespace(rcut=None, seed=0, skin=1.0)
    case = {"config": a.config}
    config, _base, state, ref = db._reference(case, type_map, frame, args, dev)
    inputs = tuple(None if t is None else t.to(dev) for t in frame)
    tasks = {}
    for key in a.variants.split(","):
        t0 = time.time()
        try:
            base = db._reserved(dev)
            model, _report = db.build_variant(key, config, state, dev, a.rest_level)
            runner, run = db._first_frame(key, model, inputs, args, [])
            out_now = run()
            held = db._reserved(dev) - base
            peak, _ = db._frame_memory(run, dev)
            err = (out_now["force"].double() - ref["force"].double()).abs().max().item()
            print(f"{key}: built + first frame {time.time() - t0:.1f} s, force max abs {err:.2e}, "
                  f"{held / 2**20:.0f} MiB reserved after it, a frame's peak {peak / 2**20:.0f} MiB above that" + (f", graph fallback: {runner.fallback_reason}"
                                                                  if runner is not None and runner.fallback_reason else ""),
                  flush=True)
            if runner is not None and runner.captures:
                (out / f"memory-{key}.txt").write_text(pools() + "\n\n" + eager_peak(key, model, runner, inputs))
                print((out / f"memory-{key}.txt").read_text()[:2500], flush=True)
            table = kernel_table(lambda _: run(), None)
            (out / f"kernels-{key}.txt").write_text(table)
            print("\n".join(table.splitlines()[:22]), flush=True)
            tasks[key] = run
        except Exception as err:                           # one variant that fails leaves the others
            print(f"{key}: FAILED {type(err).__name__}: {str(err)[:2000]}", flush=True)
    for key, r in time_interleaved(tasks, rounds=5, warmup=1, clock=clock_for(dev)).items():
        print(f"{key}: median {1e3 * r.median:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
