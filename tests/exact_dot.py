"""The interpreter's ``tl.dot`` made independent of the host's BLAS (installed by tests/interpret/conftest.py).

Under ``TRITON_INTERPRET=1`` a ``tl.dot`` is ``InterpreterBuilder.create_dot``:
``np.matmul(a, b, dtype=d.dtype) + d``.  numpy hands the product to the host's BLAS, which
may sum a tile's K products in an order that depends on the tile's M and N (OpenBLAS's
Zen kernels do), so one row of A times B rounds differently in a 16-row and a 64-row tile,
and two kernels that add the same K tiles in the same order (relay and fused, level 1 and
level 2) differ in the last bit on some CPUs only.  The suite's bitwise rules are about the
kernels' own K order (which K tile joins the accumulator when), which this keeps: only the
arithmetic inside one ``tl.dot`` is replaced.  The operands are widened to float64 (a
product of two fp32, fp16 or fp8 values is exact there), summed over K one ``k`` at a time
with elementwise numpy (no matmul, einsum or dot, whose order is the CPU's choice), rounded
once to the accumulator's dtype and added to it as Triton does, ``round(a @ b) + d``.
The fp8 operands go through Triton's own fp8 -> fp16 conversion first, as in Triton.
Integer dots keep Triton's numpy matmul: integer sums do not depend on order.

Only the test process's interpreter changes: the kernels, the compiled (GPU) path and
the ``mixstack`` package are untouched.
"""

from __future__ import annotations

import inspect

import numpy as np

# The create_dot this replaces, as Triton 3.6 and 3.7 define it.
EXPECTED_PARAMETERS = ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"]

_triton_create_dot = None      # Triton's own, kept for integer dots


def ordered_matmul(a, b) -> np.ndarray:
    """``a @ b`` over the last two axes (leading axes batched) in float64: each product exact
    for fp32/fp16 operands, summed over k = 0, 1, ... in that order, whatever the shapes."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    acc = np.zeros(shape)
    term = np.empty(shape)
    for k in range(a.shape[-1]):
        np.multiply(a[..., :, k:k + 1], b[..., k:k + 1, :], out=term)   # elementwise: exact IEEE
        acc += term
    return acc


def exact_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """``InterpreterBuilder.create_dot`` with the product from ``ordered_matmul``."""
    from triton.runtime import interpreter
    if not np.issubdtype(d.data.dtype, np.floating):
        return _triton_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    a_data, b_data = a.data, b.data
    if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
       (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
        # Triton's fp8 branch, verbatim: both operands through its fp8 -> fp16 conversion
        f16 = interpreter.tl.float16
        a_data = interpreter._convert_float(a_data, a.dtype, f16, None).view(np.float16)
        b_data = interpreter._convert_float(b_data, b.dtype, f16, None).view(np.float16)
    product = ordered_matmul(a_data, b_data).astype(d.data.dtype)     # one rounding to the accumulator
    return interpreter.TensorHandle(product + d.data, d.dtype.scalar)


def install() -> None:
    """Make every interpreted ``tl.dot`` of this process run ``exact_create_dot``.  Raises if
    this Triton's interpreter lacks the method, or its signature, that the hook replaces:
    the suite's bitwise tests must not run silently on the host's BLAS."""
    global _triton_create_dot
    from triton.runtime import interpreter
    builder = getattr(interpreter, "InterpreterBuilder", None)
    current = getattr(builder, "create_dot", None)
    if current is exact_create_dot:
        return
    missing = [name for name in ("TensorHandle", "_convert_float", "tl") if not hasattr(interpreter, name)]
    if current is None or missing:
        raise RuntimeError(
            "tests/exact_dot.py cannot make the interpreter's tl.dot BLAS-independent: "
            f"triton.runtime.interpreter lacks {missing or ['InterpreterBuilder.create_dot']} "
            "(Triton changed its interpreter; update the hook for this Triton version)")
    found = list(inspect.signature(current).parameters)
    if found != EXPECTED_PARAMETERS:
        raise RuntimeError(
            "tests/exact_dot.py cannot make the interpreter's tl.dot BLAS-independent: "
            f"InterpreterBuilder.create_dot takes {found}, the hook expects {EXPECTED_PARAMETERS} "
            "(Triton changed its interpreter; update the hook for this Triton version)")
    _triton_create_dot = current
    builder.create_dot = exact_create_dot
