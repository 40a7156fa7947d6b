"""The Triton kernels on CPU through the interpreter: this directory needs TRITON_INTERPRET=1.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, i.e. when
``mixstack.kernels`` is first imported, so it must be set for the whole pytest
process: ``TRITON_INTERPRET=1 python -m pytest tests/interpret``.  Without it
every test here is skipped (compiled kernels cannot take CPU tensors).

Every interpreted ``tl.dot`` of this process runs ``exact_dot.exact_create_dot``: exact
products summed in a fixed order, so the bitwise tests do not depend on the host's BLAS
(tests/exact_dot.py says why); the kernels themselves are untouched.  ``interp_speed`` skips two
pieces of the interpreter's work whose results are thrown away (tests/interp_speed.py).
"""

from __future__ import annotations

import exact_dot
import interp_speed
import pytest

import mixstack.kernels.gemm
from mixstack.core import config

exact_dot.install()      # before any kernel runs; raises if this Triton's interpreter changed
interp_speed.install()   # the interpreter's repeated no-op work skipped (tests/interp_speed.py)

KERNELS_INTERPRETED = type(mixstack.kernels.gemm.block_gemm_kernel).__name__ == "InterpretedFunction"
SKIP_REASON = ("Triton kernels were not created under the interpreter: run this directory as "
               "`TRITON_INTERPRET=1 python -m pytest tests/interpret` (TRITON_INTERPRET must be "
               "set before mixstack is imported)")


@pytest.fixture(autouse=True)
def _require_interpreter():
    if not (KERNELS_INTERPRETED and config.triton_interpret()):
        pytest.skip(SKIP_REASON)
