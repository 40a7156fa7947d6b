"""``mixstack.cxx_runtime``: a frozen package linked with its own hidden copy of libstdc++.

Built with the host's C++ compiler: a shared library linked through the wrapper carries no
dependency on ``libstdc++.so`` and runs after ``import torch`` (a copy whose symbols stayed
visible would bind some of them to the process's copy: ``repro/aoti_loader_crash.py``'s
``regex-static``); ``freeze`` hands the wrapper to AOTInductor when asked, and a package frozen
through it loads and gives the live module's results."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

import mixstack
from mixstack import cxx_runtime, export
from mixstack.core import config

REGEX = r"""
#include <regex>
#include <string>
extern "C" int device_index(const char* s) {
  std::regex re("(cpu|cuda)(:([0-9]+))?");
  std::smatch sm;
  std::string str(s);
  if (!std::regex_match(str, sm, re)) return -2;
  return sm[3].matched ? std::stoi(sm[3].str()) : -1;
}
"""

needs_toolchain = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                                     reason="needs g++ and readelf")


def _needed(lib) -> str:
    return subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout


@needs_toolchain
def test_a_library_linked_through_the_wrapper_has_its_own_runtime_and_runs_beside_torch(tmp_path):
    wrapper = cxx_runtime.private_runtime_compiler("g++")
    assert cxx_runtime.private_runtime_compiler("g++") == wrapper            # written once
    src = tmp_path / "probe.cpp"
    src.write_text(REGEX)
    subprocess.run([wrapper, "-std=c++17", "-O1", "-c", "-fPIC", str(src), "-o", str(tmp_path / "probe.o")],
                   check=True)                                               # compiling alone: as g++
    lib = tmp_path / "probe.so"
    subprocess.run([wrapper, "-std=c++17", "-shared", "-fPIC", str(tmp_path / "probe.o"), "-o", str(lib)],
                   check=True)
    assert "libstdc++" not in _needed(lib)
    run = subprocess.run([sys.executable, "-c", f"import torch, ctypes; print(ctypes.CDLL({str(lib)!r})"
                          ".device_index(b'cuda:3'))"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "3", run.stderr[-2000:]


def test_a_missing_compiler_is_named():
    with pytest.raises(FileNotFoundError, match="no-such-c"):
        cxx_runtime.private_runtime_compiler("no-such-c++")


@pytest.mark.parametrize("raw, want", [("", False), ("0", False), ("1", True)])
def test_the_environment_switch(monkeypatch, raw, want):
    monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", raw)
    assert config.private_cxx_runtime() is want


def test_a_bad_environment_switch_is_named(monkeypatch):
    monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", "yes")
    with pytest.raises(ValueError, match="MIXSTACK_PRIVATE_CXX_RUNTIME"):
        config.private_cxx_runtime()


@needs_toolchain
def test_freeze_hands_the_wrapper_to_aotinductor_when_asked(monkeypatch, tmp_path):
    from test_potential_deploy import KW, _diamond

    from mixstack.potential import SO2Potential

    seen = []
    monkeypatch.setattr(export, "trace", lambda module, example: "program")
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda program, package_path, inductor_configs: seen.append(inductor_configs) or package_path)
    model = SO2Potential(**KW)
    monkeypatch.delenv("MIXSTACK_PRIVATE_CXX_RUNTIME", raising=False)
    mixstack.freeze(model, _diamond(), tmp_path / "a.pt2", tune=False, progress=None)
    mixstack.freeze(model, _diamond(), tmp_path / "b.pt2", tune=False, progress=None, private_cxx_runtime=True)
    monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", "1")
    mixstack.freeze(model, _diamond(), tmp_path / "c.pt2", tune=False, progress=None)
    plain, private, from_env = seen
    assert "cpp.cxx" not in plain and plain["aot_inductor.metadata"]["private_cxx_runtime"] == "0"
    assert private["cpp.cxx"] == from_env["cpp.cxx"] == (cxx_runtime.private_runtime_compiler(),)
    assert private["aot_inductor.metadata"]["private_cxx_runtime"] == "1"


def test_the_context_patches_inductor_only_when_asked(monkeypatch):
    import torch._inductor.config as inductor

    before = inductor.cpp.cxx
    monkeypatch.setenv("MIXSTACK_PRIVATE_CXX_RUNTIME", "0")
    with cxx_runtime.private_runtime():
        assert inductor.cpp.cxx == before
    if shutil.which("g++") is not None:
        with cxx_runtime.private_runtime(True):
            assert inductor.cpp.cxx == (cxx_runtime.private_runtime_compiler(),)
    assert inductor.cpp.cxx == before


@pytest.mark.slow
@needs_toolchain
def test_a_package_frozen_with_its_own_runtime_loads_and_matches_the_live_module(tmp_path):
    from test_potential_deploy import KW, _diamond

    from mixstack.potential import SO2Potential, atoms_inputs

    # one block of one layer: what is tested is the package's link, not the model (its AOTInductor
    # compile is most of the test's time and grows with the graph)
    model = SO2Potential(**dict(KW, n_blocks=1, n_layers=1), seed=5).eval()
    with mixstack.use_level(0):
        path = mixstack.freeze(model, _diamond(), tmp_path / "own.pt2", progress=None, private_cxx_runtime=True)
    folder = tmp_path / "unpacked"
    with zipfile.ZipFile(path) as z:
        z.extractall(folder)
    (so,) = folder.rglob("*.so")
    assert "libstdc++" not in _needed(so)
    frozen = mixstack.load(path)
    assert frozen.metadata["private_cxx_runtime"] == "1"
    inputs = atoms_inputs(_diamond((2, 1, 1), seed=4), model.cutoff)
    want = model(*inputs)
    got = frozen(*inputs)
    for g, w in zip(got[:3], want[:3]):
        assert (g.double() - w.double()).norm() <= 1e-4 * max(w.double().norm().item(), 1e-6)
