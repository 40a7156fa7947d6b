"""Test-suite wiring: make ``helpers`` importable and keep level state from leaking.

The suite runs as three pytest processes (scripts/run_tests.sh):
``TRITON_INTERPRET=1 python -m pytest tests/interpret`` runs the Triton kernels
on CPU through the interpreter; the files that compile whole models (the script's
``compiles`` list) run in a process of their own; ``python -m pytest tests`` without
those runs everything else (reference, API, tracing; ``tests/gpu`` skips without CUDA).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

# Tuning results go to a throwaway folder, never the user's cache: a stored entry
# would change what level 2 runs in the tests that follow.
import tempfile  # noqa: E402

os.environ["MIXSTACK_CACHE_DIR"] = tempfile.mkdtemp(prefix="mixstack-test-cache-")
# Inductor's C++ kernels (torch.compile, deepmd-kit's compiled inference, AOTInductor packages on
# the CPU) built without vector ISA: the tests check what those programs compute, never their
# speed, and the scalar code compiles in about two thirds of the time. Read when Inductor's config
# is first imported (not by `import torch`); a caller's setting is kept.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import helpers  # noqa: E402
from tuning_fakes import tuning_env  # noqa: E402,F401  (the tuning tests' private tables)

import mixstack  # noqa: E402
from mixstack.dispatch import levels  # noqa: E402


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown"


def _numpy_blas() -> str:
    """numpy's BLAS as built (name, version, configuration) and, with threadpoolctl, as loaded."""
    import numpy
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        text = f"{blas.get('name')} {blas.get('version')}"
        if blas.get("openblas configuration"):
            text += f" (build: {blas['openblas configuration']})"
    except Exception:      # an older numpy, or a build without the dict
        text = "unknown"
    try:
        import threadpoolctl
    except ImportError:
        return text + "; threadpoolctl not installed (no run-time BLAS core)"
    loaded = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')} {i.get('num_threads')} threads"
              for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return text + "; loaded: " + ("; ".join(loaded) or "none")


def pytest_report_header(config):
    """Which machine ran the suite: the interpreter's bitwise tests once depended on its BLAS."""
    import numpy
    import triton
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"cpu: {_cpu_model()}, {os.cpu_count()} cores ({usable} usable)",
            f"numpy {numpy.__version__}, BLAS {_numpy_blas()}",
            f"torch {torch.__version__}, triton {triton.__version__}"]


@pytest.fixture(autouse=True)
def _no_level3_verdicts_leak():
    """Level 3's first-use verdicts live for the process: one test's must not decide another's."""
    from mixstack.stack import level3
    level3.forget()
    yield
    level3.forget()


@pytest.fixture(autouse=True)
def _restore_process_level():
    """A test that calls ``set_level`` must not change the level other tests see."""
    saved = levels.process_level()         # the set_level default (None: env / default)
    yield
    mixstack.set_level(saved)


_RUNS: dict = {}


@pytest.fixture(scope="session")
def cached_run():
    """``cached_run(case, level, weights=False, device="cpu")``: ``helpers.run_stack`` on the
    case's seeded inputs, computed once per test run.

    Interpreted kernels are slow, so the accuracy, dispatch and level-equality
    tests share one run per (case, level, weights, device); tests that need an
    independent run (run-to-run identity) call ``helpers.run_stack`` themselves.
    """
    def get(case, level, weights=False, device="cpu"):
        key = (case, level, weights, str(device))
        if key not in _RUNS:
            _RUNS[key] = helpers.run_stack(case, level, helpers.make_inputs(case, device=device),
                                           helpers.make_grad_out(case, device=device), weights=weights)
        return _RUNS[key]
    return get
