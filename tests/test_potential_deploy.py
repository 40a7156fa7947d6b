"""``mixstack.freeze`` / ``mixstack.load`` (docs/contract.md §6) on the CPU, and ``mixstack freeze``.

The round trip compiles one small potential with AOTInductor (the level-0
branch; gcc; tens of seconds) and checks that the frozen program — energy,
forces and stress computed inside it — matches the live module on structures
of other sizes than the example it was traced with.
"""

from __future__ import annotations

import logging
import zipfile

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
from ase.build import bulk  # noqa: E402

import mixstack  # noqa: E402
from mixstack import export, tuner, tuning  # noqa: E402
from mixstack.packages import package_kernels  # noqa: E402
from mixstack.potential import SO2Potential, atoms_inputs  # noqa: E402

KW = dict(lmax=1, focus_dim=16, n_focus=2, n_blocks=2, n_layers=2, cutoff=3.0, energy_scale=10.0)


def _diamond(reps=(1, 1, 1), seed=0):
    atoms = bulk("C", "diamond", cubic=True).repeat(reps)
    atoms.rattle(0.05, seed=seed)
    return atoms


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    model = SO2Potential(**KW, seed=3).eval()
    path = tmp_path_factory.mktemp("frozen") / "pot.pt2"
    with mixstack.use_level(0):
        written = mixstack.freeze(model, _diamond(), path)
    return model, written, mixstack.load(written)


def _close(got, want, tol):
    """Relative to ``want``; a quantity zero by symmetry (the force on the one atom of
    an fcc cell) is held to ``tol * 1e-6`` absolute: float32 rounding of the image
    sum leaves ~1e-11 there, where a wrong term would leave O(1)."""
    got, want = got.double(), want.double()
    scale = max(want.norm().item(), 1e-6)
    assert (got - want).norm().item() <= tol * scale, f"{(got - want).norm().item() / scale:.2e}"


# float32, the same graph compiled by Inductor instead of run eagerly: other fusions and
# reduction orders, so rounding-level differences and nothing more.  Measured: energy ~1e-7
# relative; forces and stress up to 1.3e-5 (stress of one-atom fcc Cu: 42 pair terms that
# nearly cancel).  A wrong weight, term or shape would be off by O(1).
TOL = {"energy": 1e-6, "forces": 1e-4, "stress": 1e-4, "energies": 1e-5}
@pytest.mark.slow
@pytest.mark.parametrize("structure", ["diamond-24", "cu-fcc-1", "mixed-open"])
def test_frozen_program_matches_the_live_module_at_other_sizes(frozen, structure):
    from ase import Atoms
    model, _, program = frozen
    if structure == "diamond-24":
        atoms = _diamond((1, 1, 3), seed=5)
    elif structure == "cu-fcc-1":                       # one atom, many images of itself
        atoms = bulk("Cu", "fcc", a=3.6)
    else:
        atoms = Atoms("H2OFe", positions=[[0, 0, 0], [0.9, 0.1, 0], [0.2, 1.0, 0.3], [1.5, 1.5, 1.5]])
    inputs = atoms_inputs(atoms, program.cutoff, dtype=program.dtype)
    live, got = model(*inputs), program(*inputs)
    assert [t.shape for t in got] == [t.shape for t in live]
    for name, g, w in zip(export.OUTPUT_NAMES, got, live):
        _close(g, w, TOL[name])
    assert live[1].norm() > 0 or structure == "cu-fcc-1"          # zero there by symmetry


@pytest.mark.slow
def test_frozen_file_carries_its_cutoff_level_and_why_tuning_was_skipped(frozen):
    model, path, program = frozen
    assert path.suffix == ".pt2" and path.is_file()
    assert program.cutoff == model.cutoff and program.dtype == torch.float32
    assert program.device == torch.device("cpu")
    meta = program.metadata
    assert meta["level"] == "0" and meta["tuning"].startswith("skipped: the module is on cpu")
    assert meta["stack_keys"] == "[focus_dim=16;lmax=1;n_focus=2;apply_alpha=1]"
    assert program.config["n_blocks"] == 2
    contents = package_kernels(path)               # a CPU package: C++ kernels, no GPU binary
    assert contents.metadata["AOTI_DEVICE_KEY"] == "cpu" and not contents.mixstack and not contents.inductor


@pytest.mark.slow
def test_calculator_runs_the_frozen_file_like_the_live_module(frozen):
    from mixstack.potential.calculator import MixstackCalculator
    model, path, _ = frozen
    a, b = _diamond((1, 2, 1), seed=9), _diamond((1, 2, 1), seed=9)
    a.calc, b.calc = MixstackCalculator(path), MixstackCalculator(model)
    assert a.get_potential_energy() == pytest.approx(b.get_potential_energy(), rel=1e-6)
    np.testing.assert_allclose(a.get_forces(), b.get_forces(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a.get_stress(), b.get_stress(), rtol=1e-4, atol=1e-8)
    from ase import units
    from ase.md.verlet import VelocityVerlet
    for atoms in (a, b):                                # the same short NVE run on both
        atoms.set_momenta(np.full((len(atoms), 3), 0.05) * np.arange(len(atoms))[:, None] % 0.3)
        VelocityVerlet(atoms, timestep=0.5 * units.fs).run(5)
    np.testing.assert_allclose(a.positions, b.positions, rtol=0, atol=1e-6)
    assert a.get_total_energy() == pytest.approx(b.get_total_energy(), rel=1e-6)


@pytest.mark.slow
def test_traced_program_keeps_the_mixstack_operators_for_forward_and_backward(monkeypatch):
    """What a GPU freeze at level >= 1 relies on: the forces' backward inside the exported graph
    goes through ``mixstack::stack_backward`` (the Triton relay / fused kernels on CUDA), not
    through a decomposition.  On the CPU the operators' bodies run their reference branch, so
    the traced program must still equal the live module."""
    from mixstack.stack import functional
    monkeypatch.setattr(functional, "forward_level", lambda u0, layout: 1)   # take the operator path
    model = SO2Potential(**KW, seed=3).eval()
    program = export.trace(model, _diamond())
    targets = [str(n.target) for n in program.graph.nodes]
    assert targets.count("mixstack.stack_forward.default") == 2
    assert targets.count("mixstack.stack_backward.default") == 2
    inputs = atoms_inputs(_diamond((2, 1, 1), seed=4), model.cutoff)
    for name, g, w in zip(export.OUTPUT_NAMES, program.module()(*inputs), model(*inputs)):
        _close(g, w, TOL[name])


def test_stack_keys_collect_every_distinct_stack():
    model = SO2Potential(lmax=2, focus_dim=16, n_focus=3, n_blocks=2)
    key = tuning.shape_key(focus_dim=16, lmax=2, n_focus=3, apply_alpha=True)
    assert export.stack_keys(model) == [key]
    holder = torch.nn.ModuleList([model, mixstack.MixingStack(n_focus=1, focus_dim=32, lmax=3)])
    assert export.stack_keys(holder) == [key, tuning.shape_key(focus_dim=32, lmax=3, n_focus=1,
                                                               apply_alpha=True)]


def test_tuning_runs_only_on_cuda_at_level_two_and_up(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(tuner, "tune_missing",
                        lambda keys, families=None, **kw: calls.append((list(keys), families, kw)) or [])
    monkeypatch.delenv("MIXSTACK_FREEZE_TUNE_SECONDS", raising=False)
    keys = [tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)]
    with caplog.at_level(logging.INFO, logger="mixstack.export"):
        assert export.tune_for_freeze(keys, torch.device("cpu"), 2).startswith("skipped: the module is on cpu")
        assert "level 1 does not read" in export.tune_for_freeze(keys, torch.device("cuda"), 1)
        assert export.tune_for_freeze([], torch.device("cuda"), 2) == "skipped: the module holds no mixing stack"
        assert calls == []
        assert export.tune_for_freeze(keys, torch.device("cuda"), 2).startswith("tuned (quick sweep, at most 300 s)")
        assert export.tune_for_freeze(keys, torch.device("cuda"), 3).startswith("tuned")
    exact = ["stack_fwd", "stack_bwd_relay", "stack_bwd_fused"]
    assert [(k, f) for k, f, _ in calls] == [(keys, exact), (keys, exact + ["stack_compensated", "stack_compensated_tma"])]   # level 3 validates level 3
    kw = calls[0][2]          # mixstack tune's quick sweep, bounded, a failure reported rather than raised
    assert kw["quick"] is True and kw["seconds"] == 300.0 and kw["stop_on_error"] is False
    assert kw["rounds"] < 20 and kw["progress"] is None
    assert "tuning skipped: the module is on cpu" in caplog.text


def test_the_freeze_tuning_budget_comes_from_the_environment_and_progress_names_each_sweep(monkeypatch):
    from mixstack.tuner.sweep import TuneProgress

    keys = [tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)]
    seen = []

    def fake(keys, families=None, *, progress, seconds, **kw):
        seen.append(seconds)
        for family in families[:2] if progress is not None else ():
            for done in range(3):                                     # three steps of each sweep
                progress(TuneProgress(family, keys[0], "time", f"c{done}", done + 1, 3))
        return []
    monkeypatch.setattr(tuner, "tune_missing", fake)
    lines = []
    monkeypatch.setenv("MIXSTACK_FREEZE_TUNE_SECONDS", "45")
    export.tune_for_freeze(keys, torch.device("cuda"), 2, progress=lines.append)
    assert seen == [45.0]
    assert lines == [f"tuning stack_fwd {keys[0].short()}: 3 step(s)",
                     f"tuning stack_bwd_relay {keys[0].short()}: 3 step(s)"]      # one line a sweep
    assert export.tune_for_freeze(keys, torch.device("cuda"), 2, seconds=7).startswith("tuned") and seen[-1] == 7
    monkeypatch.setenv("MIXSTACK_FREEZE_TUNE_SECONDS", "0")
    assert export.tune_for_freeze(keys, torch.device("cuda"), 2) == "skipped: MIXSTACK_FREEZE_TUNE_SECONDS is 0"
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv("MIXSTACK_FREEZE_TUNE_SECONDS", bad)
        with pytest.raises(ValueError, match="MIXSTACK_FREEZE_TUNE_SECONDS"):
            export.tune_for_freeze(keys, torch.device("cuda"), 2)
    assert len(seen) == 2


def test_freeze_rejects_a_too_small_example_and_load_a_missing_file(tmp_path):
    model = SO2Potential(**KW)
    one = bulk("Cu", "fcc", a=3.6)                              # one atom: sizes 0/1 cannot be traced
    with pytest.raises(ValueError, match="at least 2 atoms"):
        mixstack.freeze(model, one, tmp_path / "x.pt2")
    with pytest.raises(TypeError, match="six tensors"):
        mixstack.freeze(model, (torch.zeros(3, 3),), tmp_path / "x.pt2")
    with pytest.raises(FileNotFoundError):
        mixstack.load(tmp_path / "missing.pt2")


def test_cli_freeze_builds_the_model_and_example_it_is_asked_for(monkeypatch, tmp_path, capsys):
    from mixstack.cli import main
    seen = {}

    def fake_freeze(module, example, path, *, tune=True, progress=None, private_cxx_runtime=None):
        seen.update(module=module, example=example, path=path, tune=tune, private=private_cxx_runtime)
        with zipfile.ZipFile(path, "w") as z:            # what the command reads back: the kernels
            z.writestr("m/data/aotinductor/model/k.cubin", b"\x00block_gemm_kernel\x00")
        return path

    monkeypatch.setattr(export, "freeze", fake_freeze)
    out = tmp_path / "m.pt2"
    assert main(["freeze", str(out), "--lmax", "3", "--focus-dim", "32", "--blocks", "1",
                 "--structure", "cu-bcc", "--no-tune"]) == 0
    m = seen["module"]
    assert (m.lmax, m.focus_dim, len(m.blocks), seen["tune"], seen["private"]) == (3, 32, 1, False, None)
    assert set(seen["example"].get_chemical_symbols()) == {"Cu"} and str(seen["path"]) == str(out)
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "mixstack kernels compiled in: 1 (block_gemm_kernel)" in printed
    ckpt = tmp_path / "c.pt"
    SO2Potential(lmax=2, focus_dim=16, n_blocks=1).save(ckpt)
    assert main(["freeze", str(out), "--checkpoint", str(ckpt), "--private-cxx-runtime"]) == 0
    assert seen["module"].lmax == 2 and seen["tune"] is True and seen["private"] is True


def test_freeze_reports_each_stage_as_it_goes(monkeypatch, tmp_path):
    """A freeze takes minutes (most of it in AOTInductor): each stage is announced."""
    lines = []
    monkeypatch.setattr(export, "trace", lambda module, example: "program")
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda program, package_path, inductor_configs: lines.append("compiled") or package_path)
    out = mixstack.freeze(SO2Potential(**KW), _diamond(), tmp_path / "m.pt2", progress=lines.append)
    assert str(out).endswith("m.pt2")
    stages = [line.split("] ", 1)[1] for line in lines if "] " in line]
    assert [s[:3] for s in stages[:4]] == ["1/3", "1/3", "2/3", "3/3"] and stages[-1].startswith("done")
    assert lines.index("compiled") == len(lines) - 2          # compiled after "3/3", before "done"
