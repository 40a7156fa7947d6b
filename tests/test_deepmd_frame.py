"""``mixstack.deepmd.FrameRunner`` and ``DeepmdCalculator`` on a CPU (the frame runs eagerly): the
same energies, forces and virial as deepmd-kit's own frame, periodic and open; the kept list with a
skin, its rebuilds and their reasons, the capacity that grows on an overflow, buffers refilled in
place; errors that name the argument; the ASE calculator against deepmd-kit's; deepmd-kit's
compiled inference (``compile=True``) with mixstack's operators traced inside, against the eager
runner and the float64 twin, and ``accelerate`` / ``restore`` dropping a compiled graph."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from deepmd_cases import (
    KEYS,
    SMALL,
    accelerated_copy,
    cast_frame,
    float64_twin,
    fp32_tolerance,
    make_model,
    model_outputs,
    require_deepmd,  # noqa: F401
)

from mixstack.deepmd import FrameRunner, accelerate, restore, systems
from mixstack.deepmd.frame import edge_inputs, search

require_deepmd()


@pytest.fixture(scope="module")
def model():
    return make_model("water", "float32", rcut=3.0)


def _frame(n=30, seed=0, periodic=True):
    return systems.water(n, seed=seed, periodic=periodic, dtype=torch.float32)


def _close(out, ref, rel=1e-5):
    for key in KEYS:
        scale = ref[key].abs().max().item()
        assert (out[key].double() - ref[key].double()).abs().max().item() <= rel * scale + 1e-12, key


@pytest.mark.parametrize("periodic", [True, False])
def test_the_runner_gives_deepmds_frame(model, periodic):
    coord, atype, box = _frame(periodic=periodic)
    runner = FrameRunner(model)
    out = runner(coord, atype, box)
    ref = model_outputs(model, (coord, atype, box))
    twin = model_outputs(float64_twin(model, "water", rcut=3.0), (coord.double(), atype, None if box is None else
                                                                   box.double()))
    for key in KEYS:
        assert out[key].dtype == ref[key].dtype and out[key].shape == ref[key].shape, key
        tol = fp32_tolerance(ref[key], twin[key])
        assert (out[key].double() - twin[key]).abs().max().item() <= tol, key
    assert out["atom_energy"].shape == (1, coord.shape[1], 1)
    assert runner.calls == runner.rebuilds == 1 and runner.captures == 0 and runner.last_reason == "no list yet"
    assert runner.edge_capacity >= 256 and runner.candidate_capacity >= runner.edge_capacity


def test_the_candidates_are_sorted_and_do_not_depend_on_the_search_order():
    coord, _, box = _frame(60, seed=2)
    i, j, s = search(coord[0], box.reshape(9), 4.0)
    key = (i * 60 + j) * 1000 + (s[:, 0] + 1) * 100 + (s[:, 1] + 1) * 10 + (s[:, 2] + 1)
    assert torch.all(key[1:] > key[:-1])                       # strictly increasing: sorted, no duplicates
    vec = coord[0][j] - coord[0][i] + s.float() @ box.reshape(3, 3)
    assert float(vec.norm(dim=1).max()) < 4.0 + 1e-4


def test_a_small_move_keeps_the_list_a_large_one_rebuilds_it_in_place(model):
    coord, atype, box = _frame(seed=1)
    runner = FrameRunner(model, skin=0.6)
    runner(coord, atype, box)
    cand, pointer = runner._cand, runner._cand.src.data_ptr()
    moved = coord.clone()
    moved[0, :, 0] += 0.05
    _close(runner(moved, atype, box), model_outputs(model, (moved, atype, box)))
    assert runner.rebuilds == 1
    spent = runner.seconds["rebuild"]
    assert spent > 0 and runner.seconds["capture"] == 0                       # no graph on a CPU
    far = moved.clone()
    far[0, 3, 1] += 0.35                                      # past half the skin: a pair may have come in
    _close(runner(far, atype, box), model_outputs(model, (far, atype, box)))
    assert runner.rebuilds == 2 and runner.last_reason == "an atom moved more than half the skin"
    assert runner.seconds["rebuild"] > spent                                  # the second search counted
    first, second = runner.events                                             # each rebuild, as it went
    assert first["reason"] == "no list yet" and first["new_buffers"] and first["call"] == 1
    assert second["what"] == "rebuild" and not second["new_buffers"] and second["call"] == 3
    assert second["edges"] <= second["edge_capacity"] and second["candidates"] <= second["candidate_capacity"]
    assert runner._cand is cand and runner._cand.src.data_ptr() == pointer      # refilled in place


def test_an_overflow_grows_the_capacity_and_drops_no_edge(model):
    coord, atype, box = _frame(seed=3)
    runner = FrameRunner(model)
    ref = runner(coord, atype, box)
    runner.edge_capacity = 8                                  # as if the count had outgrown the buffer
    runner._pad = runner._pad[:8]
    out = runner(coord, atype, box)
    assert runner.rebuilds == 2 and runner.last_reason == "more edges within the cutoff than the capacity"
    assert runner.edge_capacity >= 256
    _close(out, ref, rel=0)


def test_a_climbing_count_doubles_the_headroom_up_to_its_cap_and_new_atoms_reset_it(model, monkeypatch):
    from mixstack.deepmd import frame as frame_module

    coord, atype, box = _frame(seed=3)
    runner = FrameRunner(model)
    ref = runner(coord, atype, box)
    assert runner.growths == 0 and runner._room() == pytest.approx(1.005)
    asked = []
    real = frame_module.edge_capacity
    monkeypatch.setattr(frame_module, "edge_capacity", lambda n, *a, **k: asked.append(n) or real(n, *a, **k))
    for growths in (1, 2, 3, 3):                               # each overflow: the margin doubles, then stays
        runner.edge_capacity = 8
        runner._pad = runner._pad[:8]
        _close(runner(coord, atype, box), ref, rel=0)
        assert runner.growths == growths and runner.last_reason == "more edges within the cutoff than the capacity"
        inside = int(runner._pairs(coord[0], box.reshape(9), atype[0], runner._cand)[1].sum())
        assert asked[-1] == int(inside * (1 + 0.005 * 2 ** growths))       # the edges asked for
    assert runner._room() == pytest.approx(1.04)
    monkeypatch.setattr(frame_module, "CAPACITY_HEADROOM", 1.05)  # a margin of a few edges at this size
    runner.growths, runner.edge_capacity = 0, inside           # holds the count, not its margin: it must grow
    runner._rebuild(coord[0], box.reshape(9), atype[0], "test")
    assert runner.growths == 1 and runner.edge_capacity > inside
    runner.growths = 3
    runner.candidate_capacity = 1                              # the candidates outgrew theirs: counted once
    before = runner.rebuilds
    runner._rebuild(coord[0], box.reshape(9), atype[0], "test")
    assert runner.growths == 3 and runner.rebuilds == before + 1
    more = _frame(36, seed=3)                                  # other atoms: the margin starts over
    runner(*more)
    assert runner.growths == 0 and runner.last_reason == "the atoms changed"


def test_a_changed_box_or_atom_count_rebuilds(model):
    coord, atype, box = _frame(seed=4)
    runner = FrameRunner(model, skin=1.0)
    runner(coord, atype, box)
    bigger = box * 1.01
    _close(runner(coord * 1.01, atype, bigger), model_outputs(model, (coord * 1.01, atype, bigger)))
    assert runner.rebuilds == 2 and runner.last_reason == "the box changed"
    c2, a2, b2 = _frame(60, seed=4)
    _close(runner(c2, a2, b2), model_outputs(model, (c2, a2, b2)))
    assert runner.rebuilds == 3 and runner.last_reason == "the atoms changed"


def test_skin_zero_searches_every_frame(model):
    coord, atype, box = _frame(seed=5)
    runner = FrameRunner(model, skin=0)
    for _ in range(3):
        out = runner(coord, atype, box)
    assert runner.rebuilds == 3 and runner.last_reason.startswith("skin 0")
    _close(out, model_outputs(model, (coord, atype, box)))


def test_bad_input_is_named(model):
    coord, atype, box = _frame()
    runner = FrameRunner(model)
    with pytest.raises(ValueError, match="one frame a call"):
        runner(coord.expand(2, -1, -1), atype.expand(2, -1), box)
    with pytest.raises(ValueError, match="atype must hold one type per atom"):
        runner(coord, atype[:, :-1], box)
    with pytest.raises(ValueError, match="box must hold the 3 x 3 cell"):
        runner(coord, atype, box[:, :6])
    with pytest.raises(ValueError, match="skin must be >= 0"):
        FrameRunner(model, skin=-1)
    with pytest.raises(TypeError, match="forward_common_lower"):
        FrameRunner(torch.nn.Linear(2, 2))
    model.train()
    try:
        with pytest.raises(ValueError, match="model.eval"):
            FrameRunner(model)
    finally:
        model.eval()
    pytest.importorskip("deepmd.pt_expt")
    with pytest.raises(TypeError, match="PT-expt model"):
        FrameRunner(make_model("water", "float32", backend="pt_expt"))


@pytest.mark.slow
def test_the_calculator_matches_deepmds_and_runs_md(model, tmp_path):
    pytest.importorskip("ase")
    from deepmd.calculator import DP

    from mixstack.bench import deepmd_md
    from mixstack.deepmd import DeepmdCalculator, configs

    path = os.path.join(tmp_path, "model.pt")
    deepmd_md.save_checkpoint(model, configs.model_config("water", rcut=3.0), path)
    atoms = deepmd_md.atoms_of(systems.water(30, seed=6), ["O", "H"])
    ours, theirs = DeepmdCalculator(path, device="cpu"), DP(model=path)
    a, b = atoms.copy(), atoms.copy()
    a.calc, b.calc = ours, theirs
    assert a.get_potential_energy() == pytest.approx(b.get_potential_energy(), rel=1e-6)
    assert abs(a.get_forces() - b.get_forces()).max() <= 1e-5 * abs(b.get_forces()).max()
    assert abs(a.get_stress() - b.get_stress()).max() <= 1e-5 * abs(b.get_stress()).max()
    with pytest.raises(ValueError, match="elements Cu are not in the model's type map"):
        c = atoms.copy()
        c[0].symbol = "Cu"
        c.calc = DeepmdCalculator(ours.runner)
        c.get_potential_energy()
    record = deepmd_md.md_throughput(ours, atoms, steps=3, warmup=1, dt_fs=0.5, device="cpu")
    assert record["steps"] == 3 and record["steps_per_s"] > 0


def test_the_calculator_computes_again_exactly_when_the_atoms_change(model):
    """``DeepmdCalculator.check_state`` compares exactly (ASE's ``allclose`` costs ~1 ms a call at
    4,000 atoms, several calls an MD step): energy, forces and stress of the same atoms are one
    frame; any change, a 1e-12 Å move included, is a new one; the changes it names are ASE's."""
    from ase.calculators.calculator import compare_atoms

    from mixstack.bench import deepmd_md
    from mixstack.deepmd import DeepmdCalculator
    from mixstack.potential.calculator import exact_changes

    runner = FrameRunner(model)
    atoms = deepmd_md.atoms_of(systems.water(30, seed=6), ["O", "H"])
    atoms.calc = DeepmdCalculator(runner)
    atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
    assert runner.calls == 1
    atoms.positions[3, 1] += 1e-12
    atoms.get_forces()
    assert runner.calls == 2
    atoms.get_potential_energy()
    assert runner.calls == 2
    before = atoms.copy()
    for change in (lambda a: a.positions.__setitem__((0, 0), a.positions[0, 0] + 0.1),
                   lambda a: a.set_cell(a.cell * 1.01, scale_atoms=False), lambda a: a.set_pbc(False),
                   lambda a: a.set_initial_charges([0.1] * len(a))):
        changed = before.copy()
        change(changed)
        assert exact_changes(before, changed) == compare_atoms(before, changed), change
        assert exact_changes(before, changed, {"pbc"}) == [c for c in compare_atoms(before, changed) if c != "pbc"]
    assert exact_changes(before, before.copy()) == [] == compare_atoms(before, before.copy())
    atoms.set_cell(atoms.cell * 1.001, scale_atoms=True)
    atoms.get_potential_energy()
    assert runner.calls == 3


def test_accelerate_and_restore_drop_deepmds_compiled_graph(model):
    """deepmd-kit keeps the ``make_fx`` graph of ``core_compute`` per model and process-wide (by the
    model's module ids); it holds the convolutions' classes, the level and the parameters it was
    traced with.  ``accelerate`` and ``restore`` drop both, so the next compiled frame traces anew
    (a deep copy, as ``accelerated_copy`` makes, would otherwise inherit the original's graph)."""
    from deepmd.pt.model.model import sezm_model

    fast = copy.deepcopy(model)
    slot, stale = (False, False), object()
    shared_key = sezm_model._sezm_structure_key(fast) + slot
    for step in (lambda m: accelerate(m, level=2), restore):
        fast.compiled_core_compute_cache[slot] = stale
        fast._task_buf_order_cache[slot] = ()
        sezm_model._SEZM_COMPILE_CACHE[shared_key] = stale
        try:
            step(fast)
            assert not fast.compiled_core_compute_cache and not fast._task_buf_order_cache
            assert shared_key not in sezm_model._SEZM_COMPILE_CACHE
        finally:
            sezm_model._SEZM_COMPILE_CACHE.pop(shared_key, None)


def test_an_accelerated_models_compiled_inference_traces_mixstacks_operators_whole(model, monkeypatch):
    """``accelerate`` marks the model: deepmd-kit's ``forward_common_lower`` (where its compiled
    inference traces and lowers ``core_compute``) runs inside ``guards.opaque_operators`` for it in
    evaluation, not in training (deepmd-kit's ``torch.compile`` path), and for no other model;
    ``restore`` unmarks it; on a GPU only (``compiled._on_cuda`` stands in for one here).  Seen from
    inside a convolution's forward: torch's ``decompose_custom_triton_ops`` is off exactly while a
    marked model runs."""
    from torch._functorch import config as functorch_config

    from mixstack.deepmd import compiled
    from mixstack.deepmd.convolution import MixstackSO2Convolution

    seen = []
    forward = MixstackSO2Convolution.forward

    def spy(self, *args, **kwargs):
        seen.append(functorch_config.decompose_custom_triton_ops)
        return forward(self, *args, **kwargs)

    coord, atype, box = _frame(seed=3)
    fast = copy.deepcopy(model)
    report = accelerate(fast, level=0)
    assert report.on_mixstack and compiled.marked(fast)
    plain = copy.deepcopy(fast)
    compiled.mark(plain, False)
    try:
        MixstackSO2Convolution.forward = spy
        for m, training, gpu, opaque in ((fast, False, True, True), (plain, False, True, False),
                                         (fast, True, True, False), (fast, False, False, False)):
            seen.clear()
            m.train(training)
            monkeypatch.setattr(compiled, "_on_cuda", lambda _model, gpu=gpu: gpu)
            m.forward_common_lower(*edge_inputs(m, coord, atype, box), use_compile=False)
            assert seen and all(flag is (not opaque) for flag in seen), (training, gpu, opaque, seen)
    finally:
        MixstackSO2Convolution.forward = forward
        fast.eval()
    assert functorch_config.decompose_custom_triton_ops is True
    restore(fast)
    assert not compiled.marked(fast)


@pytest.mark.parametrize("products", ["exact", "compensated", "kernel"])
def test_a_model_marked_compensated_compiles_inside_the_compensated_decompositions(model, monkeypatch, products):
    """``accelerate(..., rest_products=)``: deepmd-kit's ``forward_common_lower`` (where its compiled
    inference traces and lowers) reads Inductor's decomposition table with the compensated products
    for a model marked so, and deepmd-kit's own table otherwise; a bad value is named."""
    from torch._inductor import decomposition

    from mixstack.deepmd import compiled
    from mixstack.deepmd.convolution import MixstackSO2Convolution

    original, seen = decomposition.select_decomp_table, []
    forward = MixstackSO2Convolution.forward

    def spy(self, *args, **kwargs):
        seen.append(decomposition.select_decomp_table is original)
        return forward(self, *args, **kwargs)

    coord, atype, box = _frame(seed=4)
    fast = copy.deepcopy(model)
    with pytest.raises(ValueError, match="rest_products"):
        accelerate(fast, level=0, rest_products="tf32")
    accelerate(fast, level=0, rest_products=products)
    assert compiled.rest_products(fast) == products
    monkeypatch.setattr(compiled, "_on_cuda", lambda _model: True)
    monkeypatch.setattr(MixstackSO2Convolution, "forward", spy)
    fast.forward_common_lower(*edge_inputs(fast, coord, atype, box), use_compile=False)
    assert seen and all(flag is (products == "exact") for flag in seen)
    assert decomposition.select_decomp_table is original
    restore(fast)
    assert compiled.rest_products(fast) == "exact"


def test_a_model_marked_fused_lowers_its_inference_graph_without_deepmds_fusion_caps(model):
    """``accelerate(..., lowering="fused")``: deepmd-kit's hook for its graphs' Inductor options gives the
    inference graph its options less the fusion-size and persistent-reduction caps, the training graph
    all of them; ``"deepmd"`` and ``restore`` give deepmd-kit's own back; a bad value is named and
    changes nothing."""
    from mixstack.deepmd import compiled

    fast = copy.deepcopy(model)
    own = type(fast)._inductor_compile_options(fast, inference=True)
    assert {"max_fusion_size", "triton.persistent_reductions"} <= own.keys()
    with pytest.raises(ValueError, match="lowering"):
        accelerate(fast, level=0, lowering="max")
    assert compiled.lowering(fast) == "deepmd" and not compiled.marked(fast)
    accelerate(fast, level=0, lowering="fused")
    assert compiled.lowering(fast) == "fused"
    fused = fast._inductor_compile_options(inference=True)
    assert fused == {k: v for k, v in own.items() if k not in ("max_fusion_size", "triton.persistent_reductions")}
    assert fused["triton.max_tiles"] == own["triton.max_tiles"]        # deepmd-kit's other options kept
    assert fast._inductor_compile_options(inference=False) == type(fast)._inductor_compile_options(fast)
    accelerate(fast, level=0)
    assert compiled.lowering(fast) == "deepmd" and fast._inductor_compile_options(inference=True) == own
    accelerate(fast, level=0, lowering="fused")
    restore(fast)
    assert compiled.lowering(fast) == "deepmd" and fast._inductor_compile_options(inference=True) == own


@pytest.mark.slow
def test_compiled_inference_with_mixstacks_operators_inside_matches_the_eager_frame(monkeypatch):
    """``FrameRunner(compile=True)``: deepmd-kit's ``DP_COMPILE_INFER`` path (``core_compute`` traced
    by ``make_fx`` with symbolic shapes, lowered by AOTAutograd and Inductor, here to C++) inside the
    runner's frame, traced once and then called on every frame: a kept list, one rebuilt in place,
    a new atom count (a new edge capacity: other shapes, the same graph) and an open system with
    an atom that has no edges.  Under ``kernel_target`` the CPU trace records mixstack's stack
    operators (their fake implementations go through the trace and Inductor; their bodies run the
    reference formulas on CPU tensors).  Each frame is a float32 evaluation of the same function as
    the eager runner's, in another order: within ``fp32_tolerance`` (four times the eager frame's
    own distance from the float64 twin, at least 32 float32 ulps of the largest value) of the
    float64 twin, and so within that plus the eager frame's distance of the eager frame."""
    from deepmd.pt.model.model import sezm_model

    from mixstack.dispatch.guards import kernel_target

    # the convolution on its reference formulas: recorded as operators under the target, Inductor
    # would decompose them for this CPU graph into their reference backward, whose functorch vjp
    # fails on symbolic fake tensors (a package for a GPU decomposes them into their kernels)
    monkeypatch.setenv("MIXSTACK_CONV_KERNELS", "0")
    model = make_model("water", "float32", rcut=3.0, **SMALL)
    fast, _ = accelerated_copy(model, level=2)
    twin = float64_twin(model, "water", rcut=3.0, **SMALL)
    traced, calls = [], []
    make_fx = sezm_model.make_fx

    def spy(*args, **kwargs):                                  # what deepmd-kit's trace records
        trace = make_fx(*args, **kwargs)

        def run(*inputs):
            gm = trace(*inputs)
            traced.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            return gm
        return run
    monkeypatch.setattr(sezm_model, "make_fx", spy)

    gen = torch.Generator().manual_seed(0)
    coord, atype, box = _frame(seed=7)
    small = coord + 0.05 * torch.randn(coord.shape, generator=gen)
    far = small.clone()
    far[0, 3] += 0.7                                            # past half the skin: a rebuild
    frames = [(coord, atype, box), (small, atype, box), (far, atype, box), _frame(60, seed=8),
              systems.with_isolated_atom(_frame(45, seed=9, periodic=False))]
    compiled, eager = FrameRunner(fast, compile=True), FrameRunner(fast)
    capacities = []
    with kernel_target("cuda"):
        for index, frame in enumerate(frames):
            out = compiled(*frame)
            if index == 0:                                      # count the compiled graph's calls from here
                graph = fast.compiled_core_compute_cache[(False, False)]
                fast.compiled_core_compute_cache[(False, False)] = lambda *a: calls.append(1) or graph(*a)
            capacities.append(compiled.edge_capacity)
            ref = eager(*frame)
            ref64 = model_outputs(twin, cast_frame(frame, torch.float64))
            for key in KEYS:
                assert out[key].dtype == ref[key].dtype and out[key].shape == ref[key].shape, key
                tol = fp32_tolerance(ref[key], ref64[key])
                own = (ref[key].double() - ref64[key]).abs().max().item()
                assert (out[key].double() - ref64[key]).abs().max().item() <= tol, (index, key)
                assert (out[key].double() - ref[key].double()).abs().max().item() <= tol + own, (index, key)
            assert torch.isfinite(out["atom_energy"]).all()
    assert len(traced) == 1, "one trace serves every frame"
    assert {"mixstack.stack_forward.default", "mixstack.stack_backward.default"} <= traced[0]
    assert len(calls) >= len(frames) - 1
    assert compiled.rebuilds == 4 and capacities[3] > capacities[0]


def test_the_calculator_maps_types_once_and_again_when_the_elements_change():
    """``DeepmdCalculator`` maps symbols to type indices once and keeps the types on the model's
    device while the atoms' elements stay; a step whose elements changed gets new types, and an
    element outside the type map is refused by name."""
    pytest.importorskip("ase")
    from ase import Atoms

    from mixstack.deepmd import DeepmdCalculator

    seen = []

    class Recording(FrameRunner):                     # the calculator's side of the runner only
        def __init__(self):
            self.dtype, self.device = torch.float32, torch.device("cpu")

        def __call__(self, coord, atype, box=None):
            seen.append(atype)
            n = atype.numel()
            return {"energy": torch.zeros(1, 1, dtype=torch.float64), "force": torch.zeros(1, n, 3),
                    "virial": torch.zeros(1, 9, dtype=torch.float64)}

    calc = DeepmdCalculator(Recording(), type_map=["O", "H"])
    atoms = Atoms("OHHOHH", positions=[[i, 0.5 * i, 0.0] for i in range(6)], cell=[9, 9, 9], pbc=True)
    atoms.calc = calc
    atoms.get_forces()
    atoms.positions += 0.01
    atoms.get_forces()
    assert seen[0].tolist() == [0, 1, 1, 0, 1, 1] and seen[1] is seen[0]
    atoms[1].symbol = "O"
    atoms.get_forces()
    assert seen[2].tolist() == [0, 0, 1, 0, 1, 1]
    atoms[2].symbol = "Cu"
    with pytest.raises(ValueError, match="elements Cu are not in the model's type map"):
        atoms.get_forces()


def test_positions_from_the_host_rebuild_a_stale_list_before_the_frame_runs(model, monkeypatch):
    """An MD code hands positions over on the host: a move past half the skin (or a new box) is
    seen there and the list rebuilt before the frame, which runs once; positions on the device
    still go through the frame's own flag (the frame runs, is thrown away, and runs again)."""
    coord, atype, box = _frame(seed=1)
    runner = FrameRunner(model, skin=0.6)
    frames = []
    run = runner.frame
    monkeypatch.setattr(runner, "frame", lambda *a, **k: frames.append(1) or run(*a, **k))
    runner(coord, atype, box)
    far = coord.clone()
    far[0, 3, 1] += 0.35                                      # past half the skin
    frames.clear()
    _close(runner(far, atype, box), model_outputs(model, (far, atype, box)))
    assert len(frames) == 1 and runner.rebuilds == 2 and runner.last_reason == "an atom moved more than half the skin"
    bigger = box * 1.01
    frames.clear()
    _close(runner(far, atype, bigger), model_outputs(model, (far, atype, bigger)))
    assert len(frames) == 1 and runner.rebuilds == 3 and runner.last_reason == "the box changed"
    again = far.clone()
    again[0, 5, 2] -= 0.35
    frames.clear()
    with_flag = runner._stale_on_host
    monkeypatch.setattr(runner, "_stale_on_host", lambda host: None)     # as if the positions were on the device
    _close(runner(again, atype, bigger), model_outputs(model, (again, atype, bigger)))
    assert len(frames) == 2 and runner.rebuilds == 4                       # the flag's path: one frame thrown away
    assert with_flag(runner._host_inputs(again, bigger)) is None            # the host copy follows the rebuild


def _stand_in_capture(asked: list, *, refuse_unmeasured: bool = False):
    """``FrameRunner._capture`` standing in for a graph (it replays the frame eagerly), recording
    each call's ``(warmups, measure)`` in ``asked``; ``refuse_unmeasured``: a capture without a
    measured peak fails, as an op that cannot be captured without a warm-up would."""
    def capture(self, pos, box, atype, warmups=2, measure=True):
        asked.append((warmups, measure))
        if refuse_unmeasured and not measure:
            raise RuntimeError("operation not permitted when stream is capturing")
        static = (pos.clone(), None if box is None else box.clone(), atype.clone())
        outputs = tuple(t.detach() for t in self.frame(*static))

        class Replay:
            def replay(_):
                for old, new in zip(outputs, self.frame(*static)):
                    old.copy_(new.detach())
        self._graph, self._static = Replay(), (static, outputs)
        self.captures += 1
    return capture


@pytest.mark.parametrize("presize, again", [(True, (0, False)), (False, (1, False))])
def test_a_recapture_for_new_capacities_runs_no_eager_frame_a_new_atom_count_warms_up_as_the_first(
        model, monkeypatch, presize, again):
    asked = []

    monkeypatch.setattr(FrameRunner, "_capture", _stand_in_capture(asked))
    monkeypatch.setattr(FrameRunner, "_use_graph", lambda self, pos: True)
    coord, atype, box = _frame(120, seed=7)
    runner = FrameRunner(model, presize=presize)
    runner(coord, atype, box)
    denser = (coord * 0.85, atype, box * 0.85)                   # more edges than the capacity: new buffers
    capacity = runner.edge_capacity
    out = runner(*denser)
    assert runner.edge_capacity > capacity and runner.captures == 2 and asked == [(2, True), again]
    _close(out, model_outputs(model, denser), rel=1e-5)
    runner(*_frame(36, seed=7))                                  # other atoms: warmed up as the first capture
    assert runner.captures == 3 and asked == [(2, True), again, (2, True)]


def test_a_recapture_that_fails_without_a_warm_up_is_tried_once_more_the_first_captures_way(model, monkeypatch):
    asked = []

    monkeypatch.setattr(FrameRunner, "_capture", _stand_in_capture(asked, refuse_unmeasured=True))
    monkeypatch.setattr(FrameRunner, "_use_graph", lambda self, pos: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    coord, atype, box = _frame(120, seed=7)
    runner = FrameRunner(model)
    runner(coord, atype, box)
    denser = (coord * 0.85, atype, box * 0.85)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # no fallback to eager frames: no warning
        out = runner(*denser)
    assert asked == [(2, True), (0, False), (2, True)] and runner.captures == 2 and runner.fallback_reason is None
    _close(out, model_outputs(model, denser), rel=1e-5)


def test_a_recaptures_pool_is_the_measured_peak_scaled_to_the_grown_capacities():
    from mixstack.deepmd.frame import PEAK_SLACK, scaled_peak
    assert scaled_peak(1000, (100, 200), (110, 200)) == int(1000 * 1.1 * PEAK_SLACK)     # the edges grew 10%
    assert scaled_peak(1000, (100, 200), (100, 260)) == int(1000 * 1.3 * PEAK_SLACK)     # the candidates 30%
    assert scaled_peak(1000, (100, 200), (90, 200)) == int(1000 * PEAK_SLACK)            # shrunk: the peak kept
    assert scaled_peak(1000, (0, 0), (100, 200)) == int(1000 * PEAK_SLACK)


def test_a_recapture_keeps_the_pool_its_grown_capacities_peak_fits():
    from mixstack.deepmd.frame import keeps_pool
    assert keeps_pool(1030, 1000, (100, 200), (102, 200))             # 2% more edges: 3% of room holds it
    assert not keeps_pool(1030, 1000, (100, 200), (100, 208))         # 4% more candidates: past the room
    assert keeps_pool(1030, 1000, (100, 200), (90, 150))              # shrunk
    assert not keeps_pool(0, 1000, (100, 200), (100, 200))            # no pool


class _Pools:
    """CUDA's graph and allocator calls ``FrameRunner._capture`` makes, stood in on a CPU: the pools it
    takes (``made``, their bytes) and the pool each capture records into (``used``)."""

    def __init__(self, monkeypatch, peak=1000):
        import contextlib

        from mixstack.deepmd import frame as frame_mod
        self.made, self.used = [], []
        monkeypatch.setattr(frame_mod, "presized_pool", lambda device, nbytes: self.made.append(nbytes) or
                            (f"pool{len(self.made)}", object()))
        monkeypatch.setattr(frame_mod, "capture_stream", lambda device: None)
        monkeypatch.setattr(frame_mod, "run_on_capture_stream", lambda fn, *inputs, device=None: fn(*inputs))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: type("Replay", (), {"replay": lambda _: None})())
        monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None, stream=None: self.used.append(pool) or
                            contextlib.nullcontext())
        monkeypatch.setattr(FrameRunner, "_use_graph", lambda runner, pos: True)


def test_recaptures_go_into_the_first_pool_while_the_grown_capacities_fit_it(model, monkeypatch):
    """The real ``_capture`` with CUDA stood in: the first capture takes a pool of the measured peak with
    ``POOL_ROOM``; a recapture whose grown capacities' peak fits it records into the same pool and takes
    none; one past it takes a new pool of the scaled peak; other atoms measure again."""
    from mixstack.deepmd import frame as frame_mod
    pools = _Pools(monkeypatch, peak=1000)
    monkeypatch.setattr(frame_mod, "POOL_ROOM", 1.5)            # room for the small system's coarse capacities
    coord, atype, box = _frame(120, seed=7)
    runner = FrameRunner(model)
    runner(coord, atype, box)
    first = runner._capacities()
    assert pools.made == [1500] and pools.used == ["pool1"] and runner.events[-1]["pool"] == "measured"
    out = runner(coord * 0.97, atype, box * 0.97)                # ~15% more edges: within the room
    grown = runner._capacities()
    assert 1 < max(g / f for g, f in zip(grown, first)) <= 1.5 and runner.captures == 2
    assert pools.made == [1500] and pools.used == ["pool1", "pool1"] and runner.events[-1]["pool"] == "kept"
    _close(out, model_outputs(model, (coord * 0.97, atype, box * 0.97)), rel=1e-5)
    runner(coord * 0.8, atype, box * 0.8)                        # past the room: a new pool, the peak scaled
    ratio = max(g / f for g, f in zip(runner._capacities(), first))
    assert ratio > 1.5 and pools.made[1:] == [frame_mod.scaled_peak(1000, first, runner._capacities())]
    assert pools.used[-1] == "pool2" and runner.events[-1]["pool"] == "scaled"
    runner(*_frame(36, seed=7))                                  # other atoms: measured again, a new pool
    assert pools.made[2:] == [1500] and pools.used[-1] == "pool3" and runner.events[-1]["pool"] == "measured"


def _capacities(counts, steps):
    """The capacities ``FrameRunner`` keeps over successive rebuilds' counts of one system."""
    from mixstack.deepmd.frame import CAPACITY_HEADROOM, MAX_GROWTHS, edge_capacity, next_capacity

    previous, growths, out = 0, 0, []
    for count in counts:
        room = 1 + (CAPACITY_HEADROOM - 1) * 2 ** growths
        kept = next_capacity(count, previous, room, steps=steps)
        if kept is None:
            growths = min(growths + 1, MAX_GROWTHS)
            kept = edge_capacity(int(count * (1 + (CAPACITY_HEADROOM - 1) * 2 ** growths)), steps=steps)
        assert kept >= count, (count, kept)                      # never an edge dropped
        out.append(kept)
        previous = kept
    return out


def test_the_capacity_policy_changes_shapes_rarely_for_wandering_climbing_and_falling_counts():
    gen = torch.Generator().manual_seed(0)
    steady = (316_554 * (1 + 0.003 * torch.randn(40, generator=gen))).long().tolist()
    climbing = [int(316_554 * (1 + 0.035 * k / 12)) for k in range(13)]
    for counts, most in ((steady, 2), (climbing, 3)):
        caps = _capacities(counts, 256)
        assert sum(a != b for a, b in zip(caps, caps[1:])) <= most, caps
    falling = _capacities([316_554, 316_554, 250_000], 256)       # far below: the buffers shrink
    assert falling[0] == falling[1] and 250_000 < falling[2] < falling[1]


def test_the_recapture_pool_probe_names_bad_arguments_and_needs_a_gpu(monkeypatch):
    from helpers import load_script
    probe = load_script("recapture_pool_probe")
    assert probe.rooms("1.03, 1.0") == [1.03, 1.0]
    for bad in ("1.03,x", "0.9", ""):
        with pytest.raises(SystemExit, match="--rooms"):
            probe.rooms(bad)
    with pytest.raises(SystemExit, match="--scale"):
        probe.main(["--scale", "1.2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        probe.main([])
