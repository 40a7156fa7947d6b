"""The pieces of ``scripts/deepmd_lammps.sh``: deepmd-kit's production route for a SeZM (DPA4)
model (``dp --pt freeze`` or ``dp --pt-expt freeze`` to an AOTInductor ``.pt2``, deepmd-kit's
``DeepPot``, LAMMPS's ``pair_style deepmd``), plain and with mixstack's plugin (``MIXSTACK_DEEPMD=1``).

    python3 scripts/deepmd_lammps.py data --atoms 96 --rcut 4 --blocks 1 --out DIR
    python3 scripts/deepmd_lammps.py perturb model.ckpt.pt model.pt [--backend pt|pt_expt]
    python3 scripts/deepmd_lammps.py inspect plain.pt2 accel.pt2 --json kernels.json
    python3 scripts/deepmd_lammps.py deeppot MODEL --frame DIR/frame.npz --out RESULT.npz [--profile TXT]
    python3 scripts/deepmd_lammps.py eager model.pt --frame DIR/frame.npz --out RESULT.npz   (a PT-expt checkpoint)
    python3 scripts/deepmd_lammps.py lammps-input MODEL --data DIR/water.lmp --steps 20 --out DIR/in.lammps
    python3 scripts/deepmd_lammps.py lammps-read LOG DUMP --frame DIR/frame.npz --out RESULT.npz
    python3 scripts/deepmd_lammps.py compare --ref NAME=RESULT.npz NAME=RESULT.npz ... [--md]

``deeppot`` imports deepmd-kit through ``mixstack.deepmd.compat`` and then mixstack's plugin
module (the entry point, also where mixstack is not installed but on ``PYTHONPATH``): it
accelerates what deepmd-kit builds only with ``MIXSTACK_DEEPMD=1``.  ``eager`` is the PT-expt
checkpoint's own eager model (deepmd-kit's ``DeepPot`` reads a ``.pt`` file with its PT backend,
which does not load a PT-expt state dict), accelerated the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import zipfile

import numpy as np

NKTV2P = 1.6021765e6            # LAMMPS metal units: eV/Å^3 -> bar
MASSES = {"O": 15.999, "H": 1.008}


# -- data and checkpoint -------------------------------------------------------------------------

def cmd_data(args) -> int:
    """Training data (two water frames, random labels), dp's input.json (1 training step), the
    comparison frame (frame.npz) and the same frame as a LAMMPS data file (water.lmp)."""
    from mixstack.deepmd import systems
    from mixstack.deepmd.configs import model_config

    out = args.out
    data = os.path.join(out, "data")
    os.makedirs(os.path.join(data, "set.000"), exist_ok=True)
    frames = [systems.water(args.atoms, seed=i) for i in range(2)]
    coord, atype, box = (t.numpy().astype(np.float64) if t.is_floating_point() else t.numpy() for t in frames[0])
    nat = coord.shape[1]
    np.savetxt(os.path.join(data, "type.raw"), atype.reshape(-1), fmt="%d")
    with open(os.path.join(data, "type_map.raw"), "w") as f:
        f.write("O\nH\n")
    gen = np.random.default_rng(0)
    np.save(os.path.join(data, "set.000", "coord.npy"), np.stack([f[0].reshape(-1).numpy() for f in frames]))
    np.save(os.path.join(data, "set.000", "box.npy"), np.stack([f[2].reshape(-1).numpy() for f in frames]))
    np.save(os.path.join(data, "set.000", "energy.npy"), gen.normal(size=2))
    np.save(os.path.join(data, "set.000", "force.npy"), gen.normal(size=(2, nat * 3)))
    config = {"model": model_config(args.config, rcut=args.rcut, n_blocks=args.blocks),
              "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-4, "decay_steps": 10},
              "loss": {"type": "ener", "start_pref_e": 1, "limit_pref_e": 1, "start_pref_f": 1, "limit_pref_f": 1},
              "training": {"training_data": {"systems": [os.path.abspath(data)], "batch_size": 1},
                           "numb_steps": 1, "save_freq": 1, "disp_freq": 1, "save_dir": "ckpt", "seed": 1}}
    with open(os.path.join(out, "input.json"), "w") as f:
        json.dump(config, f, indent=1)
    # the comparison frame, wrapped into the box (LAMMPS wraps on read; the energy is the same)
    side = np.diag(box.reshape(3, 3))
    pos = np.mod(coord.reshape(-1, 3), side)
    np.savez(os.path.join(out, "frame.npz"), coord=pos.reshape(1, -1), box=box.reshape(1, 9),
             atype=atype.reshape(-1), type_map=np.array(["O", "H"]))
    with open(os.path.join(out, "water.lmp"), "w") as f:
        f.write(f"water, {nat} atoms (mixstack.deepmd.systems.water seed 0)\n\n{nat} atoms\n2 atom types\n\n")
        for lo, name in zip(side, "xyz"):
            f.write(f"0.0 {lo:.10f} {name}lo {name}hi\n")
        f.write(f"\nMasses\n\n1 {MASSES['O']}\n2 {MASSES['H']}\n\nAtoms # atomic\n\n")
        for i, (t, p) in enumerate(zip(atype.reshape(-1), pos)):
            f.write(f"{i + 1} {t + 1} {p[0]:.12f} {p[1]:.12f} {p[2]:.12f}\n")
    print(f"{nat} atoms of water in a {side[0]:.2f} Å box; config {args.config}, rcut {args.rcut}, "
          f"{args.blocks} block(s) -> {out}")
    return 0


def _checkpoint_model(state: dict, backend: str):
    """A checkpoint's model and its ``ModelWrapper`` (the state dict loaded), for deepmd-kit's PT
    backend or its PT-expt one (``dp --pt-expt train``'s checkpoints: their own model classes)."""
    from mixstack.deepmd.compat import deepmd_pt

    deepmd_pt()
    if backend == "pt_expt":
        from deepmd.pt_expt.model.get_model import get_model
        from deepmd.pt_expt.train.wrapper import ModelWrapper
    else:
        from deepmd.pt.model.model import get_model
        from deepmd.pt.train.wrapper import ModelWrapper
    params = state["_extra_state"]["model_params"]
    model = get_model(params)
    wrapper = ModelWrapper(model, model_params=params) if backend == "pt" else ModelWrapper(model)
    wrapper.load_state_dict(state)
    return model, wrapper


def cmd_perturb(args) -> int:
    """A trained-for-one-step checkpoint with Gaussian noise on its parameters (its buffers as
    they are): an untrained SeZM model's output layers start at zero, and its convolutions would
    add nothing to the forces.  ``--backend pt_expt``: a ``dp --pt-expt train`` checkpoint."""
    import torch

    from mixstack.deepmd.configs import perturb

    raw = torch.load(args.src, map_location="cpu", weights_only=args.backend == "pt_expt")
    inner = raw["model"]
    model, wrapper = _checkpoint_model(inner, args.backend)
    perturb(model, seed=args.seed, scale=args.scale)
    # on the host like the checkpoint it came from (deepmd-kit builds the model on its DEVICE, a GPU there)
    state = {k: v.cpu() if torch.is_tensor(v) else v for k, v in wrapper.state_dict().items()}
    changed = sum(1 for k, v in state.items() if torch.is_tensor(v) and not torch.equal(v, inner[k]))
    raw["model"] = state
    torch.save(raw, args.dst)
    print(f"{args.dst}: {changed} tensors perturbed (scale {args.scale}; {args.backend} checkpoint)")
    return 0


# -- what a .pt2 holds --------------------------------------------------------------------------

def _deepmd_kernel_names() -> frozenset[str]:
    """deepmd-kit's own Triton kernels (``deepmd.kernels.triton``), by name."""
    import importlib
    import pkgutil

    from mixstack.packages import jit_function_names

    try:
        import deepmd.kernels.triton as root
    except Exception:
        return frozenset()
    names = set()
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
        try:
            module = importlib.import_module(info.name)
        except Exception:
            continue
        names |= jit_function_names(module)
    return frozenset(names)


def _archive(path: str, label: str, deepmd_names) -> dict:
    """One archive's kernels (``mixstack.packages.package_kernels``, deepmd-kit's by name too), its
    C++ kernels, where its generated sources name mixstack, and its bytes by suffix."""
    from mixstack.packages import package_kernels

    found = package_kernels(path, names=deepmd_names)
    sizes, mentions, cpp_kernels = {}, {}, set()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.is_dir() or info.filename.endswith(".pt2"):       # a nested package: read on its own
                continue
            ext = os.path.splitext(info.filename)[1] or info.filename.rsplit("/", 1)[-1]
            sizes[ext] = sizes.get(ext, 0) + info.file_size
            if info.filename.endswith((".cpp", ".so")):
                data = archive.read(info)
                cpp_kernels |= set(re.findall(rb"cpp_fused_\w+", data))
                n = data.count(b"mixstack") if info.filename.endswith(".cpp") else 0
                if n:
                    mentions[info.filename] = n
    return {"archive": label, "files": found.members, "device": found.metadata.get("AOTI_DEVICE_KEY", "?"),
            "mixstack_kernels": sorted(found.mixstack), "mixstack_in_sources_only": sorted(found.sources),
            "deepmd_kernels": sorted(found.named), "inductor_triton_kernels": len(found.inductor),
            "inductor_cpp_kernels": len(cpp_kernels), "mixstack_mentions": mentions,
            "bytes_by_suffix": dict(sorted(sizes.items(), key=lambda kv: -kv[1]))}


def inspect_pt2(path: str) -> dict:
    """The main archive and deepmd-kit's nested with-comm archive (the multi-rank LAMMPS graph)."""
    deepmd_names = _deepmd_kernel_names()
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        nested = [n for n in names if n.endswith(".pt2")]
        extra = {n: archive.read(n).decode(errors="replace") for n in names if n.endswith("metadata.json")
                 and n.startswith("model/extra/")}
        parts = [_archive(path, "main", deepmd_names)]
        for name in nested:
            with tempfile.TemporaryDirectory() as tmp:
                inner = os.path.join(tmp, "inner.pt2")
                with open(inner, "wb") as f:
                    f.write(archive.read(name))
                parts.append(_archive(inner, name, deepmd_names))
    meta = json.loads(next(iter(extra.values()))) if extra else {}
    return {"path": path, "bytes": os.path.getsize(path), "members": len(names), "parts": parts,
            "metadata_keys": sorted(meta)}


def cmd_inspect(args) -> int:
    records = []
    for path in args.pt2:
        rec = inspect_pt2(path)
        records.append(rec)
        print(f"{path}: {rec['bytes'] / 2**20:.1f} MiB, {rec['members']} members")
        for part in rec["parts"]:
            print(f"  [{part['archive']}] {part['files']} files, built for {part['device']}; "
                  f"mixstack kernels {len(part['mixstack_kernels'])} {part['mixstack_kernels'] or ''}; "
                  f"deepmd-kit kernels {len(part['deepmd_kernels'])} {part['deepmd_kernels'] or ''}; "
                  f"Inductor Triton kernels {part['inductor_triton_kernels']}, C++ kernels "
                  f"{part['inductor_cpp_kernels']}")
            if part["mixstack_in_sources_only"]:
                print(f"    mixstack kernels named in the C++ but in no binary: {part['mixstack_in_sources_only']}")
            print(f"    'mixstack' in the generated sources: "
                  f"{sum(part['mixstack_mentions'].values())} times {list(part['mixstack_mentions']) or ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


# -- deepmd-kit's DeepPot ------------------------------------------------------------------------

def cmd_deeppot(args) -> int:
    """Energy, forces and virial of one frame by deepmd-kit's ``DeepPot`` (``.pt`` checkpoint:
    deepmd-kit's PyTorch backend, accelerated with ``MIXSTACK_DEEPMD=1``; ``.pt2``: its pt_expt
    backend, AOTInductor's loader), and the time of ``--repeats`` further calls."""
    import logging

    from mixstack.deepmd.compat import deepmd_pt

    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("deepmd.mixstack").setLevel(logging.INFO)       # the plugin's report
    deepmd_pt()
    from deepmd.infer import DeepPot

    import mixstack.deepmd.plugin  # noqa: F401  (the entry point, also where mixstack is not installed)

    frame = np.load(args.frame)
    t0 = time.perf_counter()
    dp = DeepPot(args.model)
    load_s = time.perf_counter() - t0
    atype = frame["atype"].tolist()
    call = lambda: dp.eval(frame["coord"], frame["box"], atype, atomic=False)[:3]    # noqa: E731
    ret, first_s, times = _timed(call, args.repeats)
    _save_frame(args, "DeepPot", *(np.asarray(x) for x in ret), load_s, first_s, times)
    if args.profile:
        _profile(call, args.profile, args.repeats)
    return 0


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _profile(call, path: str, frames: int, rows: int = 40) -> None:
    """``frames`` calls under ``torch.profiler`` into ``path``: the wall time a frame, the device's
    busy time a frame (``breakdown.kernel_time``, the bench's: its kernels' and copies' durations;
    the rest of the wall time is the host's), and the kernels by device time."""
    import torch

    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(frames):
            call()
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / frames
    from mixstack.bench.breakdown import kernel_time
    from mixstack.bench.deepmd_ranges import kernel_split

    events = prof.events()
    busy = kernel_time(events) / 1e3 / frames
    launches = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events) // max(frames, 1)
    split = kernel_split(events)
    # the host waits for the device at each of these: where the package's graph reads a size or a value
    syncs = [e for e in events if e.name in SYNC_CALLS]
    copies_back = sum(e.name.startswith("Memcpy DtoH") for e in events)
    head = (f"{frames} frame(s) under the profiler: wall {1e3 * wall:.1f} ms a frame, device busy {busy:.1f} ms "
            f"a frame ({launches} device events a frame), host-only {max(1e3 * wall - busy, 0):.1f} ms; "
            f"kernels by name (ms a frame): " + ", ".join(f"{k} {v / 1e3 / frames:.2f}" for k, v in split.items())
            + f"; host waits {len(syncs) / frames:.1f} a frame ({sum(e.cpu_time_total for e in syncs) / 1e3 / frames:.1f}"
            f" ms), device-to-host copies {copies_back / frames:.1f} a frame")
    with open(path, "w") as f:
        f.write(head + "\n\n" + prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows,
                                                          max_name_column_width=90) + "\n")
    print(f"profile: {head} ({path})")


def _timed(call, repeats: int):
    """``(the first call's result, its seconds, the seconds of ``repeats`` further calls)``."""
    t0 = time.perf_counter()
    ret = call()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return ret, first_s, times


def _save_frame(args, label: str, e, f, v, load_s: float, first_s: float, times: list) -> None:
    """Energy, forces and virial into ``args.out``, and one line: the energy and the times."""
    np.savez(args.out, energy=e.reshape(-1), force=f.reshape(-1, 3), virial=v.reshape(-1))
    accelerated = os.environ.get("MIXSTACK_DEEPMD", "") not in ("", "0")
    per = f"{1e3 * float(np.median(times)):.1f} ms/frame (median of {len(times)})" if times else ""
    print(f"{label} {args.model}{' (MIXSTACK_DEEPMD=1)' if accelerated else ''}: E = {float(e.reshape(-1)[0]):.8f} eV; "
          f"load {load_s:.1f} s, first call {first_s:.2f} s, {per}")


def cmd_eager(args) -> int:
    """Energy, forces and virial of one frame by a PT-expt checkpoint's own eager model (the
    reference of ``--backend pt_expt``; ``MIXSTACK_DEEPMD=1``: built accelerated, as
    ``dp --pt-expt freeze`` builds it), and the time of ``--repeats`` further calls."""
    import logging

    import torch

    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("deepmd.mixstack").setLevel(logging.INFO)
    from mixstack.deepmd.compat import deepmd_pt

    deepmd_pt()
    from deepmd.pt_expt.utils.env import DEVICE

    import mixstack.deepmd.plugin_expt  # noqa: F401  (the entry point, also where mixstack is not installed)

    frame = np.load(args.frame)
    t0 = time.perf_counter()
    state = torch.load(args.model, map_location=DEVICE, weights_only=True)
    model, _ = _checkpoint_model(state.get("model", state), "pt_expt")
    model = model.to(DEVICE).eval()
    load_s = time.perf_counter() - t0
    coord = torch.tensor(frame["coord"], dtype=torch.float64, device=DEVICE).reshape(1, -1, 3)
    box = torch.tensor(frame["box"], dtype=torch.float64, device=DEVICE).reshape(1, 9)
    atype = torch.tensor(frame["atype"], dtype=torch.int64, device=DEVICE).reshape(1, -1)

    def call():
        out = model(coord, atype, box)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return out

    ret, first_s, times = _timed(call, args.repeats)
    e, f, v = (ret[k].detach().double().cpu().numpy() for k in ("energy", "force", "virial"))
    _save_frame(args, "eager PT-expt", e, f, v, load_s, first_s, times)
    return 0


# -- LAMMPS --------------------------------------------------------------------------------------

def cmd_lammps_input(args) -> int:
    """A LAMMPS input: ``pair_style deepmd MODEL``, the forces dumped at step 0 (``run 0``),
    then ``--steps`` NVE steps at 300 K (``Performance:`` in the log gives steps/s)."""
    text = f"""# deepmd-kit's pair style on {args.model} (scripts/deepmd_lammps.sh)
units           metal
atom_style      atomic
boundary        p p p
atom_modify     map array sort 0 0.0
read_data       {args.data}
pair_style      deepmd {args.model}
pair_coeff      * * O H
neighbor        1.0 bin
compute         vir all pressure NULL virial
thermo_style    custom step pe ke etotal temp c_vir[1] c_vir[2] c_vir[3] c_vir[4] c_vir[5] c_vir[6] vol
thermo_modify   format float %.10g
dump            f0 all custom 1 {args.dump} id type fx fy fz
dump_modify     f0 sort id format float %.12g
run             0
undump          f0
velocity        all create 300.0 12345 mom yes rot yes dist gaussian
fix             nve all nve
timestep        0.0005
thermo          {max(1, args.steps // 2)}
run             {args.steps}
"""
    with open(args.out, "w") as f:
        f.write(text)
    return 0


def cmd_lammps_run(args) -> int:
    """Run a LAMMPS input through the lammps Python module with deepmd-kit's plugin loaded
    (``plugin load``; under mpirun, one process a rank); ``mixstack.lammps`` loads the mpich
    package's ``libmpi.so.12``, which ``liblammps.so`` needs.  ``import torch`` first: deepmd-kit's
    .pt2 backend (``libdeepmd_backend_ptexpt.so``) needs libtorch and has no path to it (its
    ``lmp`` entry point sets ``LD_LIBRARY_PATH`` for a child process instead)."""
    import deepmd.env
    import torch  # noqa: F401

    from mixstack.lammps import import_lammps

    lammps = import_lammps().lammps        # libmpi.so.12 of the mpich package loaded first

    plugin = deepmd.env.SHARED_LIB_DIR / "libdeepmd_lmpplugin.so"
    lmp = lammps(cmdargs=["-log", args.log, "-nocite"])
    try:
        if not lmp.has_style("pair", "deepmd"):   # the lammps package loads LAMMPS_PLUGIN_PATH's itself
            lmp.command(f"plugin load {plugin}")
        lmp.file(args.input)
    finally:
        lmp.close()
    return 0


def _thermo_blocks(log: str):
    """Each thermo block of a LAMMPS log as (header, rows)."""
    blocks, lines = [], log.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].split()[:2] == ["Step", "PotEng"]:
            header, rows = lines[i].split(), []
            i += 1
            while i < len(lines) and lines[i].strip() and lines[i].split()[0].lstrip("-").isdigit():
                rows.append([float(x) for x in lines[i].split()])
                i += 1
            blocks.append((header, rows))
        i += 1
    return blocks


def cmd_lammps_read(args) -> int:
    """Step-0 energy, forces and virial of a LAMMPS run (the ``lammps-input`` layout) as a result
    file, and its steps/s from the ``Performance:`` line."""
    with open(args.log) as f:
        log = f.read()
    blocks = _thermo_blocks(log)
    if not blocks:
        raise SystemExit(f"{args.log}: no thermo output")
    header, rows = blocks[0]
    row = dict(zip(header, rows[0]))
    vol = row["Volume"]
    # the virial part of the pressure (bar) back to deepmd-kit's virial (eV): W = P V / nktv2p,
    # in deepmd-kit's order xx xy xz yx yy yz zx zy zz
    p = [row[f"c_vir[{i}]"] for i in range(1, 7)]
    w = [x * vol / NKTV2P for x in p]
    virial = np.array([w[0], w[3], w[4], w[3], w[1], w[5], w[4], w[5], w[2]])
    with open(args.dump) as f:
        lines = f.read().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("ITEM: ATOMS"))) + 1
    force = np.array([[float(x) for x in line.split()[2:5]] for line in lines[start:]])
    perf = re.findall(r"Performance:.*?([0-9.]+) timesteps/s", log)
    tasks = re.findall(r"CPU use with (\d+) MPI tasks x (\d+) OpenMP threads", log)
    result = {"energy": np.array([row["PotEng"]]), "force": force, "virial": virial}
    steps_s = float(perf[-1]) if perf else float("nan")
    np.savez(args.out, **result, steps_per_s=np.array([steps_s]))
    if blocks[1:] and len(blocks[-1][1]) > 1:
        e = [r[header.index("TotEng")] for r in blocks[-1][1]]
        drift = f"; NVE total energy {e[0]:.6f} -> {e[-1]:.6f} eV"
    else:
        drift = ""
    ranks = f"{tasks[-1][0]} rank(s) x {tasks[-1][1]} OpenMP thread(s)" if tasks else "? ranks"
    print(f"LAMMPS {args.log}: E0 = {row['PotEng']:.8f} eV, {steps_s:.3f} steps/s on {ranks}{drift}")
    return 0


# -- comparison ----------------------------------------------------------------------------------

def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = float(np.abs(a - b).max()) if a.size else float("nan")
    scale = float(np.abs(b).max()) if b.size else 0.0
    return d, d / scale if scale > 0 else float("nan")


def cmd_compare(args) -> int:
    """Max abs and relative (to the reference's largest value) differences of energy, forces and
    virial against ``--ref``; a markdown table on stdout and in ``--md``."""
    def load(spec):
        name, path = spec.split("=", 1)
        return name, dict(np.load(path))

    ref_name, ref = load(args.ref)
    rows = [f"| result | vs {ref_name}: energy abs / rel | forces max abs / rel | virial max abs / rel | steps/s |",
            "|---|---|---|---|---|"]
    worst = 0.0
    for spec in args.results:
        name, res = load(spec)
        cells = []
        for key in ("energy", "force", "virial"):
            if key not in res or res[key].shape != ref[key].shape:
                cells.append(f"shape {res.get(key, np.empty(0)).shape} vs {ref[key].shape}")
                continue
            d, r = _diff(res[key].astype(np.float64), ref[key].astype(np.float64))
            worst = max(worst, r if r == r else 0.0)
            cells.append(f"{d:.2e} / {r:.1e}")
        rate = res.get("steps_per_s")
        cells.append(f"{float(rate[0]):.3f}" if rate is not None else "")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(rows)
    print(text)
    if args.md:
        with open(args.md, "a") as f:
            f.write(text + "\n\n")
    if args.tol is not None and worst > args.tol:
        print(f"largest relative difference {worst:.1e} above --tol {args.tol:g}")
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("data")
    s.add_argument("--atoms", type=int, default=96)
    s.add_argument("--rcut", type=float, default=6.0)
    s.add_argument("--blocks", type=int, default=2)
    s.add_argument("--config", default="water")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_data)
    s = sub.add_parser("perturb")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scale", type=float, default=0.05)
    s.add_argument("--backend", choices=("pt", "pt_expt"), default="pt")
    s.set_defaults(fn=cmd_perturb)
    s = sub.add_parser("inspect")
    s.add_argument("pt2", nargs="+")
    s.add_argument("--json")
    s.set_defaults(fn=cmd_inspect)
    for name, fn in (("deeppot", cmd_deeppot), ("eager", cmd_eager)):     # one frame, the same arguments
        s = sub.add_parser(name)
        s.add_argument("model")
        s.add_argument("--frame", required=True)
        s.add_argument("--out", required=True)
        s.add_argument("--repeats", type=int, default=3)
        if name == "deeppot":
            s.add_argument("--profile", metavar="PATH",
                           help="also --repeats frames under torch.profiler: wall and device-busy time, kernels")
        s.set_defaults(fn=fn)
    s = sub.add_parser("lammps-input")
    s.add_argument("model")
    s.add_argument("--data", required=True)
    s.add_argument("--dump", required=True)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_lammps_input)
    s = sub.add_parser("lammps-run")
    s.add_argument("input")
    s.add_argument("--log", required=True)
    s.set_defaults(fn=cmd_lammps_run)
    s = sub.add_parser("lammps-read")
    s.add_argument("log")
    s.add_argument("dump")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_lammps_read)
    s = sub.add_parser("compare")
    s.add_argument("--ref", required=True)
    s.add_argument("results", nargs="+")
    s.add_argument("--md")
    s.add_argument("--tol", type=float)
    s.set_defaults(fn=cmd_compare)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
