"""mixstack inside deepmd-kit's freeze (``mixstack.deepmd.freeze``), on a CPU: the accelerated
model's export trace records the stacks and the convolutions as ``mixstack::`` operators under a
CUDA kernel target and
gives the eager frame; the hooks around deepmd-kit's ``freeze_sezm_to_pt2`` open that target for a
CUDA freeze only and hand the model's stack keys to mixstack's freeze-time tuner."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import SMALL, make_model, one_torch_thread, require_deepmd  # noqa: F401

import mixstack
from mixstack.deepmd import accelerate, systems
from mixstack.deepmd.frame import edge_inputs
from mixstack.dispatch import guards

require_deepmd()

MIXSTACK_OPS = {"mixstack.stack_forward.default", "mixstack.stack_backward.default"}
CONV_OPS = {"mixstack.rotate_in.default", "mixstack.rotate_in_backward.default", "mixstack.rotate_out_sum.default",
            "mixstack.rotate_out_sum_backward.default"}


def _lower_inputs(model, n=12):
    return edge_inputs(model, *systems.water(n, seed=0, dtype=torch.float32)) + (None, None, None)


def _mixstack_ops(graph) -> set:
    return {str(n.target) for n in graph.graph.nodes if n.op == "call_function" and "mixstack" in str(n.target)}


@pytest.mark.slow
def test_the_export_trace_records_the_stack_operators_under_a_cuda_target():
    model = make_model("water", "float32", rcut=3.0, **SMALL)       # its three traces grow with the blocks
    accelerate(model)
    inputs = _lower_inputs(model)
    with mixstack.use_level(2):
        plain = model.forward_common_lower_exportable(*inputs)
        with guards.kernel_target("cuda"):
            traced = model.forward_common_lower_exportable(*inputs)
    assert _mixstack_ops(plain) == set() and MIXSTACK_OPS | CONV_OPS <= _mixstack_ops(traced)
    out, ref = traced(*inputs), model.forward_common_lower(*inputs[:6])
    for key in ("energy", "energy_derv_r", "energy_derv_c_redu"):
        scale = ref[key].abs().max().item()
        assert (out[key].double() - ref[key].double()).abs().max().item() <= 1e-5 * scale, key
    exported = torch.export.export(traced, inputs, strict=False)
    assert MIXSTACK_OPS | CONV_OPS <= _mixstack_ops(exported)


def test_the_freeze_hooks_open_the_target_for_cuda_and_tune_the_models_keys(monkeypatch):
    from deepmd.pt.entrypoints import freeze_pt2

    from mixstack.deepmd import freeze

    seen = {}

    def fake_freeze(ckpt_path, out_path, *, device=None, head=None):
        seen.setdefault("targeted", []).append(guards._targeted())
        return "frozen"

    def fake_tables(model, target_device):
        seen["tables"] = target_device

    def fake_tuner(keys, device, level, **kw):
        seen["tuned"] = (keys, device, level)
        return "tuned"
    monkeypatch.setattr(freeze_pt2, "freeze_sezm_to_pt2", fake_freeze)
    monkeypatch.setattr(freeze_pt2, "_tune_triton_configs", fake_tables)
    monkeypatch.setattr(freeze, "tune_for_freeze", fake_tuner)
    freeze.install()
    freeze.install()                                                 # idempotent
    assert freeze_pt2.freeze_sezm_to_pt2.__wrapped__ is fake_freeze
    assert freeze_pt2.freeze_sezm_to_pt2("in.pt", "out.pt2", device=torch.device("cuda")) == "frozen"
    assert freeze_pt2.freeze_sezm_to_pt2("in.pt", "out.pt2", device=torch.device("cpu")) == "frozen"
    assert seen["targeted"] == [True, False] and not guards._targeted()
    model = make_model("two_stream", "float32")
    accelerate(model)
    with mixstack.use_level(3):
        freeze_pt2._tune_triton_configs(model, torch.device("cpu"))
    keys, device, level = seen["tuned"]
    assert seen["tables"] == device == torch.device("cpu") and level == 3
    assert [(k.focus_dim, k.lmax, k.n_focus, k.apply_alpha) for k in keys] == [(32, 3, 2, False)]
    freeze.uninstall()
    assert freeze_pt2.freeze_sezm_to_pt2 is fake_freeze and freeze_pt2._tune_triton_configs is fake_tables


def test_the_expt_freeze_hook_tunes_the_rebuilt_models_keys_and_opens_the_target(monkeypatch):
    """PT-expt's freeze rebuilds the model from its serialized form and traces it on the CPU for its
    target device: for a CUDA target the hook tunes that model's stack keys first and traces inside
    the kernel target; for a CPU target it changes nothing."""
    pytest.importorskip("deepmd.pt_expt")
    from deepmd.pt_expt.utils import env, serialization

    from mixstack.deepmd import freeze

    seen = {}

    def fake_trace(data, *args, **kwargs):
        seen.setdefault("targeted", []).append(guards._targeted())
        return "exported"

    def fake_tuner(keys, device, level, **kw):
        seen["tuned"] = ([(k.focus_dim, k.lmax, k.n_focus, k.apply_alpha) for k in keys], device)
        return "tuned"
    model = make_model("two_stream", "float32", backend="pt_expt")
    accelerate(model)
    data = {"model": model.serialize()}
    monkeypatch.setattr(serialization, "_trace_and_export", fake_trace)
    monkeypatch.setattr(freeze, "tune_for_freeze", fake_tuner)
    monkeypatch.setattr(freeze, "check_level3", lambda keys, device, level: "")
    monkeypatch.setattr(freeze.torch.cuda, "is_available", lambda: False)     # no device to enter here
    freeze.install_expt()
    freeze.install_expt()                                            # idempotent
    assert serialization._trace_and_export.__wrapped__ is fake_trace
    monkeypatch.setattr(env, "DEVICE", torch.device("cpu"))
    assert serialization._trace_and_export(data) == "exported" and "tuned" not in seen
    from mixstack.deepmd import plugin
    plugin.install_expt()                                            # the rebuilt model is accelerated
    try:
        monkeypatch.setattr(env, "DEVICE", torch.device("cuda"))
        assert serialization._trace_and_export(data) == "exported"
    finally:
        plugin.uninstall()
    assert seen["targeted"] == [False, True] and not guards._targeted()
    assert seen["tuned"] == ([(32, 3, 2, False)], torch.device("cuda"))
    assert serialization._trace_and_export is fake_trace


def test_both_freeze_routes_compile_with_a_private_cxx_runtime_when_asked(monkeypatch):
    """``MIXSTACK_PRIVATE_CXX_RUNTIME=1``: Inductor's compiler is the private-runtime wrapper
    inside ``dp --pt freeze``'s freeze and PT-expt's ``.pt2`` writer, and only there."""
    import torch._inductor.config as inductor
    from deepmd.pt.entrypoints import freeze_pt2
    from deepmd.pt_expt.utils import serialization

    from mixstack import cxx_runtime
    from mixstack.deepmd import freeze

    seen = []

    def record(*args, **kwargs):
        seen.append(inductor.cpp.cxx)
        return "done"

    monkeypatch.setattr(freeze_pt2, "freeze_sezm_to_pt2", record)
    monkeypatch.setattr(serialization, "_deserialize_to_file_pt2", record)
    freeze.install()
    freeze.install_expt()
    try:
        before = inductor.cpp.cxx
        monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", "1")
        assert freeze_pt2.freeze_sezm_to_pt2("in.pt", "out.pt2", device=torch.device("cpu")) == "done"
        assert serialization._deserialize_to_file_pt2("out.pt2", {}) == "done"
        monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", "0")
        serialization._deserialize_to_file_pt2("out.pt2", {})
        wrapper = (cxx_runtime.private_runtime_compiler(),)
        assert seen == [wrapper, wrapper, before] and inductor.cpp.cxx == before
    finally:
        freeze.uninstall()
        freeze.uninstall_expt()
    assert freeze_pt2.freeze_sezm_to_pt2 is record and serialization._deserialize_to_file_pt2 is record


def test_single_rank_freezes_skip_the_with_comm_artifact_and_all_ranks_restores_it():
    """``MIXSTACK_FREEZE_SINGLE_RANK``: the two gates deepmd-kit's freezes ask before their second
    AOTInductor compile (the multi-rank with-comm graph) answer no, for a PT model and a PT-expt
    one; ``all_ranks`` gives deepmd-kit's answers back; the freezes still ask those gates."""
    import inspect

    from deepmd.pt.entrypoints import freeze_pt2
    from deepmd.pt_expt.utils import serialization

    from mixstack.deepmd import freeze

    pt, expt = make_model("water", "float32", **SMALL), make_model("water", "float32", backend="pt_expt", **SMALL)
    assert "model.supports_edge_parallel()" in inspect.getsource(freeze_pt2.freeze_sezm_to_pt2)
    assert "_needs_with_comm_artifact(" in inspect.getsource(serialization)
    assert pt.supports_edge_parallel() and serialization._needs_with_comm_artifact(expt, "graph")
    try:
        freeze.single_rank()
        freeze.single_rank_expt()
        freeze.single_rank()                                        # idempotent
        assert not pt.supports_edge_parallel()
        assert not serialization._needs_with_comm_artifact(expt, "graph")
    finally:
        freeze.all_ranks()
    assert pt.supports_edge_parallel() and serialization._needs_with_comm_artifact(expt, "graph")


def test_the_single_rank_switch_is_read_by_both_plugins_and_a_bad_value_is_named():
    import os
    import subprocess
    import sys

    code = ("from mixstack.deepmd.compat import deepmd_pt; deepmd_pt(); import deepmd.pt_expt\n"
            "import mixstack.deepmd.plugin, mixstack.deepmd.plugin_expt\n"
            "from deepmd.pt.model.model import sezm_model; from deepmd.pt_expt.utils import serialization\n"
            "print(sezm_model.SeZMModel.supports_edge_parallel.__name__, "
            "serialization._needs_with_comm_artifact.__name__)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "MIXSTACK_DEEPMD": "0"}
    for value, want in (("1", "no no"), ("0", "supports_edge_parallel _needs_with_comm_artifact")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={**env, "MIXSTACK_FREEZE_SINGLE_RANK": value})
        assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == want, out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "MIXSTACK_FREEZE_SINGLE_RANK": "yes"})
    assert out.returncode != 0 and "MIXSTACK_FREEZE_SINGLE_RANK must be 0 or 1" in out.stderr
