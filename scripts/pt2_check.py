"""Frozen potentials on a GPU: freeze at levels 1-3, read each package's kernels, then load it and
compare it with the live module, each load in a process of its own (a loader that crashes takes
only that process), plainly and with the C++ compiler's ``libstdc++`` preloaded.

    python scripts/pt2_check.py --out DIR [--levels 1,2,3] [--atoms 128]

Writes ``DIR/pt2_check.json`` and prints one line per level: the mixstack kernels in the
package, each load's exit, and where a load ran, the frozen program's time per call against
the live module's and the largest relative difference of energy, forces and stress.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def _model_and_inputs(atoms: int, device: str, seed: int = 3):
    from ase.build import bulk

    from mixstack.potential import SO2Potential, atoms_inputs

    model = SO2Potential(lmax=2, focus_dim=32, n_focus=2, cutoff=4.0, seed=seed, energy_scale=10.0,
                         device=device).eval()
    reps = max(1, round((atoms / 2) ** (1 / 3)))
    structure = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((reps, reps, reps))
    structure.rattle(0.05, seed=seed)
    return model, atoms_inputs(structure, model.cutoff, device=device)


def load_and_compare(path: str, level: int, atoms: int, device: str) -> None:
    """In this process: load ``path``, run it beside the live module at ``level``; one JSON line."""
    import faulthandler

    faulthandler.enable()
    import mixstack
    from mixstack.measure.timing import time_interleaved

    model, inputs = _model_and_inputs(atoms, device)
    frozen = mixstack.load(path)

    def live():
        with mixstack.use_level(level):
            return model(*inputs)

    want, got = live(), frozen(*inputs)
    diffs = {name: float((g.double() - w.double()).norm() / max(w.double().norm(), 1e-30))
             for name, g, w in zip(("energy", "forces", "stress"), got[:3], want[:3])}
    samples = time_interleaved({"live": live, "frozen": lambda: frozen(*inputs)}, rounds=20, warmup=3,
                               device=inputs[0].device)
    print(json.dumps({"loaded": True, "rel_diff": diffs, "frozen_ms": 1e3 * samples["frozen"].median,
                      "live_ms": 1e3 * samples["live"].median}), flush=True)


def _compiler_libstdcxx() -> str | None:
    from torch._inductor.cpp_builder import get_cpp_compiler

    out = subprocess.run([get_cpp_compiler(), "-print-file-name=libstdc++.so.6"], capture_output=True, text=True)
    path = os.path.realpath(out.stdout.strip())
    return path if os.path.isfile(path) else None


def _load_in_child(path: str, level: int, atoms: int, device: str, preload: str | None) -> dict:
    env = dict(os.environ, **({"LD_PRELOAD": preload} if preload else {}))
    try:
        proc = subprocess.run([sys.executable, __file__, "--load", path, "--levels", str(level),
                               "--atoms", str(atoms), "--device", device], capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "preload": preload}
    rc = proc.returncode
    record = {"exit": f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}", "preload": preload}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record.update(json.loads(line))
    if rc:
        record["tail"] = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="pt2-check")
    p.add_argument("--levels", default="1,2,3")
    p.add_argument("--atoms", type=int, default=128)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script without a GPU")
    p.add_argument("--load", help=argparse.SUPPRESS)          # the child: load this package
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if args.load:
        load_and_compare(args.load, levels[0], args.atoms, args.device)
        return 0
    import mixstack
    from mixstack.packages import package_kernels

    os.makedirs(args.out, exist_ok=True)
    preload = _compiler_libstdcxx()
    records = []
    for level in levels:
        model, inputs = _model_and_inputs(args.atoms, args.device)
        path = os.path.join(args.out, f"potential-level{level}.pt2")
        start = time.perf_counter()
        with mixstack.use_level(level):
            mixstack.freeze(model, inputs, path, progress=None)
        found = package_kernels(path)
        record = {"level": level, "freeze_s": round(time.perf_counter() - start, 1),
                  "mixstack_kernels": sorted(found.mixstack), "inductor_kernels": len(found.inductor),
                  "loads": [_load_in_child(path, level, args.atoms, args.device, None)]}
        if not record["loads"][0].get("loaded") and preload:
            record["loads"].append(_load_in_child(path, level, args.atoms, args.device, preload))
        records.append(record)
        loads = ", ".join(f"{r['exit']}{' (LD_PRELOAD)' if r['preload'] else ''}"
                          + (f": {r['frozen_ms']:.2f} ms vs live {r['live_ms']:.2f} ms, forces {r['rel_diff']['forces']:.1e}"
                             if r.get("loaded") else "") for r in record["loads"])
        print(f"level {level}: froze in {record['freeze_s']} s; {len(found.mixstack)} mixstack kernels "
              f"({', '.join(sorted(found.mixstack))}); load: {loads}", flush=True)
        with open(os.path.join(args.out, "pt2_check.json"), "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
