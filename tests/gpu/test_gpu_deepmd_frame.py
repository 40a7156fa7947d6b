"""``mixstack.deepmd.FrameRunner`` on a CUDA GPU: the frame replayed from a CUDA graph bitwise
equal to the same frame run eagerly (torch's deterministic scatters), within float32 rounding of
deepmd-kit's own frame and its float64 twin; atoms that move keep or rebuild the list without a
new capture; deepmd-kit's compiled inference with mixstack's operators inside (``compile=True``).
Skipped without CUDA or deepmd-kit."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import (
    KEYS,
    accelerated_copy,
    cast_frame,
    float64_twin,
    fp32_tolerance,
    make_model,
    model_outputs,
    require_deepmd,
)

from mixstack.deepmd import FrameRunner, systems

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

require_deepmd()

DEV = "cuda"


@pytest.fixture
def deterministic():
    """deepmd-kit's own scatters add with atomics on a GPU unless torch's deterministic mode is on."""
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def _on(frame, dtype=torch.float32):
    return tuple(None if t is None else t.to(DEV) for t in cast_frame(frame, dtype))


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
def test_compiled_inference_with_mixstack_inside_matches_the_eager_frame():
    frame = systems.water(240, seed=5)
    model = make_model("water", "float32", rcut=6.0).to(DEV)
    ref32 = model_outputs(model, _on(frame))
    ref64 = model_outputs(float64_twin(model, "water", rcut=6.0).to(DEV), _on(frame, torch.float64))
    fast, _ = accelerated_copy(model, level=2)
    runner = FrameRunner(fast, compile=True)
    out = _run(runner, frame)
    assert fast.compiled_core_compute_cache, "deepmd-kit's compiled core_compute was not built"
    for key in KEYS:
        tol = fp32_tolerance(ref32[key], ref64[key], ulps=64)
        assert (out[key].double() - ref64[key]).abs().max().item() <= tol, key


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
