"""Whole deepmd-kit models (the DPA4 examples' configs) accelerated against themselves: energy,
forces and virial in float64 at level 0, frames bitwise run to run, unsupported options left on
deepmd-kit's path, ``restore``, a training step's parameter gradients."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import (  # noqa: F401  (one_torch_thread: a fixture)
    FLOAT64_RTOL,
    KEYS,
    accelerated_copy,
    cast_frame,
    make_model,
    max_rel,
    model_outputs,
    one_torch_thread,
    require_deepmd,
)

import mixstack
from mixstack.deepmd import restore, systems

require_deepmd()


def _frames():
    periodic = systems.water(12, seed=1)
    coord, atype, box = periodic
    odd = (coord[:, :-1], atype[:, :-1], box)                           # 11 atoms, one H short
    cluster = systems.water(12, seed=2, periodic=False)
    return {"periodic": periodic, "odd": odd, "cluster": cluster,
            "isolated_atom": systems.with_isolated_atom(cluster)}


FRAMES = _frames()


def _assert_close(out, ref, rtol=FLOAT64_RTOL):
    for key in KEYS:
        assert ref[key].abs().max() > 0, key
        assert max_rel(out[key], ref[key]) < rtol, (key, max_rel(out[key], ref[key]))


@pytest.mark.parametrize("name, heads", [("water", 1), ("water", 0), ("water", 2), ("two_stream", 1),
                                         ("default", 1)])
def test_accelerated_model_matches_deepmd_in_float64(name, heads):
    model = make_model(name, "float64", n_atten_head=heads)
    fast, report = accelerated_copy(model, level=0)
    n_blocks = len(model.atomic_model.descriptor.blocks)
    assert len(report.on_mixstack) == len(report) == n_blocks
    assert report.full_wigner_skipped == ("atomic_model.descriptor",)
    frames = FRAMES if (name, heads) == ("water", 1) else {"periodic": FRAMES["periodic"]}
    for label, frame in frames.items():
        with mixstack.dispatch_log() as log:
            out = model_outputs(fast, frame)
        assert log["fwd:reference"] == n_blocks and log["conv_out:reference"] == n_blocks, label
        _assert_close(out, model_outputs(model, frame))


def test_isolated_atom_gets_exactly_what_deepmd_gives_it():
    model = make_model("water", "float64")
    fast, _ = accelerated_copy(model)
    frame = FRAMES["isolated_atom"]
    ref, out = model_outputs(model, frame), model_outputs(fast, frame)
    assert torch.equal(out["force"][0, -1], ref["force"][0, -1])


def test_frames_at_level_0_are_bitwise_run_to_run_on_one_thread():
    """(Levels 1-3: the interpreter's test.  At level 0 with several threads, mixstack's reference
    rotate_in's backward is not: docs/deepmd.md, "Determinism".)"""
    model = make_model("two_stream", "float32")
    fast, _ = accelerated_copy(model, level=0)
    frame = cast_frame(FRAMES["periodic"], torch.float32)
    first, second = model_outputs(fast, frame), model_outputs(fast, frame)
    assert all(torch.equal(first[k], second[k]) for k in KEYS)


def test_a_block_with_an_unsupported_option_stays_on_deepmd_and_the_model_stays_exact():
    """Per-block ``mmax`` (``m_schedule``): block 0 runs on mixstack, block 1 (mmax 2) stays on
    deepmd-kit's path with its reason, and the descriptor keeps building the Wigner blocks."""
    model = make_model("water", "float64", m_schedule=[1, 2])
    fast, report = accelerated_copy(model)
    blocks = fast.atomic_model.descriptor.blocks
    assert [c.runs_on for c in report] == ["mixstack", "deepmd"]
    assert report.convolutions[1].reason.startswith("mmax 2")
    assert type(blocks[1].so2_conv).__name__ == "SO2Convolution"
    assert report.full_wigner_skipped == ()
    _assert_close(model_outputs(fast, FRAMES["periodic"]), model_outputs(model, FRAMES["periodic"]))


def test_a_model_mixstack_cannot_take_is_left_alone_bit_for_bit():
    model = make_model("water", "float64", layer_scale=True)
    fast, report = accelerated_copy(model)
    assert report.on_mixstack == () and len(report.on_deepmd) == 2
    assert all(c.reason.startswith("layer_scale") for c in report)
    ref, out = model_outputs(model, FRAMES["periodic"]), model_outputs(fast, FRAMES["periodic"])
    assert all(torch.equal(out[k], ref[k]) for k in KEYS)


def test_restore_returns_the_model_to_deepmd_bit_for_bit():
    model = make_model("water", "float64")
    fast, _ = accelerated_copy(model)
    assert restore(fast) == 2
    assert fast.atomic_model.descriptor._need_full_wigner
    ref, out = model_outputs(model, FRAMES["periodic"]), model_outputs(fast, FRAMES["periodic"])
    assert all(torch.equal(out[k], ref[k]) for k in KEYS)


def test_a_training_step_gives_deepmd_parameter_gradients():
    """Train mode (deepmd-kit's random roll of its edge frames included): an energy + force
    loss, differentiated through the force (double backward), gives every parameter the gradient
    of the unaccelerated model."""
    model = make_model("water", "float64").train()
    fast, _ = accelerated_copy(model, level=0)
    fast.train()

    def grads(m):
        out = m(*[t if t is None else t.clone() for t in FRAMES["periodic"]])
        loss = out["energy"].square().sum() + out["force"].square().sum() + out["virial"].square().sum()
        params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
        return dict(zip([n for n, _ in params], torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)))

    ref, got = grads(model), grads(fast)
    conv_params = [n for n in ref if ".so2_conv.so2_linears." in n]
    assert conv_params and all(ref[n] is not None and ref[n].abs().max() > 0 for n in conv_params)
    for name, r in ref.items():
        if r is None:
            assert got[name] is None, name
            continue
        assert max_rel(got[name], r) < 1e-10, name


# deepmd-kit's SeZM test model (its TestSeZMModelCompile's): lmax 1 then 0, 4 channels, one mixing
# layer; the weight's 16 x 16 blocks split at 8 and 12, inside one of Inductor's CPU vectors
TINY_SEZM = {
    "type": "SeZM", "type_map": ["A", "B"],
    "descriptor": {"type": "SeZM", "sel": [2, 2], "rcut": 3.0, "channels": 4, "n_focus": 1, "n_radial": 3,
                   "radial_mlp": [6], "use_env_seed": True, "l_schedule": [1, 0], "mmax": 1, "so2_norm": False,
                   "so2_layers": 1, "n_atten_head": 1, "sandwich_norm": [True, False, True, False],
                   "ffn_neurons": 8, "ffn_blocks": 1, "s2_activation": [False, True], "mlp_bias": False,
                   "layer_scale": False, "use_amp": False, "activation_function": "silu", "glu_activation": True,
                   "precision": "float32", "seed": 7},
    "fitting_net": {"neuron": [8], "activation_function": "silu", "precision": "float32", "seed": 7},
}


@pytest.mark.slow
@pytest.mark.skipif(not torch.__version__.startswith("2.11"),
                    reason="deepmd-kit 3.2's compiled training runs on torch 2.11 (on 2.13 its compiled "
                           "frame aborts the process with or without mixstack)")
def test_deepmd_kits_training_compile_takes_the_accelerated_model():
    """deepmd-kit's compiled training (``use_compile``: its make_fx trace of the frame, Inductor on
    the CPU) of an accelerated model: an energy + force loss differentiated twice compiles and
    gives the uncompiled model's gradients.  A weight block taken by slice failed to compile here
    (Inductor's C++ vectoriser, torch 2.11: a masked blend of a float)."""
    from mixstack.deepmd.configs import build_model

    torch.manual_seed(1234)
    eager = build_model(dict(TINY_SEZM, use_compile=False))
    with torch.no_grad():
        for p in eager.parameters():                 # not deepmd-kit's zeros: they hide second-order terms
            p.copy_(torch.randn_like(p) * 0.1)
    compiled = build_model(dict(TINY_SEZM, use_compile=True))
    compiled.load_state_dict(eager.state_dict())
    coord = torch.tensor([[[0.0, 0.0, 0.0], [1.1, 0.3, 0.0], [0.2, 1.5, 0.4], [1.7, 1.2, 0.2], [2.3, 0.1, 1.0],
                           [0.8, 2.2, 1.1], [2.6, 1.8, 1.5]]])
    atype = torch.tensor([[0, 1, 0, 1, 0, 1, 0]])
    box = 8.0 * torch.eye(3).reshape(1, 9)
    grads = []
    for model in (eager, compiled):
        mixstack.deepmd.accelerate(model, level=0)
        model.train()
        out = model(coord.clone(), atype, box=box.clone())
        (out["energy"].sum() + out["force"].square().sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(".so2_linears." in n for n in grads[0])
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, rtol=1e-4, atol=1e-6), name


def test_accelerate_names_its_bad_arguments():
    from mixstack.deepmd import accelerate

    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        accelerate("model")
    with pytest.raises(ValueError, match="level must be None or in 0..3, got 5"):
        accelerate(torch.nn.Linear(1, 1), level=5)
    with pytest.raises(TypeError, match="level must be None or an int"):
        accelerate(torch.nn.Linear(1, 1), level="2")
    assert len(accelerate(torch.nn.Linear(1, 1))) == 0
