"""The sweep's real probe (``tuner.probes.StackProbe``) on the interpreted kernels."""

import pytest
import torch

import mixstack
from mixstack import tuning
from mixstack.measure.timing import time_interleaved
from mixstack.tuner.probes import N_LAYERS, StackProbe

KEY = tuning.shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True)
ROW = KEY.layout.row


@pytest.fixture(scope="module")
def relay_probe():
    return StackProbe("stack_bwd_relay", KEY, edges=65, partial_edges=33)    # small sets: interpreted


def test_the_probe_checks_a_partial_tile_and_the_timing_set(relay_probe):
    assert StackProbe("stack_bwd_relay", KEY).partial_edges % 2 == 1     # by default no block size divides it
    assert relay_probe.partial_edges % 2 == 1
    with tuning.saved_registrations(), mixstack.use_level(2):
        outputs, counts = relay_probe.run(None)
    shapes = [lambda e: (e, 1, ROW), lambda e: (1, e, ROW), lambda e: (e, 1)]   # result, grad_u0, grad_alpha
    assert [tuple(t.shape) for t in outputs] == [s(e) for e in (relay_probe.partial_edges, relay_probe.edges)
                                                 for s in shapes]
    assert all(bool(torch.isfinite(t).all()) and t.abs().sum() > 0 for t in outputs)
    assert counts["fwd:triton"] == 2 and counts["bwd:relay"] == 2 and not counts["bwd:fused"]


def test_the_probe_keeps_the_fused_backward_out_of_relay_runs_and_restores_registrations(
        relay_probe, monkeypatch):
    fused_cfg = tuning.candidates("stack_bwd_fused", KEY)[0]
    with tuning.saved_registrations():
        tuning.register("stack_bwd_fused", KEY, fused_cfg)
        seen = []
        real = relay_probe._fwd_bwd

        def spy(inp):
            seen.append((tuning.lookup("stack_bwd_fused", KEY), tuning.lookup("stack_bwd_relay", KEY)))
            return real(inp)
        monkeypatch.setattr(relay_probe, "_fwd_bwd", spy)
        with mixstack.use_level(2):
            relay_probe.run(None)
        assert seen == [(None, None), (None, None)]
        assert tuning.lookup("stack_bwd_fused", KEY) == fused_cfg   # restored

        def boom(inp):
            raise RuntimeError("boom")
        monkeypatch.setattr(relay_probe, "_fwd_bwd", boom)
        before = tuning.registrations()
        with pytest.raises(RuntimeError, match="boom"):
            relay_probe.run(tuning.candidates("stack_bwd_relay", KEY)[0])
        assert tuning.registrations() == before


def test_the_backward_task_times_the_backward_with_the_forward_in_setup(relay_probe):
    task = relay_probe.task(None)
    assert task.setup is not None
    with tuning.saved_registrations(), mixstack.use_level(2), mixstack.dispatch_log() as log:
        state = task.setup()
        assert log["fwd:triton"] == 1 and not log["bwd:relay"]
        task.run(state)
        assert log["bwd:relay"] == 1
        samples = time_interleaved({"baseline": task}, rounds=1, warmup=0)
    assert samples["baseline"].median > 0


def test_the_weight_reduction_probe_returns_and_times_the_weight_gradients():
    probe = StackProbe("stack_wgrad", KEY, edges=65, partial_edges=33)
    with tuning.saved_registrations(), mixstack.use_level(2):
        outputs, counts = probe.run(None)
    names = ("result", "grad_u0", "grad_alpha", "grad_w0", "grad_w1", "grad_gw")
    assert len(outputs) == 2 * len(names)
    n = N_LAYERS
    assert [tuple(t.shape) for t in outputs[3:6]] == [(n, 1, 32, 32), (n, 1, 32, 32), (n - 1, 1, 16, 16)]
    assert counts["wgrad:triton"] == 2 and not counts["cfg:stack_wgrad"]
    task = probe.task(tuning.candidates("stack_wgrad", KEY)[0])
    with tuning.saved_registrations(), mixstack.use_level(2), mixstack.dispatch_log() as log:
        state = task.setup()
        assert not log["wgrad:triton"]
        task.run(state)
    assert log["wgrad:triton"] == 1 and log["cfg:stack_wgrad"] == 1


@pytest.mark.parametrize("family", ["stack_fwd", "stack_bwd_relay", "stack_bwd_fused",
                                    pytest.param("stack_compensated", marks=pytest.mark.slow), "stack_wgrad",
                                    pytest.param("stack_wgrad_compensated", marks=pytest.mark.slow)])
def test_a_familys_validity_hash_covers_every_kernel_its_runs_launch(family, monkeypatch):
    """An entry stays valid while the kernels its family names (and what they reach) are
    unchanged, so a kernel its runs launch but the family does not name would let a stale entry
    stand."""
    import mixstack.stack.gemm
    import mixstack.stack.launchers
    import mixstack.stack.training
    from mixstack.tuning import families, kernel_hash
    launched = set()
    real = mixstack.stack.launchers.wrap_triton

    def spy(kernel):
        launched.add(kernel_hash.root_of(kernel))
        return real(kernel)
    monkeypatch.setattr(mixstack.stack.launchers, "wrap_triton", spy)
    monkeypatch.setattr(mixstack.stack.training, "wrap_triton", spy)
    monkeypatch.setattr(mixstack.stack.gemm, "wrap_triton", spy)
    probe = StackProbe(family, KEY, edges=33, partial_edges=17)
    fam = families.family(family)
    with tuning.saved_registrations(), mixstack.use_level(fam.candidate_level):
        probe.run(tuning.candidates(family, KEY)[0])
    with tuning.saved_registrations(), mixstack.use_level(2):
        probe.run(None)
    assert launched
    assert launched <= set(fam.kernels), launched
