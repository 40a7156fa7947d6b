"""What a recapture for grown capacities costs ``FrameRunner``, into the kept pool or a new one:
the host time before the capture begins (``before_s``: a new pool's release and block), the whole
capture's, and the device memory the caching allocator holds after it against before.

    PYTHONPATH=. python3 scripts/recapture_pool_probe.py [--config water] [--atoms 240] [--scale 0.997]

One accelerated deepmd-kit model (``mixstack.deepmd.configs``, perturbed, float32, level 3) and
``systems.water``; per pool room (``frame.POOL_ROOM``; ``--rooms 1.03,1.0``: the default, whose
first growth goes into the kept pool, and a room that no growth fits, so that every recapture
takes a new pool of the scaled peak) a fresh runner captures the frame, then the frame with its
coordinates and box scaled by ``--scale`` (more edges than the capacity: a recapture at grown
capacities).  One JSON line a room.  A probe, not a bench: one recapture each, no medians.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="water", help="mixstack.deepmd.configs name (default water)")
    p.add_argument("--atoms", type=int, default=240, help="atoms of systems.water (default 240)")
    p.add_argument("--rcut", type=float, default=6.0, help="the model's cutoff, Å (default 6)")
    p.add_argument("--scale", type=float, default=0.997,
                   help="the second frame's coordinates and box over the first's (default 0.997: ~1%% more edges)")
    p.add_argument("--rooms", default="1.03,1.0", help="frame.POOL_ROOM values, comma-separated (default 1.03,1.0)")
    return p


def rooms(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--rooms takes numbers separated by commas, got {text!r}") from None
    if not out or min(out) < 1.0:
        raise SystemExit(f"--rooms must hold values of at least 1.0, got {text!r}")
    return out


def probe(model, frame, scale: float, room: float) -> dict:
    """One fresh runner at ``room``: the first frame, then the scaled one; its recapture's record."""
    from mixstack.deepmd import FrameRunner
    from mixstack.deepmd import frame as frame_mod
    frame_mod.POOL_ROOM = room
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    runner = FrameRunner(model)
    coord, atype, box = (t.to("cuda") for t in frame)
    runner(coord, atype, box)
    torch.cuda.synchronize()
    before, first = torch.cuda.memory_reserved(), runner._capacities()
    runner(coord * scale, atype, box * scale)
    torch.cuda.synchronize()
    event = runner.events[-1]
    return {"room": room, "pool": event.get("pool"), "captures": runner.captures, "before_s": event["before_s"],
            "capture_s": event["seconds"], "capacities": [list(first), list(runner._capacities())],
            "measured_peak_mib": round(runner._peak[0] / 2 ** 20, 1),
            "reserved_before_mib": round(before / 2 ** 20, 1),
            "reserved_growth_mib": round((torch.cuda.memory_reserved() - before) / 2 ** 20, 1)}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    values = rooms(args.rooms)
    if not 0 < args.scale < 1:
        raise SystemExit(f"--scale must be in (0, 1) (a denser frame), got {args.scale}")
    if not torch.cuda.is_available():
        raise SystemExit("recapture_pool_probe needs a CUDA GPU: FrameRunner captures graphs only there")
    from mixstack.deepmd import accelerate, systems
    from mixstack.deepmd.configs import build_model, perturb
    model = perturb(build_model(args.config, precision="float32", rcut=args.rcut)).eval().to("cuda")
    accelerate(model, level=3)
    frame = systems.water(args.atoms, seed=6, dtype=torch.float32)
    for room in values:
        print(json.dumps(probe(model, frame, args.scale, room)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
