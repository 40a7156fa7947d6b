"""deepmd-kit's PT-expt backend (``deepmd.pt_expt``, ``dp --pt-expt``): its DPA4 convolutions on
mixstack's operators (level 0 here; the kernels in tests/interpret/test_deepmd_interp.py) give its
own energies, forces and virials, periodic and open, padded neighbour layout included."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import (  # noqa: F401
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
from mixstack import export
from mixstack.deepmd import accelerate, restore, systems
from mixstack.deepmd.options import unsupported_reason

require_deepmd()
pytest.importorskip("deepmd.pt_expt")


@pytest.mark.parametrize("name", ["water", "two_stream"])
@pytest.mark.parametrize("periodic", [True, False], ids=["periodic", "open"])
def test_accelerated_expt_model_gives_deepmds_frame(name, periodic):
    model = make_model(name, "float64", backend="pt_expt")
    frame = cast_frame(systems.water(30, seed=2, periodic=periodic), torch.float64)
    want = model_outputs(model, frame)
    fast, report = accelerated_copy(model)
    assert len(report.on_mixstack) == len(report) == 2, report
    assert type(fast.atomic_model.descriptor.blocks[0].so2_conv).__name__ == "MixstackDPA4Convolution"
    with mixstack.use_level(0), mixstack.dispatch_log() as log:
        got = model_outputs(fast, frame)
    assert log["fwd:reference"] == 2 and log["conv_in:reference"] == 2, dict(log)     # mixstack's operators ran
    for key in KEYS:
        assert max_rel(got[key], want[key]) <= FLOAT64_RTOL, key
    assert got["force"].abs().max() > 0


def test_restore_and_accelerate_again_round_trip():
    model = make_model("water", "float64", backend="pt_expt")
    frame = cast_frame(systems.water(24, seed=1), torch.float64)
    want = model_outputs(model, frame)
    first = accelerate(model, level=0)
    assert len(first.on_mixstack) == 2 and accelerate(model, level=0) == first        # idempotent
    assert export.stack_keys(model)                          # the freeze-time tuner finds its keys
    assert restore(model) == 2
    assert type(model.atomic_model.descriptor.blocks[0].so2_conv).__module__.startswith("deepmd.pt_expt")
    assert model.atomic_model.descriptor._need_full_wigner
    got = model_outputs(model, frame)
    assert all(torch.equal(got[k], want[k]) for k in KEYS)      # deepmd-kit's own path again, bit for bit


def test_expt_options_and_overrides_are_checked_as_for_pytorch():
    model = make_model("water", "float64", backend="pt_expt", so2_norm=True)
    report = accelerate(model)
    assert report.on_mixstack == () and report.convolutions[0].reason.startswith("so2_norm")
    conv = make_model("water", "float64", backend="pt_expt").atomic_model.descriptor.blocks[0].so2_conv

    class Changed(type(conv)):
        def call(self, x, edge_cache, radial_feat):          # a subclass that changes the math
            return x

    conv.__class__ = Changed
    assert unsupported_reason(conv) == "Changed overrides SO2Convolution.forward"


def test_a_descriptor_accelerated_as_built_keeps_its_trainable_parameters():
    """With the plugin, PT-expt's descriptor is accelerated inside its ``__init__``; PT-expt then
    promotes trainable arrays to Parameters by class name (after building and after deserializing):
    the accelerated convolutions' attention weights must be Parameters that get gradients, as in
    the unaccelerated descriptor."""
    from deepmd.pt_expt.descriptor.dpa4 import DescrptDPA4

    from mixstack.deepmd import plugin

    model = make_model("water", "float64", backend="pt_expt")
    data = model.atomic_model.descriptor.serialize()
    plain = DescrptDPA4.deserialize(data)
    plugin.install_expt()
    try:
        fast = DescrptDPA4.deserialize(data)
    finally:
        plugin.uninstall()
    assert type(fast.blocks[0].so2_conv).__name__ == "MixstackDPA4Convolution"
    names = {n for n, p in plain.named_parameters() if p.requires_grad}
    assert "blocks.0.so2_conv.adamw_attn_logit_w" in names
    assert {n for n, p in fast.named_parameters() if p.requires_grad} == names
