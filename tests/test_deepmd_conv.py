"""One SeZM convolution on mixstack against deepmd-kit's own, in float64 at level 0: every
option mixstack reproduces, the forward and every gradient (forces, training), on a synthetic
edge cache built with deepmd-kit's own Wigner blocks."""

from __future__ import annotations

import copy

import pytest
import torch
from deepmd_cases import (  # noqa: F401  (one_torch_thread: a fixture)
    FLOAT64_RTOL,
    accelerated_conv,
    conv_inputs,
    make_conv,
    max_rel,
    one_torch_thread,
    require_deepmd,
)

import mixstack

require_deepmd()

CASES = {
    "water": {},
    "heads0": {"n_atten_head": 0},
    "heads2": {"n_atten_head": 2},
    "two_stream": {"lmax": 3, "n_focus": 2, "n_atten_head": 2},
    "two_stream_one_head": {"lmax": 3, "n_focus": 2},                  # the bench's 2-stream config
    "two_stream_no_compete": {"lmax": 3, "n_focus": 2, "focus_compete": False},
    "two_stream_no_focus_norm": {"lmax": 3, "n_focus": 2, "focus_norm": False, "n_atten_head": 0},
    "radial_none": {"radial_so2_mode": "none"},
    "radial_degree": {"radial_so2_mode": "degree"},
    "radial_full_channel": {"radial_so2_mode": "degree_channel", "radial_so2_rank": 0},
    "radial_rank2": {"radial_so2_rank": 2, "lmax": 1},
    "one_layer": {"mixing_layers": 1},
    "hidden_projection": {"focus_dim": 16},
    "message_node_s2": {"message_node_s2": True},
    "node_cartesian": {"node_cartesian": "default:1"},
    "lmax4_odd_channels": {"lmax": 4, "channels": 24, "n_atten_head": 3},
}


def _run(conv, inputs):
    x, cache, radial = inputs
    out = conv(x, cache, radial)
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum(),
                                (x, cache.edge_vec, radial))
    return out.detach(), grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_convolution_and_its_input_gradients_match_deepmd(case):
    conv = make_conv(**CASES[case]).eval()
    fast = accelerated_conv(conv, level=0)
    inputs = conv_inputs(conv, requires_grad=True)
    ref, ref_grads = _run(conv, inputs)
    with mixstack.dispatch_log() as log:
        out, grads = _run(fast, inputs)
    assert log["fwd:reference"] == 1 and log["conv_in:reference"] == 1 and log["conv_out:reference"] == 1
    assert ref.abs().max() > 0
    assert max_rel(out, ref) < FLOAT64_RTOL
    for name, g, r in zip(("x", "edge_vec", "radial"), grads, ref_grads):
        assert r.abs().max() > 0, name
        assert max_rel(g, r) < FLOAT64_RTOL, name


@pytest.mark.parametrize("heads", [0, 1])
def test_source_gate_and_sorted_destinations(heads):
    """SeZM's source gate (bridging mode) weights each message; destinations in any order."""
    conv = make_conv(n_atten_head=heads).eval()
    fast = accelerated_conv(conv)
    for sorted_dst in (False, True):
        inputs = conv_inputs(conv, source_gate=True, sorted_dst=sorted_dst, requires_grad=True)
        ref, ref_grads = _run(conv, inputs)
        out, grads = _run(fast, inputs)
        assert max_rel(out, ref) < FLOAT64_RTOL
        assert all(max_rel(g, r) < FLOAT64_RTOL for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize("case", ["water", "two_stream", "heads0"])
def test_training_gradients_through_a_force_loss(case):
    """Train mode: a loss on the output and on its gradient with respect to the edge vectors
    (a force loss, differentiated twice) gives every parameter the gradient deepmd-kit's path
    gives."""
    conv = make_conv(**CASES[case]).train()
    fast = accelerated_conv(conv, level=0).train()

    def grads(module):
        x, cache, radial = conv_inputs(module, requires_grad=True)
        out = module(x, cache, radial)
        (g_vec,) = torch.autograd.grad(out.square().sum(), cache.edge_vec, create_graph=True)
        loss = out.sum() + g_vec.square().sum()
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = [p for _, p in module.named_parameters() if p.requires_grad]
        return dict(zip(names, torch.autograd.grad(loss, params, allow_unused=True)))

    ref, got = grads(conv), grads(fast)
    assert ref.keys() == got.keys()
    checked = 0
    for name, r in ref.items():
        g = got[name]
        if r is None or not r.abs().max() > 0:
            assert g is None or not g.abs().max() > 0, name
            continue
        assert max_rel(g, r) < 1e-11, name
        checked += 1
    stack_weights = [n for n in ref if n.startswith(("so2_linears", "non_linearities"))]
    assert stack_weights and all(ref[n] is not None for n in stack_weights)
    assert checked > len(ref) // 2


def test_eval_mode_gives_no_weight_gradients_to_the_stack():
    """As deepmd-kit's own fused path, evaluation cuts the stack's weights from the graph (no
    backward spends time on them); train mode keeps them."""
    conv = make_conv()
    fast = accelerated_conv(conv)
    x, cache, radial = conv_inputs(conv)
    for mode, expect in ((False, False), (True, True)):
        fast.train(mode)
        out = fast(x, cache, radial)
        weight = fast.so2_linears[0].weight_m0
        (g,) = torch.autograd.grad(out.sum(), weight, allow_unused=True)
        assert (g is not None) == expect


def test_deepcopy_and_state_dict_keep_the_switch_and_the_keys():
    conv = make_conv()
    fast = accelerated_conv(conv)
    twin = copy.deepcopy(fast)
    assert type(twin) is type(fast)
    assert list(fast.state_dict()) == list(conv.state_dict())
    inputs = conv_inputs(conv)
    assert torch.equal(twin(*inputs), fast(*inputs))


@pytest.mark.parametrize("case", ["water", "two_stream", "two_stream_one_head", "two_stream_no_focus_norm"])
def test_the_stack_runs_without_alpha_and_rotate_out_carries_it(case, monkeypatch):
    """SeZM's competition and attention weights reach rotate-out's edge weight, never the stack's
    alpha: the stack keeps no unscaled result for an alpha gradient (one surface a block fewer)."""
    from mixstack.deepmd import value_path

    seen = {}
    stack, rotate_out = value_path.mixing_stack, value_path.rotate_out_sum

    def spy_stack(*args, **kwargs):
        seen["apply_alpha"] = kwargs["apply_alpha"]
        return stack(*args, **kwargs)

    def spy_rotate_out(*args, **kwargs):
        seen["edge_weight"] = tuple(kwargs["edge_weight"].shape)
        return rotate_out(*args, **kwargs)

    monkeypatch.setattr(value_path, "mixing_stack", spy_stack)
    monkeypatch.setattr(value_path, "rotate_out_sum", spy_rotate_out)
    conv = make_conv(**CASES[case]).eval()
    inputs = conv_inputs(conv, requires_grad=True)
    out, _ = _run(accelerated_conv(conv, level=0), inputs)
    assert max_rel(out, _run(conv, inputs)[0]) < FLOAT64_RTOL
    n_edges, heads = inputs[1].src.shape[0], conv.n_atten_head
    assert seen["apply_alpha"] is False
    assert seen["edge_weight"] == {"water": (n_edges, 1, 1), "two_stream": (n_edges, 2, 2),
                                   "two_stream_one_head": (n_edges, 2, 1),
                                   "two_stream_no_focus_norm": (n_edges, 2)}[case], heads
