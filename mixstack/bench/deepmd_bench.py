"""deepmd-kit's own levels against the accelerated model, on one device in one run.

``mixstack bench deepmd --atoms 500 2000 4000`` (its options: ``mixstack.cli.bench.deepmd``).  A
frame is deepmd-kit's own forward of a SeZM model: ``model(coord, atype, box)`` in evaluation,
energy, forces and virial (its neighbour list included).  Variants:

* ``dp0``, ``dp2``, ``dp3``: deepmd-kit at ``DP_TRITON_INFER`` 0, 2, 3 (read when a model is
  built, so each variant is its own model with the same weights);
* ``ms2``, ``ms3`` (any ``msN``): ``mixstack.deepmd.accelerate`` at mixstack level N, on a model
  built at ``DP_TRITON_INFER`` ``--rest-level`` (deepmd-kit's kernels for the rest of the model);
* a ``g`` suffix (``dp2g``, ``ms3g``): the frame replayed from a CUDA graph, where it captures
  (deepmd-kit's frame builds its neighbour list and edge index with host synchronisation, so
  the record says why where it does not).

Per case (config x system x size): the median frame time of interleaved rounds in rotating
order after warm-up (``mixstack.bench.timing``, CUDA events), peak memory above the resident
models, and energy, forces and virial against the float64 model (deepmd-kit's path, same
weights); with ``--breakdown``, each variant's device time per stage, forward and backward
(``deepmd_ranges``: the value path apart from the rest); with ``--md-steps N``, each variant's
NVE throughput through deepmd-kit's ASE calculator (``deepmd_md``: steps per second, ns per day,
energy drift; the variants run one after another, not interleaved).  Results:
``deepmd_bench.json``, ``.md`` and ``.csv``.  The models are untrained: weights perturbed
(``configs.perturb``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile

import torch

from ..deepmd import configs, systems
from ..measure import env, report
from ..measure.timing import Task, clock_for, time_interleaved
from . import breakdown, deepmd_md
from .deepmd_ranges import STAGES

SYSTEMS = {"water": (systems.water, ["O", "H"]), "rocksalt": (systems.rocksalt, ["Ni", "O"])}


def parse_variant(key: str) -> tuple[str, int, bool]:
    """``"dp2g"`` -> ``("dp", 2, True)``: who runs the value path, the level, CUDA-graphed."""
    graphed = key.endswith("g")
    body = key[:-1] if graphed else key
    if body[:2] not in ("dp", "ms") or not body[2:].isdigit() or int(body[2:]) > 3:
        raise ValueError(f"variant must be dpN or msN (N in 0..3), optionally with a g suffix, got {key!r}")
    return body[:2], int(body[2:]), graphed


@contextlib.contextmanager
def _dp_triton_infer(level: int):
    saved = os.environ.get("DP_TRITON_INFER")
    os.environ["DP_TRITON_INFER"] = str(level)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DP_TRITON_INFER", None)
        else:
            os.environ["DP_TRITON_INFER"] = saved


def build_variant(key: str, config: dict, state: dict, device, rest_level: int):
    """The model of variant ``key``: ``config`` built at its ``DP_TRITON_INFER``, ``state`` loaded,
    on ``device`` in evaluation (accelerated for ``ms``); returns ``(model, report or None)``."""
    who, level, _ = parse_variant(key)
    with _dp_triton_infer(level if who == "dp" else rest_level):
        model = configs.build_model(config)
    model.load_state_dict(state)
    model = model.to(device).eval()
    if who == "dp":
        return model, None
    from ..deepmd.accelerate import accelerate
    return model, accelerate(model, level=level)


def _frame(model, inputs):
    coord, atype, box = inputs
    return model(coord, atype, box)


def _graphed(model, inputs):
    """A CUDA graph of one frame, or the reason it does not capture."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                _frame(model, inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _frame(model, inputs)
        return (lambda: graph.replay()), out, None
    except Exception as err:                               # the capture's own error is the reason
        torch.cuda.synchronize()
        return None, None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"


def _deviation(out, ref) -> dict:
    dev = {}
    for key in ("energy", "force", "virial"):
        diff = (out[key].detach().double() - ref[key].detach().double()).abs().max().item()
        scale = ref[key].detach().abs().max().item()
        dev[f"{key}_max_abs"], dev[f"{key}_rel"] = diff, diff / scale if scale else None
    return dev


def _peak_memory(fn, device) -> int | None:
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    gc.collect()
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - resident


def _stage_times(model, inputs, device, rounds: int) -> dict:
    from .deepmd_ranges import ranges

    cuda = torch.device(device).type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with ranges(model), torch.profiler.profile(activities=activities) as prof:
        for _ in range(rounds):
            _frame(model, inputs)
            if cuda:
                torch.cuda.synchronize(device)
    times, _, total = breakdown.attribute(prof.events(), "cuda" if cuda else "cpu")
    per = 1e-3 / rounds
    stages = {s: {f"{p}_ms": times.get((s, p), 0.0) * per for p in breakdown.PASSES}
              for s in (*STAGES, breakdown.OTHER)}
    return {"device_time": "CUDA kernel time" if cuda else "CPU time of the operators",
            "busy_ms": total * per, "stages": stages}


def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def md_runs(config: dict, model, frame, type_map, variants, args, device) -> dict:
    """``{variant: md record}``: NVE through deepmd-kit's ASE calculator on ``model``'s weights
    (written as a checkpoint), one variant after another (CUDA-graphed variants left out: the
    calculator runs deepmd-kit's frame)."""
    atoms = deepmd_md.atoms_of(frame, type_map)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        deepmd_md.save_checkpoint(model, config, path)
        for key in variants:
            who, level, graphed = parse_variant(key)
            if graphed:
                continue
            with _dp_triton_infer(level if who == "dp" else args.rest_level):
                calc, acc_report = deepmd_md.load_calculator(path, None if who == "dp" else level)
            record = deepmd_md.md_throughput(calc, atoms, steps=args.md_steps, warmup=args.md_warmup,
                                             dt_fs=args.md_dt, device=device)
            out[key] = {**record, "accelerated": None if acc_report is None else [c.runs_on for c in acc_report]}
            del calc
            _free(device)
    return out


def run_case(config_name: str, system: str, atoms: int, variants, args, device) -> dict:
    """One config on one system size: every variant timed, its memory and accuracy."""
    make_frame, type_map = SYSTEMS[system]
    config = configs.model_config(config_name, type_map=type_map, **({"rcut": args.rcut} if args.rcut else {}))
    with _dp_triton_infer(0):
        base = configs.perturb(configs.build_model(config), seed=args.seed)
    state = base.state_dict()
    ref_model = configs.build_model(configs.model_config(config_name, type_map=type_map, precision="float64",
                                                         **({"rcut": args.rcut} if args.rcut else {})))
    ref_model.load_state_dict(state)
    coord, atype, box = make_frame(atoms, seed=args.seed)
    inputs64 = tuple(None if t is None else t.to(device) for t in (coord, atype, box))
    ref = {k: v.detach() for k, v in _frame(ref_model.to(device).eval(), inputs64).items()
           if k in ("energy", "force", "virial")}
    del ref_model, inputs64
    _free(device)                                          # the float64 frame's memory, before the variants
    inputs = (coord.float().to(device), atype.to(device), None if box is None else box.float().to(device))
    record = {"config": config_name, "system": system, "atoms": int(atype.numel()), "variants": {}}
    tasks, models = {}, {}
    for key in variants:
        model, acc_report = build_variant(key, config, state, device, args.rest_level)
        entry = {"accelerated": None if acc_report is None else [c.runs_on for c in acc_report]}
        run = lambda m=model: _frame(m, inputs)                # noqa: E731
        if parse_variant(key)[2]:
            if torch.device(device).type != "cuda":
                entry["not_run"] = "CUDA graphs need a CUDA device"
                record["variants"][key] = entry
                continue
            run, out, why = _graphed(model, inputs)
            if run is None:
                entry["not_run"] = why
                record["variants"][key] = entry
                continue
        out = _frame(model, inputs)
        entry["accuracy"] = _deviation(out, ref)
        entry["peak_memory_bytes"] = _peak_memory(run, device)
        tasks[key], models[key] = Task(run=run), model
        record["variants"][key] = entry
    if tasks:
        samples = time_interleaved(tasks, rounds=args.rounds, warmup=args.warmup, clock=clock_for(device))
        for key, s in samples.items():
            record["variants"][key]["time"] = s.to_dict()
    if args.breakdown:
        for key, model in models.items():
            if not parse_variant(key)[2]:
                record["variants"][key]["breakdown"] = _stage_times(model, inputs, device, args.breakdown_rounds)
    if args.md_steps > 0:
        tasks = models = model = run = out = None           # noqa: F841  (the timed models' memory, before MD)
        _free(device)
        for key, md in md_runs(config, base, (coord, atype, box), type_map, variants, args, device).items():
            record["variants"][key]["md"] = md
    return record


def _stage_sum(stages, names) -> float | None:
    return None if not stages else sum(stages[s]["forward_ms"] + stages[s]["backward_ms"] for s in names)


def _stage_rows(record: dict) -> list[str]:
    """Where each variant's device time goes: the value path (Wigner rows to aggregation) apart
    from the rest of the convolution and of the model, forward / backward."""
    lines = ["", "Device time per stage (ms a frame, forward / backward; `deepmd_ranges`):", "",
             "| config | system | atoms | variant | wigner | value path | rest of convolution | rest of model |",
             "|" + "---|" * 8]
    for case in record["cases"]:
        for key, v in case["variants"].items():
            stages = v.get("breakdown", {}).get("stages")
            if not stages:
                continue
            cells = [f"{stages[s]['forward_ms']:.2f} / {stages[s]['backward_ms']:.2f}"
                     for s in (*STAGES, breakdown.OTHER)]
            lines.append("| " + " | ".join([case["config"], case["system"], str(case["atoms"]), key, *cells]) + " |")
    return lines if len(lines) > 5 else []


def markdown(record: dict) -> str:
    lines = ["# deepmd-kit SeZM: deepmd-kit's levels against mixstack", ""]
    lines += [f"- {line}" for line in report.header_lines(record)] + [""]
    lines += ["| config | system | atoms | variant | median ms | p20-p80 ms | peak MiB | force max abs | "
              "energy rel | Wigner to aggregation, fwd+bwd ms | rest, fwd+bwd ms | MD steps/s | MD ns/day |",
              "|" + "---|" * 13]
    for case in record["cases"]:
        for key, v in case["variants"].items():
            t = v.get("time")
            acc = v.get("accuracy", {})
            stages = v.get("breakdown", {}).get("stages")
            md = v.get("md", {})
            peak = v.get("peak_memory_bytes")
            cells = [case["config"], case["system"], str(case["atoms"]), key,
                     v.get("not_run", "—") if t is None else f"{t['median_ms']:.2f}",
                     "—" if t is None else f"{t['p20_ms']:.2f}-{t['p80_ms']:.2f}",
                     report.fmt(None if peak is None else peak / 2 ** 20, ".0f"),
                     report.fmt(acc.get("force_max_abs")), report.fmt(acc.get("energy_rel")),
                     report.fmt(_stage_sum(stages, ("wigner", "value_path")), ".2f"),
                     report.fmt(_stage_sum(stages, ("convolution", breakdown.OTHER)), ".2f"),
                     report.fmt(md.get("steps_per_s"), ".2f"), report.fmt(md.get("ns_per_day"), ".3f")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + _stage_rows(record)) + "\n"


def long_rows(record: dict) -> list[dict]:
    rows = []
    cols = report.env_columns(record)
    for case in record["cases"]:
        for key, v in case["variants"].items():
            row = {"config": case["config"], "system": case["system"], "atoms": case["atoms"], "variant": key,
                   "median_ms": v.get("time", {}).get("median_ms"), "peak_memory_bytes": v.get("peak_memory_bytes"),
                   **{k: val for k, val in v.get("accuracy", {}).items()}, "not_run": v.get("not_run"), **cols}
            for stage, t in v.get("breakdown", {}).get("stages", {}).items():
                row[f"{stage}_forward_ms"], row[f"{stage}_backward_ms"] = t["forward_ms"], t["backward_ms"]
            for field in ("steps_per_s", "ns_per_day", "drift_mev_atom_ps"):
                row[f"md_{field}"] = v.get("md", {}).get(field)
            rows.append(row)
    return rows


def run_deepmd_bench(args, device, *, command: str, on_case=None) -> dict:
    """Every config x system x size of the parsed ``mixstack bench deepmd`` options ``args`` on
    ``device``: the record (``on_case(label)`` before each case)."""
    from ..deepmd.compat import deepmd_pt

    deepmd_pt()
    import deepmd
    record = {"env": {**env.collect(device), "deepmd_kit": deepmd.__version__}, "command": command,
              "rest_level": args.rest_level, "rounds": args.rounds, "warmup": args.warmup, "cases": []}
    for config_name in args.configs:
        for system in args.systems:
            for atoms in args.atoms:
                if on_case:
                    on_case(f"{config_name} / {system} / {atoms} atoms")
                record["cases"].append(run_case(config_name, system, atoms, args.variants, args, device))
    return record


def write(record: dict, out, *, with_plot: bool = False) -> dict:
    """``deepmd_bench.json``, ``.md`` and ``.csv`` in ``out`` (the bench draws no plot)."""
    return report.write(record, out, with_plot=with_plot, names=("deepmd_bench.json", "deepmd_bench.md", ""),
                        render_markdown=markdown, render_rows=long_rows)
