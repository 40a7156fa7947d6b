"""deepmd-kit's SeZM models accelerated on a CUDA GPU: levels 1-3 against the unaccelerated
model and its float64 twin; frames bitwise run to run and level 2 bitwise equal to level 1; the
benchmark at a small size.  ``FrameRunner``: the frame replayed from a CUDA graph bitwise equal to
the same frame run eagerly, within float32 rounding of deepmd-kit's own frame and its float64
twin; atoms that move keep or rebuild the list without a new capture; a capture that fails runs
eagerly; deepmd-kit's compiled inference with mixstack's operators inside (``compile=True``).
Skipped without CUDA or deepmd-kit."""

from __future__ import annotations

import json

import pytest
import torch
from deepmd_cases import (
    KEYS,
    accelerated_copy,
    float64_twin,
    fp32_tolerance,
    make_model,
    model_outputs,
    on_device,
    require_deepmd,
)

import mixstack
from mixstack.cli import main
from mixstack.deepmd import FrameRunner, systems
from mixstack.deepmd.frame import edge_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

require_deepmd()

DEV = "cuda"


def _on(frame, dtype=torch.float32):
    return on_device(frame, dtype, DEV)


@pytest.mark.parametrize("name", ["water", "two_stream"])
def test_levels_match_deepmd_and_float64(name, deterministic):
    frame = systems.water(96, seed=5)
    model = make_model(name, "float32", rcut=6.0).to(DEV)
    twin = float64_twin(model, name, rcut=6.0).to(DEV)
    ref32, ref64 = model_outputs(model, _on(frame, torch.float32)), model_outputs(twin, _on(frame, torch.float64))
    edges = edge_inputs(model, *_on(frame, torch.float32))
    outs, fixed = {}, {}
    for level in (1, 2, 3):
        fast, report = accelerated_copy(model, level=level)
        assert len(report.on_mixstack) == len(report)
        with mixstack.dispatch_log() as log:
            outs[level] = model_outputs(fast, _on(frame, torch.float32))
        assert log["fwd:triton"] + log["fwd:compensated"] == len(report), dict(log)
        assert log["conv_in:triton"] == len(report) and log["conv_out:triton"] == len(report), dict(log)
        assert log["wigner:triton"] == 1, dict(log)              # the frame's rows, shared by its blocks
        ulps = 32 if level < 3 else 512                          # level 3: compensated products
        for key in KEYS:
            tol = fp32_tolerance(ref32[key], ref64[key], ulps=ulps)
            assert (outs[level][key].double() - ref64[key]).abs().max().item() <= tol, (level, key)
        # bitwise on one edge list: deepmd-kit's builder (vesin's CUDA cell list) orders edges
        # differently from call to call, and a different order is a different float32 sum
        fixed[level] = _on_fixed_edges(fast, edges)
        assert all(torch.equal(_on_fixed_edges(fast, edges)[k], fixed[level][k]) for k in fixed[level]), level
    assert all(torch.equal(fixed[1][k], fixed[2][k]) for k in fixed[1])


def _on_fixed_edges(model, edges) -> dict:
    """Energy, forces and virial of ``model`` on the edge list ``edges`` (``edge_inputs``; deepmd-kit's
    ``forward_common_lower``, eager), detached."""
    with torch.enable_grad():
        ret = model.forward_common_lower(*edges, use_compile=False)
    return {k: ret[k].detach() for k in ("energy_redu", "energy_derv_r", "energy_derv_c_redu")}


def test_the_bench_runs_on_the_gpu(tmp_path):
    assert main(["bench", "deepmd", "--atoms", "96", "--configs", "water", "--systems", "water", "--variants",
                 "dp0,dp2,ms2,ms2g", "--rounds", "3", "--warmup", "1", "--breakdown", "--md-steps", "3",
                 "--md-warmup", "1", "--device", DEV, "--out", str(tmp_path)]) == 0
    (case,) = json.loads((tmp_path / "deepmd_bench.json").read_text())["cases"]
    for key in ("dp0", "dp2", "ms2"):
        v = case["variants"][key]
        assert v["time"]["median_ms"] > 0 and v["peak_memory_bytes"] > 0 and v["device_memory_bytes"] > 0
        assert v["breakdown"]["stages"]["value_path"]["forward_ms"] > 0
        assert v["md"]["steps_per_s"] > 0
    g = case["variants"]["ms2g"]
    assert g["peak_memory_bytes"] > 0 and g["device_memory_bytes"] > 0          # from a runner of its own
    assert g["other_pool"]["presize"] is False and g["other_pool"]["device_memory_bytes"] > 0
    assert g["other_pool"]["force_max_abs"] <= 2 * g["accuracy"]["force_max_abs"] + 1e-6   # the same frame
    assert "time" in g or g["not_run"]


def _run(runner, frame):
    return {k: v.detach() for k, v in runner(*_on(frame)).items() if k in KEYS}


@pytest.mark.parametrize("level", [None, 2, 3])
def test_replay_is_bitwise_the_eager_frame_and_within_float32_of_deepmd(level, deterministic):
    frame = systems.water(240, seed=3)
    model = make_model("water", "float32", rcut=6.0).to(DEV)
    ref32 = model_outputs(model, _on(frame))
    ref64 = model_outputs(float64_twin(model, "water", rcut=6.0).to(DEV), _on(frame, torch.float64))
    fast = model if level is None else accelerated_copy(model, level=level)[0]
    runner = FrameRunner(fast)
    out = _run(runner, frame)
    again = _run(runner, frame)
    eager = _run(FrameRunner(fast, graph=False), frame)
    assert runner.captures == 1 and runner.replays >= 2
    for key in KEYS:
        assert torch.equal(out[key], again[key]) and torch.equal(out[key], eager[key]), key
        tol = fp32_tolerance(ref32[key], ref64[key], ulps=32 if level != 3 else 512)
        assert (out[key].double() - ref64[key]).abs().max().item() <= tol, key


def test_a_graph_captured_into_a_presized_pool_replays_the_same_bits(deterministic):
    frame = systems.water(240, seed=5)
    model, _ = accelerated_copy(make_model("water", "float32", rcut=6.0).to(DEV), level=3)
    plain, presized = FrameRunner(model, presize=False), FrameRunner(model)
    assert presized.presize                                       # the default
    a, b = _run(plain, frame), _run(presized, frame)
    again = _run(presized, frame)
    assert presized.captures == 1 and presized.replays >= 2
    for key in KEYS:
        assert torch.equal(a[key], b[key]) and torch.equal(b[key], again[key]), key


@pytest.mark.parametrize("presize", [True, False])
def test_an_overflow_recaptures_without_an_eager_frame_and_replays_the_eager_bits(presize, deterministic):
    frame = systems.water(240, seed=6)
    model, _ = accelerated_copy(make_model("water", "float32", rcut=6.0).to(DEV), level=3)
    runner = FrameRunner(model, presize=presize)
    _run(runner, frame)
    capacity = runner.edge_capacity
    coord, atype, box = frame
    denser = (coord * 0.97, atype, box * 0.97)                    # ~9% more edges: past the capacity
    frames = []
    real = runner.frame
    runner.frame = lambda *a: frames.append(1) or real(*a)        # every frame run eagerly or captured
    out = _run(runner, denser)
    assert runner.edge_capacity > capacity and "the box changed" in runner.last_reason    # the frame's flag names
    assert runner.captures == 2 and runner.growths == 1 and runner.fallback_reason is None
    # presized: the capture alone, its pool the measured peak scaled; else one warm-up, then the capture
    assert len(frames) == (1 if presize else 2)
    if presize:
        assert runner.events[-1]["what"] == "capture" and runner.events[-1]["pool"] == "scaled"
    split = runner.events[-1]
    parts = ("before_s", "enter_s", "record_s", "instantiate_s")
    assert abs(sum(split[p] for p in parts) - split["seconds"]) < 1e-3 and min(split[p] for p in parts) >= 0
    again = _run(runner, denser)
    eager = _run(FrameRunner(model, graph=False), denser)
    for key in KEYS:
        assert torch.equal(out[key], eager[key]) and torch.equal(out[key], again[key]), key


def test_a_small_growth_recaptures_into_the_kept_pool_and_replays_the_eager_bits(deterministic):
    """Capacities grown by less than ``POOL_ROOM`` (an MD run's climbing edge count): the recapture
    records into the first capture's pool (the same pool, no new one taken) and replays the same
    bits as the frame run eagerly."""
    from mixstack.deepmd.frame import POOL_ROOM
    frame = systems.water(240, seed=6)
    model, _ = accelerated_copy(make_model("water", "float32", rcut=6.0).to(DEV), level=3)
    runner = FrameRunner(model)
    _run(runner, frame)
    first, pool = runner._capacities(), runner._pool
    coord, atype, box = frame
    denser = (coord * 0.997, atype, box * 0.997)                  # ~1% more edges: past the capacity, in the room
    out = _run(runner, denser)
    growth = max(g / f for g, f in zip(runner._capacities(), first))
    assert runner.captures == 2 and 1 < growth <= POOL_ROOM, (first, runner._capacities())
    assert runner.events[-1]["pool"] == "kept" and runner.fallback_reason is None
    assert runner._pool is pool                                     # no pool released, no new block taken
    eager = _run(FrameRunner(model, graph=False), denser)
    again = _run(runner, denser)
    for key in KEYS:
        assert torch.equal(out[key], eager[key]) and torch.equal(out[key], again[key]), key


def test_moving_atoms_keep_the_list_or_rebuild_it_in_place(deterministic):
    frame = systems.water(240, seed=4)
    model, _ = accelerated_copy(make_model("water", "float32", rcut=6.0).to(DEV), level=2)
    runner = FrameRunner(model, skin=1.0)
    coord, atype, box = _on(frame)
    runner(coord, atype, box)
    gen = torch.Generator(device=DEV).manual_seed(0)
    small = coord + 0.05 * torch.randn(coord.shape, generator=gen, device=DEV)
    out = runner(small, atype, box)
    assert runner.rebuilds == 1                                  # within half the skin: the kept list
    ref = model(small.clone(), atype, box.clone())
    assert (out["force"] - ref["force"]).abs().max().item() <= 1e-5 * ref["force"].abs().max().item()
    far = small.clone()
    far[0, 0] += 0.8                                             # one atom past half the skin
    out = runner(far, atype, box)
    assert runner.rebuilds == 2 and runner.last_reason == "an atom moved more than half the skin"
    ref = model(far.clone(), atype, box.clone())
    assert (out["force"] - ref["force"]).abs().max().item() <= 1e-5 * ref["force"].abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("level, products", [(2, "exact"), (3, "compensated"), (3, "kernel")])
def test_compiled_inference_with_mixstack_inside_matches_the_eager_frame(level, products, monkeypatch,
                                                                       deterministic):
    """The compiled frame within float32 rounding of the float64 twin; with the rest of the model's
    products compensated, deepmd-kit's trace asked for the compensated form of many products.  With
    torch's deterministic scatters (Inductor then lowers them to ATen's, not to atomic adds), the
    replayed compiled frame is bitwise the same compiled frame run without the graph, and again."""
    from mixstack.deepmd import accelerate, rest_products

    taken = []
    eligible = rest_products.eligible

    def spy(a, b, **kwargs):
        ok = eligible(a, b, **kwargs)
        if ok:
            taken.append(a.shape)
        return ok
    monkeypatch.setattr(rest_products, "eligible", spy)
    frame = systems.water(240, seed=5)
    model = make_model("water", "float32", rcut=6.0).to(DEV)
    ref32 = model_outputs(model, _on(frame))
    ref64 = model_outputs(float64_twin(model, "water", rcut=6.0).to(DEV), _on(frame, torch.float64))
    fast, _ = accelerated_copy(model)
    accelerate(fast, level=level, rest_products=products)
    runner = FrameRunner(fast, compile=True)
    out = _run(runner, frame)
    assert fast.compiled_core_compute_cache, "deepmd-kit's compiled core_compute was not built"
    assert (len(taken) >= 3) if products != "exact" else not taken, len(taken)
    for key in KEYS:
        tol = fp32_tolerance(ref32[key], ref64[key], ulps=64)
        assert (out[key].double() - ref64[key]).abs().max().item() <= tol, key
    # the compiled core_compute inside the CUDA graph, not the eager fallback after a failed capture
    assert runner.captures == 1 and runner.fallback_reason is None, runner.fallback_reason
    again = _run(runner, frame)
    ungraphed = _run(FrameRunner(fast, compile=True, graph=False), frame)
    for key in KEYS:
        assert torch.equal(out[key], again[key]) and torch.equal(out[key], ungraphed[key]), key


def test_a_capture_that_fails_warns_and_runs_eagerly(monkeypatch):
    frame = systems.water(96, seed=6)
    model = make_model("water", "float32", rcut=6.0).to(DEV)

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    runner = FrameRunner(model)
    with pytest.warns(RuntimeWarning, match="runs it eagerly"):
        out = _run(runner, frame)
    assert runner.captures == 0 and runner.fallback_reason.startswith("RuntimeError: operation not permitted")
    ref = model_outputs(model, _on(frame))
    assert (out["force"] - ref["force"]).abs().max().item() <= 1e-5 * ref["force"].abs().max().item()
    _run(runner, frame)                                          # eager from now on, no second warning
