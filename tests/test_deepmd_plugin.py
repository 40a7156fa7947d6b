"""deepmd-kit's own commands reach mixstack: the ``deepmd.pt`` entry point, the
``MIXSTACK_DEEPMD`` switch, the op-library stand-in, and (slow) ``dp --pt train`` and
``dp --pt test`` end to end."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from deepmd_cases import one_torch_thread, require_deepmd  # noqa: F401

from mixstack.core import config

require_deepmd()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pyproject_declares_the_entry_point_and_the_extra():
    tomllib = pytest.importorskip("tomllib")                      # Python >= 3.11
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    assert project["entry-points"]["deepmd.pt"] == {"mixstack": "mixstack.deepmd.plugin"}
    assert project["entry-points"]["deepmd.pt_expt"] == {"mixstack": "mixstack.deepmd.plugin_expt"}
    assert any(req.startswith("deepmd-kit") for req in project["optional-dependencies"]["deepmd"])


@pytest.mark.parametrize("raw, expect", [("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_the_switch_reads_mixstack_deepmd(monkeypatch, raw, expect):
    monkeypatch.setenv("MIXSTACK_DEEPMD", raw)
    assert config.deepmd_enabled() is expect


def test_the_switch_names_a_bad_value(monkeypatch):
    monkeypatch.setenv("MIXSTACK_DEEPMD", "yes")
    with pytest.raises(ValueError, match="MIXSTACK_DEEPMD must be 0 or 1, got 'yes'"):
        config.deepmd_enabled()


@pytest.fixture
def plugin():
    from mixstack.deepmd import plugin as module

    yield module
    module.uninstall()


def _conv_classes(model):
    return [type(b.so2_conv).__name__ for b in model.atomic_model.descriptor.blocks]


def test_deepmd_loader_runs_the_plugin_which_accelerates_what_deepmd_builds(monkeypatch, plugin):
    """deepmd-kit's own loader (``load_entry_point("deepmd.pt")``), given mixstack's entry point as
    the installed metadata would list it, imports the plugin; with ``MIXSTACK_DEEPMD=1`` every
    SeZM model deepmd-kit builds from then on is accelerated, and without it none is."""
    from deepmd.utils.entry_point import load_entry_point

    from mixstack.deepmd.configs import build_model

    listed = importlib.metadata.EntryPoint(name="mixstack", value="mixstack.deepmd.plugin", group="deepmd.pt")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: importlib.metadata.EntryPoints([listed]) if kw.get("group") == "deepmd.pt"
                        else real(**kw))
    monkeypatch.setenv("MIXSTACK_DEEPMD", "0")
    importlib.reload(plugin)
    assert load_entry_point("deepmd.pt") == [plugin] and not plugin.installed()
    assert _conv_classes(build_model("water", rcut=3.0)) == ["SO2Convolution"] * 2

    monkeypatch.setenv("MIXSTACK_DEEPMD", "1")
    importlib.reload(plugin)
    assert plugin.installed()
    assert _conv_classes(build_model("water", rcut=3.0)) == ["MixstackSO2Convolution"] * 2
    plugin.install()                                     # idempotent: one wrapper, not two
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM
    assert not hasattr(DescrptSeZM.__init__.__wrapped__, "__wrapped__")
    plugin.uninstall()
    assert not plugin.installed()
    assert _conv_classes(build_model("water", rcut=3.0)) == ["SO2Convolution"] * 2


def test_the_expt_entry_point_accelerates_what_pt_expt_builds(monkeypatch, plugin):
    """deepmd-kit's loader for its PT-expt backend (``load_entry_point("deepmd.pt_expt")``) imports
    ``plugin_expt``; with ``MIXSTACK_DEEPMD=1`` the DPA4 models PT-expt builds are accelerated."""
    pytest.importorskip("deepmd.pt_expt")
    from deepmd.pt_expt.descriptor.dpa4 import DescrptDPA4
    from deepmd.utils.entry_point import load_entry_point

    from mixstack.deepmd import plugin_expt
    from mixstack.deepmd.configs import build_model

    listed = importlib.metadata.EntryPoint(name="mixstack", value="mixstack.deepmd.plugin_expt", group="deepmd.pt_expt")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: importlib.metadata.EntryPoints([listed]) if kw.get("group") == "deepmd.pt_expt"
                        else real(**kw))
    monkeypatch.setenv("MIXSTACK_DEEPMD", "0")
    importlib.reload(plugin_expt)
    assert load_entry_point("deepmd.pt_expt") == [plugin_expt]
    assert _conv_classes(build_model("water", rcut=3.0, backend="pt_expt")) == ["SO2Convolution"] * 2
    monkeypatch.setenv("MIXSTACK_DEEPMD", "1")
    importlib.reload(plugin_expt)
    assert _conv_classes(build_model("water", rcut=3.0, backend="pt_expt")) == ["MixstackDPA4Convolution"] * 2
    plugin.install_expt()                                # idempotent
    assert not hasattr(DescrptDPA4.__init__.__wrapped__, "__wrapped__")
    plugin.uninstall()
    assert _conv_classes(build_model("water", rcut=3.0, backend="pt_expt")) == ["SO2Convolution"] * 2


def test_the_op_library_stands_in_only_when_it_cannot_load():
    """Where deepmd-kit's compiled ops were built for another torch, ``deepmd.pt`` still imports
    (the ops report absent); where they load, nothing stands in."""
    from deepmd.env import GLOBAL_CONFIG
    from packaging.version import Version

    from mixstack.deepmd.compat import op_library_stood_in

    built_for = GLOBAL_CONFIG.get("pt_version")
    mismatch = built_for is not None and Version(torch.__version__).public != built_for
    assert op_library_stood_in() == mismatch
    if mismatch:
        assert sys.modules["deepmd.pt.cxx_op"].ENABLE_CUSTOMIZED_OP is False


def _write_system(path, seed):
    import numpy as np

    from mixstack.deepmd import systems

    os.makedirs(os.path.join(path, "set.000"))
    frames = [systems.water(9, seed=seed + i) for i in range(2)]
    np.savetxt(os.path.join(path, "type.raw"), frames[0][1].reshape(-1).numpy(), fmt="%d")
    with open(os.path.join(path, "type_map.raw"), "w") as f:
        f.write("O\nH\n")
    gen = np.random.default_rng(seed)
    np.save(os.path.join(path, "set.000", "coord.npy"), np.stack([f[0].reshape(-1).numpy() for f in frames]))
    np.save(os.path.join(path, "set.000", "box.npy"), np.stack([f[2].reshape(-1).numpy() for f in frames]))
    np.save(os.path.join(path, "set.000", "energy.npy"), gen.normal(size=2))
    np.save(os.path.join(path, "set.000", "force.npy"), gen.normal(size=(2, 27)))


def _run_dp_driver(tmp_path, driver: str, *, timeout: int) -> str:
    """``driver`` (a Python program of dp commands) in ``tmp_path`` with ``MIXSTACK_DEEPMD=1``, on a
    one-block water model's training input (two mixing layers) and a two-frame system there; its log."""
    from mixstack.deepmd.configs import model_config

    _write_system(str(tmp_path / "data"), seed=0)
    config_ = {"model": model_config("water", rcut=3.0, n_blocks=1, mixing_layers=2),
               "learning_rate": {"type": "exp", "start_lr": 1e-3, "stop_lr": 1e-4, "decay_steps": 10},
               "loss": {"type": "ener", "start_pref_e": 1, "limit_pref_e": 1, "start_pref_f": 1, "limit_pref_f": 1},
               "training": {"training_data": {"systems": [str(tmp_path / "data")], "batch_size": 1},
                            "numb_steps": 1, "save_freq": 1, "disp_freq": 1, "save_dir": "ckpt", "seed": 1}}
    (tmp_path / "input.json").write_text(json.dumps(config_))
    env = dict(os.environ, MIXSTACK_DEEPMD="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout + run.stderr


_DRIVER = """
import sys
from mixstack.deepmd import dp, plugin
dp.main(["--pt", "train", "input.json", "--skip-neighbor-stat"])
dp.main(["--pt", "test", "-m", "model.ckpt.pt", "-s", "data", "-n", "2", "-d", "fast"])
plugin.uninstall()
dp.main(["--pt", "test", "-m", "model.ckpt.pt", "-s", "data", "-n", "2", "-d", "deepmd"])
"""


@pytest.mark.slow
def test_dp_train_and_dp_test_run_accelerated(tmp_path):
    """``dp --pt train`` and ``dp --pt test`` with ``MIXSTACK_DEEPMD=1``: deepmd-kit's log shows
    the report, and ``dp --pt test``'s predictions equal the unaccelerated model's."""
    log = _run_dp_driver(tmp_path, _DRIVER, timeout=600)
    assert "mixstack.deepmd: 1 of 1 SO(2) convolutions on mixstack" in log
    import numpy as np

    for kind in ("e", "f"):
        fast = np.loadtxt(tmp_path / f"fast.{kind}.out")
        ref = np.loadtxt(tmp_path / f"deepmd.{kind}.out")
        assert np.abs(ref[:, 1:]).max() > 0
        np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_the_op_library_stands_in_where_its_mpi_package_is_missing():
    """A wheel-built deepmd-kit loads libmpi from the ``mpich`` package before its ops; without
    that package ``deepmd.pt`` still imports, with the stand-in, and says why."""
    code = textwrap.dedent("""
        import importlib.metadata as md
        real = md.files
        def files(name):
            if name == "mpich":
                raise md.PackageNotFoundError(name)
            return real(name)
        md.files = files
        from deepmd.env import GLOBAL_CONFIG
        GLOBAL_CONFIG["cibuildwheel"] = "1"
        from mixstack.deepmd.compat import deepmd_pt, op_library_stood_in
        deepmd_pt()
        print("stood in", op_library_stood_in())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stood in True" in out.stdout
    assert "mpich" in out.stderr


_EXPT_DRIVER = """
import json
import numpy as np, torch
from deepmd.pt_expt.model.get_model import get_model
from deepmd.pt_expt.train.wrapper import ModelWrapper
from mixstack.deepmd import dp, plugin, plugin_expt, systems
from mixstack.deepmd.configs import perturb

def checkpoint_model(state):
    model = get_model(state["model"]["_extra_state"]["model_params"])
    wrapper = ModelWrapper(model)
    wrapper.load_state_dict(state["model"])
    return model.eval(), wrapper

dp.main(["--pt-expt", "train", "input.json", "--skip-neighbor-stat"])
state = torch.load("model.ckpt.pt", weights_only=True)
model, wrapper = checkpoint_model(state)
perturb(model)                                  # untrained SeZM output layers are zero
state["model"] = wrapper.state_dict()
torch.save(state, "model.ckpt.pt")
dp.main(["--pt-expt", "freeze", "-c", "model.ckpt.pt", "-o", "fast.pte"])
plugin.uninstall()
model, _ = checkpoint_model(torch.load("model.ckpt.pt", weights_only=True))
from deepmd.infer import DeepPot
frozen = DeepPot("fast.pte")
out = {}
for seed in (0, 1):
    coord, atype, box = systems.water(9, seed=seed)
    e, f = frozen.eval(coord.reshape(1, -1).numpy(), box.reshape(1, 9).numpy(), atype.reshape(-1).numpy())[:2]
    ref = model(coord.float(), atype, box.float())
    want_e = ref["energy"].detach().double().numpy().reshape(-1)
    want_f = ref["force"].detach().double().numpy().reshape(-1, 3)
    out[seed] = [float(np.abs(e.reshape(-1) - want_e).max()), float(np.abs(f.reshape(-1, 3) - want_f).max()),
                 float(np.abs(want_e).max()), float(np.abs(want_f).max())]
print("RESULT", json.dumps(out))
"""


@pytest.mark.slow
def test_dp_pt_expt_freeze_runs_accelerated(tmp_path):
    """``dp --pt-expt train`` then ``dp --pt-expt freeze`` with ``MIXSTACK_DEEPMD=1`` (PT-expt freezes
    DPA4 through its NeighborGraph lower): the log shows the report, and the frozen program (CPU
    target: mixstack's level-0 formulas traced) gives the unaccelerated checkpoint's energies and
    forces to float32 rounding."""
    pytest.importorskip("deepmd.pt_expt")
    log = _run_dp_driver(tmp_path, _EXPT_DRIVER, timeout=900)
    assert log.count("mixstack.deepmd: 1 of 1 SO(2) convolutions on mixstack") >= 2     # trained, then frozen
    result = json.loads(log.split("RESULT", 1)[1].strip().splitlines()[0])
    for e_diff, f_diff, e_scale, f_scale in result.values():      # float32: ~1e-6 relative, a wrong term O(1)
        assert f_scale > 1e-2 and e_diff <= 1e-5 * e_scale and f_diff <= 1e-4 * f_scale, result


def test_the_op_library_stands_in_where_its_mpi_library_cannot_be_opened():
    """``mpich`` installed, but its ``libmpi`` cannot be opened (a library it links is missing: a
    pip ``--target`` install): ``deepmd.pt`` still imports, with the stand-in, and says why; an
    error that does not come from deepmd-kit's op loader is not swallowed."""
    code = textwrap.dedent("""
        import ctypes, sys
        real = ctypes.CDLL
        def cdll(name, *args, **kwargs):
            if "libmpi" in str(name):
                raise OSError("libfabric.so.1: cannot open shared object file: No such file or directory")
            return real(name, *args, **kwargs)
        ctypes.CDLL = cdll
        import importlib.metadata as md
        real_files = md.files
        class Fake:
            def match(self, pattern): return pattern.startswith("libmpi")
            def locate(self): return "/nowhere/libmpi.so.12"
        md.files = lambda name: [Fake()] if name == "mpich" else real_files(name)
        from deepmd.env import GLOBAL_CONFIG
        GLOBAL_CONFIG["cibuildwheel"] = "1"
        from mixstack.deepmd.compat import _raised_in_op_loader, deepmd_pt, op_library_stood_in
        deepmd_pt()
        print("stood in", op_library_stood_in())
        try:
            raise OSError("elsewhere")
        except OSError as err:
            print("elsewhere caught", _raised_in_op_loader(err))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stood in True" in out.stdout and "elsewhere caught False" in out.stdout
    assert "libfabric.so.1" in out.stderr
