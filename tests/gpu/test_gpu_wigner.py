"""``mixstack.edge_wigner``'s kernels on CUDA: the packed rows and their gradient against the
float64 tensor-op formulas at lmax 3 and 6 on ~100k edges, bitwise run to run."""

from __future__ import annotations

import helpers
import pytest
import torch

import mixstack

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("lmax", [3, 6])
def test_kernels_match_float64_and_repeat_bitwise(lmax):
    vec = helpers.edge_vectors(100_003, seed=lmax, device="cuda")
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        w, g, w64, g64 = helpers.edge_wigner_check(vec, lmax)
        w2, g2, _, _ = helpers.edge_wigner_check(vec, lmax)
    assert log["wigner:triton"] == 2 and log["wigner_bwd:triton"] == 2, dict(log)
    helpers.assert_close_rel(w, w64, f"edge_wigner lmax {lmax}")
    helpers.assert_close_rel(g, g64, f"edge_wigner grad lmax {lmax}")
    assert torch.equal(w, w2) and torch.equal(g, g2)
