"""Test-suite wiring: make ``helpers`` importable and keep level state from leaking.

The suite runs as two pytest processes (scripts/run_tests.sh):
``TRITON_INTERPRET=1 python -m pytest tests/interpret`` runs the Triton kernels
on CPU through the interpreter; ``python -m pytest tests --ignore=tests/interpret``
runs everything else (reference, API, tracing; ``tests/gpu`` skips without CUDA).
"""

from __future__ import annotations

import os
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

# Tuning results go to a throwaway folder, never the user's cache: a stored entry
# would change what level 2 runs in the tests that follow.
import tempfile  # noqa: E402

os.environ["MIXSTACK_CACHE_DIR"] = tempfile.mkdtemp(prefix="mixstack-test-cache-")

import helpers  # noqa: E402
from tuning_fakes import tuning_env  # noqa: E402,F401  (the tuning tests' private tables)

import mixstack  # noqa: E402
from mixstack.dispatch import levels  # noqa: E402


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
