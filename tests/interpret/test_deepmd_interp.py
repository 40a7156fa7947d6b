"""SeZM convolutions and whole deepmd-kit models on mixstack's kernels (level 1, float32, through
the Triton interpreter) against deepmd-kit's own float32 path, to float32 rounding (see
``deepmd_cases.fp32_tolerance``); frames bitwise run to run."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import (  # noqa: F401  (one_torch_thread: a fixture)
    KEYS,
    accelerated_conv,
    accelerated_copy,
    cast_frame,
    conv_inputs,
    float64_twin,
    fp32_tolerance,
    make_conv,
    make_model,
    model_outputs,
    one_torch_thread,
    require_deepmd,
)

import mixstack
from mixstack.deepmd import systems

require_deepmd()

KERNEL_PATHS = ("wigner:triton", "conv_in:triton", "fwd:triton", "conv_out:triton",
                "wigner_bwd:triton", "conv_in_bwd:triton", "conv_out_bwd:triton")

CONVS = {
    "water": {},
    "two_stream_heads2": {"lmax": 3, "n_focus": 2, "n_atten_head": 2},
    "default_heads0": {"lmax": 3, "channels": 64, "mixing_layers": 4, "n_atten_head": 0},
}


def _conv_run(conv, inputs):
    x, cache, radial = inputs
    out = conv(x, cache, radial)
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape).to(out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), (x, cache.edge_vec, radial))
    return (out.detach(),) + grads


# The schema default's stack (Cf 64, lmax 3, 4 layers), the dearest, in the full suite only.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "default_heads0" else c
                                  for c in sorted(CONVS)])
def test_convolution_on_kernels_matches_deepmd_to_float32_rounding(case):
    conv = make_conv(dtype=torch.float32, **CONVS[case]).eval()
    twin = make_conv(dtype=torch.float64, **CONVS[case]).eval()
    twin.load_state_dict(conv.state_dict())
    fast = accelerated_conv(conv, level=1)
    inputs32 = conv_inputs(conv, n_edges=19, requires_grad=True)
    inputs64 = conv_inputs(twin, n_edges=19, requires_grad=True)
    ref32, ref64 = _conv_run(conv, inputs32), _conv_run(twin, inputs64)
    with mixstack.dispatch_log() as log:
        got = _conv_run(fast, inputs32)
    assert all(log[name] >= 1 for name in KERNEL_PATHS), dict(log)
    assert log["fwd:reference"] == 0 and log["conv_in:reference"] == 0
    for name, g, r32, r64 in zip(("out", "x", "edge_vec", "radial"), got, ref32, ref64):
        tol = fp32_tolerance(r32, r64)
        assert (g.double() - r32.double()).abs().max().item() <= tol, name
        assert (g.double() - r64).abs().max().item() <= tol, name


def _model_check(name, frame, backend="pt", **descriptor):
    model = make_model(name, "float32", backend=backend, **descriptor)
    twin = float64_twin(model, name, backend=backend, **descriptor)
    fast, report = accelerated_copy(model, level=1)
    assert len(report.on_mixstack) == len(report)
    frame32 = cast_frame(frame, torch.float32)
    ref32, ref64 = model_outputs(model, frame32), model_outputs(twin, cast_frame(frame, torch.float64))
    with mixstack.dispatch_log() as log:
        first = model_outputs(fast, frame32)
    assert all(log[p] == len(report) for p in ("fwd:triton", "conv_in:triton", "conv_out:triton")), dict(log)
    assert log["wigner:triton"] == 1, dict(log)          # the frame's Wigner rows, shared by its blocks
    for key in KEYS:
        tol = fp32_tolerance(ref32[key], ref64[key])
        assert (first[key].double() - ref32[key].double()).abs().max().item() <= tol, key
        assert (first[key].double() - ref64[key]).abs().max().item() <= tol, key
    return fast, frame32, first


_WATER: dict = {}


def _water():
    """``_model_check`` of the water model on its frame, once per test run."""
    if not _WATER:
        _WATER["run"] = _model_check("water", systems.water(9, seed=3))
    return _WATER["run"]


def test_water_model_on_kernels_matches_deepmd():
    _water()


def test_expt_water_model_on_kernels_matches_deepmd():
    """deepmd-kit's PT-expt backend (its padded neighbour layout) on the same kernels."""
    pytest.importorskip("deepmd.pt_expt")
    _model_check("water", systems.water(9, seed=3), backend="pt_expt")


@pytest.mark.slow
def test_water_model_on_kernels_is_bitwise_run_to_run():
    fast, frame32, first = _water()
    second = model_outputs(fast, frame32)
    assert all(torch.equal(first[k], second[k]) for k in KEYS)


@pytest.mark.slow
def test_frame_runner_on_kernels_matches_the_model_and_is_bitwise_run_to_run(monkeypatch):
    """``FrameRunner`` (its padded, fixed-capacity edges) on the water model at level 1: deepmd-kit's
    frame to float32 rounding, bitwise run to run, the same kernels as the model's own frame.
    Capacities round up to 16 here, not 256: the interpreter's time follows the slots (this frame
    has ~50 edges), and a few padding slots hold what a few hundred would."""
    from mixstack.deepmd import FrameRunner
    from mixstack.deepmd import frame as frame_module

    monkeypatch.setattr(frame_module, "edge_capacity", lambda n, previous=None, **steps: -(-int(n) // 16) * 16)
    fast, frame32, first = _water()
    runner = FrameRunner(fast)
    with mixstack.dispatch_log() as log:
        out = runner(*frame32)
    assert log["fwd:triton"] == 2 and log["wigner:triton"] == 1 and log["fwd:reference"] == 0, dict(log)
    again = runner(*frame32)
    coord, atype, box = frame32
    edges = int(fast.build_neighbor_list(coord.reshape(1, -1, 3), atype.reshape(1, -1), box).edge_mask.sum())
    assert runner.edge_capacity > edges > 0                              # padding edges in the buffer
    for key in KEYS:
        assert torch.equal(out[key], again[key]), key
        scale = first[key].abs().max().item()
        assert (out[key].double() - first[key].double()).abs().max().item() <= 64 * 2 ** -23 * scale, key


@pytest.mark.slow
def test_two_stream_model_on_kernels_matches_deepmd():
    """The 2-stream lmax-3 example with two heads (the schema default's stack, Cf 64 lmax 3 with 4
    layers, runs on kernels in the convolution test; its whole model in float64)."""
    _model_check("two_stream", systems.water(9, seed=4, periodic=False), n_atten_head=2)


@pytest.mark.slow
def test_force_loss_training_gradients_on_kernels():
    """Train mode at level 1: the stack's double backward on its kernels, the rotations' through
    their reference formulas; every parameter's gradient to float32 rounding."""
    conv = make_conv(dtype=torch.float32).train()
    twin = make_conv(dtype=torch.float64).train()
    twin.load_state_dict(conv.state_dict())
    fast = accelerated_conv(conv, level=1).train()

    def grads(module):
        x, cache, radial = conv_inputs(module, n_edges=13, requires_grad=True)
        out = module(x, cache, radial)
        (g_vec,) = torch.autograd.grad(out.square().sum(), cache.edge_vec, create_graph=True)
        loss = out.sum() + g_vec.square().sum()
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.autograd.grad(loss, params, allow_unused=True)

    with mixstack.dispatch_log() as log:
        got = grads(fast)
    assert log["fwd:triton"] == 1 and log["bwd2:triton"] >= 1, dict(log)
    for g, r32, r64 in zip(got, grads(conv), grads(twin)):
        if r64 is None:
            assert g is None
            continue
        tol = fp32_tolerance(r32, r64, ulps=256)
        assert (g.double() - r64).abs().max().item() <= tol
