"""tests/interp_speed.py: the interpreter's skipped work changes nothing a kernel computes, and a
launch leaves ``triton.language`` as it found it."""

from __future__ import annotations

import interp_speed
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter


@triton.jit
def _offset(i, n):
    return i * n + 1                  # integer * and +: the sanitiser's operations


@triton.jit
def _nested_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    off = _offset(i, n)
    tl.store(y_ptr + i, tl.load(x_ptr + off - 1) * 2.0)


def test_the_shim_is_installed_and_the_sanitiser_is_off_only_because_its_asserts_are_off():
    options = interpreter.interpreter_builder.options
    assert interpreter._patch_lang.__module__ == "interp_speed"
    assert options.debug is False and options.sanitize_overflow is False


def test_a_kernel_with_a_nested_function_computes_the_same_and_restores_the_language():
    before = tl.load
    x = torch.arange(64, dtype=torch.float32)
    y = torch.zeros(16)
    _nested_kernel[(2,)](x, y, 3, BLOCK=16)
    assert torch.equal(y, x[::3][:16] * 2.0)
    assert tl.load is before and tl.core.is_builtin(tl.load)     # the launch's patch undone
    assert interp_speed._active_langs == []                        # no launch left open
