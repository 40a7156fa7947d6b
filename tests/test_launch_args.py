"""What the launchers hand the kernels: an unused pointer argument is never an
activation surface (no kernels run here; the launches are recorded)."""

from __future__ import annotations

import pytest
import torch

from mixstack.core.layout import StackLayout
from mixstack.stack import gemm, launchers
from mixstack.stack.values import Saved, StackSpec, Weights
from mixstack.tuning import configs

# pointer argument -> the constexpr flags under which the kernel dereferences it ("!F": F unset)
GEMM_USES = {"res_ptr": ("RESIDUAL",), "out_ptr": ("STORE_OUT",), "z_ptr": ("STORE_Z",),
             "y_ptr": ("STORE_Y",), "sg_ptr": ("GATE",), "alpha_ptr": ("ALPHA_ON_A", "ALPHA_ON_OUT"),
             "w0lo_ptr": ("COMPENSATED",), "w1lo_ptr": ("COMPENSATED",), "wup_ptr": ("COMPENSATED",),
             "amax_in_ptr": ("AMAX_IN",), "amax_out_ptr": ("AMAX_OUT",)}
GATE_USES = {"u_ptr": ("WRITE_U",), "u_next_ptr": ("WRITE_U",), "amax_ptr": ("WRITE_AMAX",),
             "gwlo_ptr": ("COMPENSATED",), "gwup_ptr": ("COMPENSATED",)}
POINTWISE_USES = {"sg_ptr": ("!RECOMPUTE_SG",), "amax_ptr": ("WRITE_AMAX",), "gwlo_ptr": ("COMPENSATED",),
                  "gwup_ptr": ("COMPENSATED",)}
ALPHA_GRAD_USES = {"alpha_ptr": ("WRITE_AMAX",), "amax_ptr": ("WRITE_AMAX",)}


def _record(monkeypatch):
    calls = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch_(*args, **kwargs):
                calls.append((self.kernel.fn.__name__, dict(zip(self.kernel.arg_names, args)), kwargs))
            return launch_

    monkeypatch.setattr(launchers, "wrap_triton", Recorder)
    monkeypatch.setattr(gemm, "wrap_triton", Recorder)
    return calls


@pytest.mark.parametrize("compensated", [False, True], ids=["exact", "compensated"])
def test_unused_pointer_arguments_are_never_an_activation_surface(monkeypatch, compensated):
    """Inductor reasons about every tensor argument of a user Triton kernel; a surface
    handed again as a placeholder aliases arguments for nothing.  (On the H200 the
    compiled level-2 model frame, whose GEMM launches passed the activation as three
    placeholders, held ~6 more surfaces at its peak than level 3, which passed weights.)"""
    calls = _record(monkeypatch)
    lay, n_focus, n_edges = StackLayout(2, 16), 2, 37
    u0 = torch.randn(n_focus, n_edges, lay.row)
    alpha = torch.rand(n_edges, n_focus)
    w0 = torch.randn(3, n_focus, lay.m0, lay.m0)
    w1 = torch.randn(3, n_focus, lay.m1, lay.m1)
    gw = torch.randn(2, n_focus, 16, lay.gate_width)
    weights, spec, plan = Weights(w0, w1, gw), StackSpec(lay, True), launchers.LaunchPlan(compensated=compensated)
    out, z, y = launchers.stack_forward(u0, alpha, weights, spec, plan)
    grad = torch.randn(n_edges, lay.row)[:, None].expand(n_edges, n_focus, lay.row)
    launchers.stack_backward(grad, Saved(z, y, alpha), weights, spec, plan)
    checked = 0
    for name, args, flags in calls:
        uses = {"block_gemm_kernel": GEMM_USES, "gate_kernel": GATE_USES,
                "gate_backward_kernel": POINTWISE_USES, "alpha_grad_kernel": ALPHA_GRAD_USES}.get(name, {})
        for arg, needed_by in uses.items():
            if not any(not flags.get(f[1:]) if f.startswith("!") else flags.get(f) for f in needed_by):
                assert n_edges not in args[arg].shape, (name, arg, tuple(args[arg].shape))
                checked += 1
    assert checked > 20 and {c[0] for c in calls} >= {"block_gemm_kernel", "gate_kernel"}


def test_a_launch_config_cannot_change_the_k_tile():
    """The K tile fixes the order of the GEMMs' K sum: a config naming another one is
    refused, one naming the same one (the level-1 config does) is accepted."""
    lay = StackLayout(3, 32)
    cfg = dict(configs.default_gemm_config(lay))
    assert configs.gemm_block_k(lay, cfg) == configs.block_k(lay) == 32
    assert configs.gemm_block_k(lay, {"BLOCK_M": 64, "BLOCK_N": 64}) == 32
    with pytest.raises(ValueError, match="fixed at 32"):
        configs.gemm_block_k(lay, dict(cfg, BLOCK_K=64))
    assert configs.gemm_block_k(StackLayout(2, 48), cfg | {"BLOCK_K": 16}) == 16
