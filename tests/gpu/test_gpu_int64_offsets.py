"""Element offsets past 2**31: F * E * ROW > 2**31 (and n_gated * F * E * ROW for z).

F = 1, lmax = 1, Cf = 16 -> ROW = 64; E = 2**31 // 64 + 1000 edges, so the last
1000 edges of every (F, E, ROW) surface sit past element 2**31.  n_layers = 3:
two gated layers, so the z surface of layer 1 starts at element F * E * ROW > 2**31
(an int32 ``layer * F * E * ROW`` would wrap there even with int64 row offsets).
The stack is row-independent per edge, so a few sampled edges are checked
against the float64 reference computed on just those rows.

The check runs in a child process: an out-of-bounds access from a wrapped offset
is a sticky CUDA error that would otherwise fail every later GPU test.
Needs ~58 GiB of free GPU memory; skipped below that.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

F, LMAX, CF, N_LAYERS = 1, 1, 16, 3
ROW = (3 * LMAX + 1) * CF
N_EDGES = 2**31 // ROW + 1000


def required_bytes(n_edges: int = N_EDGES) -> int:
    """Peak of live surfaces (float32): forward u0, out, z (n_gated), 2 ping-pong buffers,
    grad_out, gate surface; backward u0, out, z, grad_out, h, gz, gate surface."""
    surface = 4 * F * n_edges * ROW
    n_gated = N_LAYERS - 1
    gate = surface * LMAX * CF // ROW
    fwd = surface * (3 + n_gated + min(n_gated, 2)) + gate
    bwd = surface * (5 + n_gated) + gate
    return max(fwd, bwd)


def check(n_edges: int = N_EDGES, device: str = "cuda", sample=None) -> None:
    """Run level 1 forward + relay backward on ``n_edges`` edges; check sampled edges."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import helpers

    import mixstack

    case = helpers.Case(F=F, E=n_edges, Cf=CF, lmax=LMAX, n_layers=N_LAYERS, apply_alpha=True)
    _, _, w0, w1, gw = helpers.make_inputs(helpers.Case(F, 1, CF, LMAX, N_LAYERS), device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    u0 = torch.randn(F, n_edges, ROW, generator=gen, device=device)
    alpha = torch.rand(n_edges, F, generator=gen, device=device).add_(0.1)
    grad_out = torch.randn(n_edges, F, ROW, generator=gen, device=device)
    if sample is None:
        past = 2**31 // (F * ROW)                       # first edge whose row starts past 2**31
        sample = [0, 1, 63, 64, n_edges // 2, past - 1, past, past + 1, n_edges - 2, n_edges - 1]
        sample += torch.randint(past, n_edges, (8,), generator=torch.Generator().manual_seed(1)).tolist()
    idx = torch.tensor(sorted(set(sample)), device=device)
    u0_sum, u0_rows = u0.sum(dtype=torch.float64), u0[:, idx].clone()

    u0.requires_grad_()
    alpha.requires_grad_()
    with mixstack.use_level(1), mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, **case.kw)
        grad_u0, grad_alpha = torch.autograd.grad(out, (u0, alpha), grad_out)
    assert log == {"fwd:triton": 1, "bwd:relay": 1}, dict(log)
    out_rows, gu_rows, ga_rows = out.detach()[idx], grad_u0[:, idx], grad_alpha[idx]
    del out, grad_u0, grad_alpha
    assert torch.equal(u0.detach()[:, idx], u0_rows) and u0.detach().sum(dtype=torch.float64) == u0_sum, \
        "u0 was modified"

    small = helpers.Case(F=F, E=len(idx), Cf=CF, lmax=LMAX, n_layers=N_LAYERS, apply_alpha=True)
    want_out, want = helpers.reference64(small, (u0.detach()[:, idx], alpha.detach()[idx], w0, w1, gw),
                                         grad_out[idx])
    for j, e in enumerate(idx.tolist()):
        helpers.assert_close_rel(out_rows[j], want_out[j], f"forward, edge {e}")
        helpers.assert_close_rel(gu_rows[:, j], want["u0"][:, j], f"grad_u0, edge {e}")
    # one scalar per edge: a 64-term sum, so compare the sampled set as a whole
    helpers.assert_close_rel(ga_rows, want["alpha"], "grad_alpha, sampled edges")


def test_gpu_offsets_past_2_pow_31_elements_are_right():
    free, _ = torch.cuda.mem_get_info()
    need = required_bytes() * 1.1 + 2 * 2**30
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "OK" in proc.stdout


if __name__ == "__main__":
    check()
    print("OK")
