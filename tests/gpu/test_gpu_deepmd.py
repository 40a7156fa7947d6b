"""deepmd-kit's SeZM models accelerated on a CUDA GPU: levels 1-3 against the unaccelerated
model and its float64 twin; frames bitwise run to run and level 2 bitwise equal to level 1; the
benchmark at a small size.  Skipped without CUDA or deepmd-kit."""

from __future__ import annotations

import json

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

import mixstack
from mixstack.cli import main
from mixstack.deepmd import systems

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

require_deepmd()

DEV = "cuda"


@pytest.fixture
def deterministic():
    """deepmd-kit's own scatters (``index_add_``, ``scatter_add``) add with atomics on a GPU; the
    bitwise comparisons need torch's deterministic versions of them (mixstack's operators are
    deterministic either way)."""
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def _on(frame, dtype):
    return tuple(None if t is None else t.to(DEV) for t in cast_frame(frame, dtype))


@pytest.mark.parametrize("name", ["water", "two_stream"])
def test_levels_match_deepmd_and_float64(name, deterministic):
    frame = systems.water(96, seed=5)
    model = make_model(name, "float32", rcut=6.0).to(DEV)
    twin = float64_twin(model, name, rcut=6.0).to(DEV)
    ref32, ref64 = model_outputs(model, _on(frame, torch.float32)), model_outputs(twin, _on(frame, torch.float64))
    outs = {}
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
        again = model_outputs(fast, _on(frame, torch.float32))
        assert all(torch.equal(again[k], outs[level][k]) for k in KEYS), level
    assert all(torch.equal(outs[1][k], outs[2][k]) for k in KEYS)


def test_the_bench_runs_on_the_gpu(tmp_path):
    assert main(["bench", "deepmd", "--atoms", "96", "--configs", "water", "--systems", "water", "--variants",
                 "dp0,dp2,ms2,ms2g", "--rounds", "3", "--warmup", "1", "--breakdown", "--md-steps", "3",
                 "--md-warmup", "1", "--device", DEV, "--out", str(tmp_path)]) == 0
    (case,) = json.loads((tmp_path / "deepmd_bench.json").read_text())["cases"]
    for key in ("dp0", "dp2", "ms2"):
        v = case["variants"][key]
        assert v["time"]["median_ms"] > 0 and v["peak_memory_bytes"] > 0
        assert v["breakdown"]["stages"]["value_path"]["forward_ms"] > 0
        assert v["md"]["steps_per_s"] > 0
    assert "time" in case["variants"]["ms2g"] or case["variants"]["ms2g"]["not_run"]
