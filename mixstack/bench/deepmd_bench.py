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

A case runs in steps (``Progress``): the float64 reference frame; each variant built with its
first frame (Triton's compiles and autotuning land here), then its peak memory; the timing; each
breakdown; each MD run.  Each step is said as it ends (``on_step``, with its seconds) and the
record is written as each starts and ends (``on_write``), so a run cut off leaves what it
finished and the step it was in; with a time budget (``--seconds``) no step starts once it is
spent, and what was left says why (``not_run``, ``steps_not_run``).  Nothing here prints.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time

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


class Progress:
    """A run's steps and its time budget.  ``step(label)`` times a step: the record is written
    (``on_write(record)``) as it starts, naming it (``record["running"]``: a run cut off leaves
    the step it was in on disk), and as it ends, when ``on_step(text)`` says its seconds; a step
    that raises is named in ``record["failed"]``, written, and the error goes on.  With
    ``seconds``, no step starts once that many have gone from ``start`` (a ``clock`` reading,
    default now): ``out_of_time`` says why, and ``record["stopped"]`` too."""

    def __init__(self, record: dict, *, seconds: float | None = None, start: float | None = None,
                 on_step=None, on_write=None, clock=time.monotonic):
        self.record, self.seconds, self.clock = record, seconds, clock
        self.start = clock() if start is None else start
        self.on_step = on_step or (lambda _text: None)
        self.on_write = on_write or (lambda _record: None)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def out_of_time(self) -> str | None:
        """Why no step may start now, or ``None`` while the budget lasts."""
        if self.seconds is None or self.elapsed() < self.seconds:
            return None
        return self.record.setdefault("stopped", f"out of time (--seconds {self.seconds:g})")

    @contextlib.contextmanager
    def step(self, label: str):
        """Time the body as step ``label``; it yields a list the body adds notes to (said after the time)."""
        notes: list[str] = []
        self.record["running"] = {"step": label, "from_s": round(self.elapsed(), 1)}
        self.on_write(self.record)
        t0 = self.clock()
        try:
            yield notes
        except BaseException as err:
            del self.record["running"]
            first = str(err).splitlines()[0][:200] if str(err) else ""
            self.record["failed"] = {"step": label, "error": f"{type(err).__name__}: {first}".rstrip(": ")}
            self.on_write(self.record)
            raise
        del self.record["running"]
        self.on_step(f"{label}: {self.clock() - t0:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""))
        self.on_write(self.record)


# A variant's fields a step fills, as the tables and "not run" notes name them.
STEP_NAMES = {"peak_memory_bytes": "peak memory", "time": "timing", "breakdown": "breakdown", "md": "MD"}


def _mark(entries, field: str, why: str) -> None:
    for entry in entries:
        entry.setdefault("steps_not_run", {})[field] = why


def _step(progress: Progress, label: str, entry: dict, field: str, fn, say=None) -> bool:
    """``entry[field] = fn()`` as step ``label`` (``say(value)`` its note), or, out of time,
    why not in ``entry["steps_not_run"][field]``; whether it ran."""
    why = progress.out_of_time()
    if why:
        _mark([entry], field, why)
        return False
    with progress.step(label) as notes:
        entry[field] = fn()
        if say:
            notes.append(say(entry[field]))
    return True


def _md_one(path, key: str, atoms, args, device) -> dict:
    who, level, _ = parse_variant(key)
    with _dp_triton_infer(level if who == "dp" else args.rest_level):
        calc, acc_report = deepmd_md.load_calculator(path, None if who == "dp" else level)
    record = deepmd_md.md_throughput(calc, atoms, steps=args.md_steps, warmup=args.md_warmup,
                                     dt_fs=args.md_dt, device=device)
    return {**record, "accelerated": None if acc_report is None else [c.runs_on for c in acc_report]}


def md_runs(config: dict, model, frame, type_map, case: dict, args, device, progress: Progress) -> None:
    """Each variant's ``md`` in ``case``: NVE through deepmd-kit's ASE calculator on ``model``'s
    weights (written as a checkpoint), one variant after another, a step each (CUDA-graphed
    variants left out: the calculator runs deepmd-kit's frame)."""
    keys = [k for k in case["variants"] if not parse_variant(k)[2]]
    why = progress.out_of_time()
    if why or not keys:
        _mark([case["variants"][k] for k in keys], "md", why)
        return
    atoms = deepmd_md.atoms_of(frame, type_map)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        deepmd_md.save_checkpoint(model, config, path)
        for key in keys:
            _step(progress, f"MD {key}", case["variants"][key], "md",
                  lambda key=key: _md_one(path, key, atoms, args, device),
                  say=lambda md: f"{md['steps_per_s']:.2f} steps/s")
            _free(device)


def _reference(case: dict, type_map, frame, args, device):
    """The perturbed float32 weights (a model at ``DP_TRITON_INFER`` 0 and its state) and the
    float64 model's energy, forces and virial on ``frame`` (same weights)."""
    cut = {"rcut": args.rcut} if args.rcut else {}
    config = configs.model_config(case["config"], type_map=type_map, **cut)
    with _dp_triton_infer(0):
        base = configs.perturb(configs.build_model(config), seed=args.seed)
        ref_model = configs.build_model(configs.model_config(case["config"], type_map=type_map,
                                                             precision="float64", **cut))
    state = base.state_dict()
    ref_model.load_state_dict(state)
    inputs64 = tuple(None if t is None else t.to(device) for t in frame)
    ref = {k: v.detach() for k, v in _frame(ref_model.to(device).eval(), inputs64).items()
           if k in ("energy", "force", "virial")}
    del ref_model, inputs64
    _free(device)                                          # the float64 frame's memory, before the variants
    return config, base, state, ref


def _variant(key: str, entry: dict, config: dict, state: dict, inputs, ref, args, device, progress: Progress):
    """Variant ``key`` built and its first frame against ``ref`` as one step, its peak memory as
    another (on a GPU), into ``entry``: ``(task, model)`` to time, or ``None`` where it does not run."""
    graphed = parse_variant(key)[2]
    if graphed and torch.device(device).type != "cuda":
        entry["not_run"] = "CUDA graphs need a CUDA device"
        return None
    with progress.step(f"{key}: built + first frame") as notes:
        model, acc_report = build_variant(key, config, state, device, args.rest_level)
        entry["accelerated"] = None if acc_report is None else [c.runs_on for c in acc_report]
        run = lambda: _frame(model, inputs)                # noqa: E731
        if graphed:
            run, _, why = _graphed(model, inputs)
            notes.append("CUDA graph captured" if why is None else f"no CUDA graph: {why}")
            if run is None:
                entry["not_run"] = why
                return None
        entry["accuracy"] = _deviation(_frame(model, inputs), ref)
        notes.append(f"force max abs {entry['accuracy']['force_max_abs']:.1e}")
    if torch.device(device).type != "cuda":
        entry["peak_memory_bytes"] = None
    else:
        _step(progress, f"{key}: peak memory", entry, "peak_memory_bytes", lambda: _peak_memory(run, device),
              say=lambda b: f"{b / 2 ** 20:.0f} MiB above the resident models")
    return Task(run=run), model


def _time_all(case: dict, tasks: dict, args, device, progress: Progress) -> None:
    """The variants of ``tasks`` timed in interleaved rounds (``time_interleaved``) as one step."""
    why = progress.out_of_time()
    if why:
        _mark([case["variants"][key] for key in tasks], "time", why)
        return
    with progress.step(f"timing {args.rounds} rounds (after {args.warmup} warm-up) x {len(tasks)} variants"):
        samples = time_interleaved(tasks, rounds=args.rounds, warmup=args.warmup, clock=clock_for(device))
        for key, s in samples.items():
            case["variants"][key]["time"] = s.to_dict()


def _not_run(case: dict, variants, why: str) -> dict:
    case["not_run"] = why
    case["variants"] = {key: {"not_run": why} for key in variants}
    return case


def run_case(case: dict, variants, args, device, progress: Progress) -> dict:
    """One config on one system size (``case``: ``config``, ``system``, ``atoms`` asked for and
    ``variants``, filled in place, step by step): the float64 reference frame, every variant
    built with its first frame and peak memory, timed, its breakdown, its MD."""
    make_frame, type_map = SYSTEMS[case["system"]]
    coord, atype, box = frame = make_frame(case["atoms"], seed=args.seed)
    case["atoms"] = int(atype.numel())
    why = progress.out_of_time()
    if why:
        return _not_run(case, variants, why)
    with progress.step("float64 reference frame"):
        config, base, state, ref = _reference(case, type_map, frame, args, device)
    inputs = (coord.float().to(device), atype.to(device), None if box is None else box.float().to(device))
    tasks, models = {}, {}
    for key in variants:
        entry = case["variants"].setdefault(key, {})
        why = progress.out_of_time()
        if why:
            entry["not_run"] = why
        elif built := _variant(key, entry, config, state, inputs, ref, args, device, progress):
            tasks[key], models[key] = built
    if tasks:
        _time_all(case, tasks, args, device, progress)
    if args.breakdown:
        for key, model in models.items():
            if not parse_variant(key)[2]:
                _step(progress, f"breakdown {key}", case["variants"][key], "breakdown",
                      lambda m=model: _stage_times(m, inputs, device, args.breakdown_rounds))
    if args.md_steps > 0:
        tasks.clear()
        models.clear()                                     # the timed models' memory, before MD
        _free(device)
        md_runs(config, base, frame, type_map, case, args, device, progress)
    return case


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


def not_run_text(variant: dict) -> str | None:
    """Why a variant, or some of its steps, did not run (``"timing, MD: out of time (--seconds 60)"``),
    or ``None``."""
    if variant.get("not_run"):
        return variant["not_run"]
    by_reason: dict[str, list[str]] = {}
    for field, why in variant.get("steps_not_run", {}).items():
        by_reason.setdefault(why, []).append(STEP_NAMES[field])
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items()) or None


def _status_lines(record: dict) -> list[str]:
    """Where a run stood when its record was written: the step it was in (a run cut off), the
    step that failed, the budget that stopped it."""
    lines = []
    if record.get("running"):
        r = record["running"]
        lines.append(f"unfinished: written while running {r['step']} (from {r['from_s']:.0f} s into the run)")
    if record.get("failed"):
        lines.append(f"failed in {record['failed']['step']}: {record['failed']['error']}")
    if record.get("stopped"):
        lines.append(f"stopped: {record['stopped']}; what it left is marked not run")
    return lines


def _not_run_section(record: dict) -> list[str]:
    lines = []
    for case in record["cases"]:
        label = f"{case['config']} / {case['system']} / {case['atoms']} atoms"
        if case.get("not_run"):
            lines.append(f"- {label}: {case['not_run']}")
            continue
        lines += [f"- {label}, {key}: {text}" for key, v in case["variants"].items() if (text := not_run_text(v))]
    return ["", "## Not run", "", *lines] if lines else []


def markdown(record: dict) -> str:
    lines = ["# deepmd-kit SeZM: deepmd-kit's levels against mixstack", ""]
    lines += [f"- {line}" for line in report.header_lines(record) + _status_lines(record)] + [""]
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
                     (v.get("not_run") or v.get("steps_not_run", {}).get("time") or "—") if t is None
                     else f"{t['median_ms']:.2f}",
                     "—" if t is None else f"{t['p20_ms']:.2f}-{t['p80_ms']:.2f}",
                     report.fmt(None if peak is None else peak / 2 ** 20, ".0f"),
                     report.fmt(acc.get("force_max_abs")), report.fmt(acc.get("energy_rel")),
                     report.fmt(_stage_sum(stages, ("wigner", "value_path")), ".2f"),
                     report.fmt(_stage_sum(stages, ("convolution", breakdown.OTHER)), ".2f"),
                     report.fmt(md.get("steps_per_s"), ".2f"), report.fmt(md.get("ns_per_day"), ".3f")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + _stage_rows(record) + _not_run_section(record)) + "\n"


def long_rows(record: dict) -> list[dict]:
    rows = []
    cols = report.env_columns(record)
    for case in record["cases"]:
        for key, v in case["variants"].items():
            row = {"config": case["config"], "system": case["system"], "atoms": case["atoms"], "variant": key,
                   "median_ms": v.get("time", {}).get("median_ms"), "peak_memory_bytes": v.get("peak_memory_bytes"),
                   **{k: val for k, val in v.get("accuracy", {}).items()}, "not_run": not_run_text(v), **cols}
            for stage, t in v.get("breakdown", {}).get("stages", {}).items():
                row[f"{stage}_forward_ms"], row[f"{stage}_backward_ms"] = t["forward_ms"], t["backward_ms"]
            for field in ("steps_per_s", "ns_per_day", "drift_mev_atom_ps"):
                row[f"md_{field}"] = v.get("md", {}).get(field)
            rows.append(row)
    return rows


def run_deepmd_bench(args, device, *, command: str, on_case=None, on_step=None, on_write=None,
                     start: float | None = None) -> dict:
    """Every config x system x size of the parsed ``mixstack bench deepmd`` options ``args`` on
    ``device``: the record.  ``on_case(label)`` before each case; ``on_step(text)`` as each step
    ends and ``on_write(record)``, the record so far, as each starts and ends (``Progress``);
    with ``args.seconds``, no step starts once that many seconds have gone from ``start`` (a
    ``time.monotonic()`` reading, default now): what was not run says why."""
    from ..deepmd.compat import deepmd_pt

    deepmd_pt()
    import deepmd
    seconds = getattr(args, "seconds", None)
    record = {"env": {**env.collect(device), "deepmd_kit": deepmd.__version__}, "command": command,
              "rest_level": args.rest_level, "rounds": args.rounds, "warmup": args.warmup, "seconds": seconds,
              "cases": []}
    progress = Progress(record, seconds=seconds, start=start, on_step=on_step, on_write=on_write)
    for config_name in args.configs:
        for system in args.systems:
            for atoms in args.atoms:
                case = {"config": config_name, "system": system, "atoms": atoms, "variants": {}}
                record["cases"].append(case)
                if on_case:
                    on_case(f"{config_name} / {system} / {atoms} atoms")
                run_case(case, args.variants, args, device, progress)
    return record


def write(record: dict, out, *, with_plot: bool = False) -> dict:
    """``deepmd_bench.json``, ``.md`` and ``.csv`` in ``out`` (the bench draws no plot)."""
    return report.write(record, out, with_plot=with_plot, names=("deepmd_bench.json", "deepmd_bench.md", ""),
                        render_markdown=markdown, render_rows=long_rows)
