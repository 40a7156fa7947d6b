"""The convolution kernels' later features compiled for a CUDA GPU (tests/interpret runs them
through the interpreter): per-stream channel blocks, per-degree or no radial weights and the
degree mix in rotate-in, streams kept apart with per-head weights, an EdgeOrder and a row scale in
rotate-out; against float64, bitwise run to run, level 2 bitwise equal to level 1."""

from __future__ import annotations

import helpers
import pytest
import torch
from conv_cases import InCase, OutCase, in_inputs, out_inputs, run_in, run_out

import mixstack

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
CASES = [
    (InCase(N=300, E=9001, F=2, C=32, lmax=3, radial=None, mix="basis1"),            # the 2-stream config's call
     OutCase(N=300, E=9001, F=2, C=32, lmax=3, weight="heads2")),
    (InCase(N=200, E=5003, F=1, C=32, lmax=2, radial=None, mix="basis1", streams=False),   # the water example's
     OutCase(N=200, E=5003, F=1, C=32, lmax=2, weight=None)),
    (InCase(N=100, E=2001, F=1, C=64, lmax=3, radial="degree", mix="channel"),
     OutCase(N=100, E=2001, F=1, C=64, lmax=3, weight="edge", blocks=False)),
]


@pytest.mark.parametrize("cin, cout", CASES, ids=lambda c: str(c))
def test_features_on_the_gpu_match_float64_and_repeat_bit_for_bit(cin, cout):
    runs = {}
    for level in (1, 1, 2):
        with mixstack.use_level(level), mixstack.dispatch_log() as log:
            u, g_in, _ = run_in(cin, in_inputs(cin, device=DEV))
            out, g_out, _ = run_out(cout, out_inputs(cout, device=DEV))
        assert log["conv_in_bwd:triton"] == 1 and log["conv_out_bwd:triton"] == 1, dict(log)
        first = runs.setdefault(level, (u, g_in, out, g_out))
        assert torch.equal(first[0], u) and torch.equal(first[2], out)
        assert all(torch.equal(first[1][k], g_in[k]) for k in g_in) and all(torch.equal(first[3][k], g_out[k])
                                                                            for k in g_out)
    assert torch.equal(runs[1][0], runs[2][0]) and torch.equal(runs[1][2], runs[2][2])
    with mixstack.use_level(0):
        u64, g_in64, _ = run_in(cin, in_inputs(cin, dtype=torch.float64))
        out64, g_out64, _ = run_out(cout, out_inputs(cout, dtype=torch.float64))
    u, g_in, out, g_out = runs[1]
    helpers.assert_close_rel(u, u64, "rotate_in")
    helpers.assert_close_rel(out, out64, "rotate_out_sum")
    for name in g_in64:
        helpers.assert_close_rel(g_in[name], g_in64[name], f"rotate_in grad {name}")
    for name in g_out64:
        helpers.assert_close_rel(g_out[name], g_out64[name], f"rotate_out_sum grad {name}")
