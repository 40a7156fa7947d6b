"""The BLAS-independent ``tl.dot`` of the interpreter (tests/exact_dot.py): what it computes,
that it does not depend on the tile's shape, and that the bitwise tests still see a kernel
whose K order changes."""

from __future__ import annotations

import exact_dot
import helpers
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from helpers import Case
from triton.runtime import interpreter

import mixstack
import mixstack.kernels.gemm
from mixstack.kernels.degree_order import degree_order_k

F32_EPS = 2.0 ** -24      # unit roundoff of float32 (round to nearest)
F64_EPS = 2.0 ** -53


def _handle(x: np.ndarray, dtype) -> interpreter.TensorHandle:
    return interpreter.TensorHandle(x, dtype)


def _dot(a, b, d=None, dtype=tl.float32, acc=tl.float32, hook=exact_dot.exact_create_dot):
    """One interpreted ``tl.dot`` on numpy operands (``a``, ``b`` in ``dtype``'s storage)."""
    if d is None:
        d = np.zeros(a.shape[:-1] + b.shape[-1:], dtype=np.int32 if acc == tl.int32 else np.float32)
    return hook(None, _handle(a, dtype), _handle(b, dtype), _handle(d, acc), "ieee", 0).data


def _random(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_interpreters_tl_dot_is_the_hook():
    assert interpreter.InterpreterBuilder.create_dot is exact_dot.exact_create_dot


def test_the_hook_refuses_an_interpreter_it_does_not_know(monkeypatch):
    """A Triton whose create_dot changed fails loudly instead of running on the host's BLAS."""
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", lambda self, a, b, c, precision: None)
    with pytest.raises(RuntimeError, match="takes .* the hook expects"):
        exact_dot.install()
    monkeypatch.delattr(interpreter.InterpreterBuilder, "create_dot")
    with pytest.raises(RuntimeError, match="InterpreterBuilder.create_dot"):
        exact_dot.install()


@pytest.mark.parametrize("dtype, np_dtype", [(tl.float32, np.float32), (tl.float16, np.float16)])
def test_the_product_is_float64_matmul_rounded_once(dtype, np_dtype):
    """Each element is float64's ``a @ b`` rounded to float32, up to the float64 sum's own
    rounding: where the two differ, the float32 rounding boundary between them lies within
    the float64 error bound of the exact sum."""
    a, b = _random(64, 128, seed=1).astype(np_dtype), _random(128, 32, seed=2).astype(np_dtype)
    got = _dot(a, b, dtype=dtype).astype(np.float64)
    want64 = torch.from_numpy(a).double() @ torch.from_numpy(b).double()
    want32 = want64.float().double().numpy()
    bound = 2 * a.shape[1] * F64_EPS * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    differ = got != want32
    assert differ.mean() < 0.01
    midpoint = (got + want32) / 2                              # the rounding boundary between the two
    assert np.all(np.abs(midpoint - want64.numpy())[differ] <= bound[differ])
    assert np.all(np.abs(got - want32)[differ] <= 2 * F32_EPS * np.abs(want32)[differ])


def test_the_accumulator_is_added_after_the_product_is_rounded():
    a, b, d = _random(16, 64, seed=3), _random(64, 16, seed=4), _random(16, 16, seed=5)
    assert np.array_equal(_dot(a, b, d), _dot(a, b) + d)


def test_a_row_gets_the_same_bits_in_any_tile_shape():
    """The property the host's BLAS broke: row i of A times B does not depend on the rows and
    columns around it (16-row against 64-row tiles, 16 against 64 columns, batched or not)."""
    a, b = _random(64, 64, seed=6), _random(64, 64, seed=7)
    whole = _dot(a, b)
    for rows in (slice(0, 16), slice(16, 32), slice(48, 64)):
        assert np.array_equal(_dot(a[rows], b), whole[rows])
        assert np.array_equal(_dot(a[rows], b[:, :16]), whole[rows, :16])
    batched = _dot(np.stack([a[:16], a[32:48]]), np.stack([b, b]))
    assert np.array_equal(batched, np.stack([whole[:16], whole[32:48]]))


@pytest.mark.parametrize("dtype, np_dtype, acc", [(tl.float32, np.float32, tl.float32),
                                                  (tl.float16, np.float16, tl.float32),
                                                  (tl.int8, np.int8, tl.int32)])
def test_exact_sums_match_tritons_own_dot(dtype, np_dtype, acc):
    """Where every sum is exact (small integers) the hook and Triton's create_dot agree: the
    hook changes the order of the sum, nothing else (dtypes, accumulator, result type)."""
    rng = np.random.default_rng(8)
    a, b = (rng.integers(-8, 8, shape).astype(np_dtype) for shape in [(2, 16, 32), (2, 32, 16)])
    d = rng.integers(-8, 8, (2, 16, 16)).astype(np.int32 if acc == tl.int32 else np.float32)
    ours = _dot(a, b, d, dtype=dtype, acc=acc)
    theirs = _dot(a, b, d, dtype=dtype, acc=acc, hook=exact_dot._triton_create_dot)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_fp8_operands_go_through_tritons_conversion():
    """fp8 operands (stored as bytes) are converted to fp16 as Triton does, then multiplied."""
    rng = np.random.default_rng(9)
    a, b = (torch.from_numpy(rng.integers(-8, 8, shape).astype(np.float32)) for shape in [(16, 32), (32, 16)])
    a8, b8 = (x.to(torch.float8_e5m2).view(torch.uint8).numpy() for x in (a, b))
    ours = _dot(a8, b8, dtype=tl.float8e5)
    assert np.array_equal(ours, _dot(a8, b8, dtype=tl.float8e5, hook=exact_dot._triton_create_dot))
    assert np.array_equal(ours, (a @ b).numpy())


# A GEMM whose K loop the test can reverse: the smallest kernel with a K order of its own.
@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, K: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, REVERSED_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, N)
    acc = tl.zeros((BLOCK_M, N), dtype=tl.float32)
    for t in tl.range(0, K // BLOCK_K):
        if REVERSED_K:
            k0 = K - BLOCK_K - t * BLOCK_K
        else:
            k0 = t * BLOCK_K
        a = tl.load(a_ptr + rows[:, None] * K + (k0 + rk)[None, :], mask=rows[:, None] < M, other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + cols[None, :])
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=rows[:, None] < M)


def _gemm(a, b, block_m, reversed_k=False, block_k=16):
    c = torch.empty(a.shape[0], b.shape[1])
    grid = (triton.cdiv(a.shape[0], block_m),)
    _gemm_kernel[grid](a, b, c, a.shape[0], a.shape[1], b.shape[1], block_m, block_k, reversed_k)
    return c


def test_a_kernels_result_is_its_k_order_over_the_hooks_tile_products():
    """The hook stands for the tile product only: the kernel's K loop (round each K tile's
    product, then add it to the accumulator) is reproduced bit for bit, in either order."""
    a, b = torch.from_numpy(_random(40, 64, seed=10)), torch.from_numpy(_random(64, 32, seed=11))
    for reversed_k in (False, True):
        acc = np.zeros((40, 32), dtype=np.float32)
        for k0 in sorted(range(0, 64, 16), reverse=reversed_k):
            acc = exact_dot.ordered_matmul(a[:, k0:k0 + 16].numpy(), b[k0:k0 + 16].numpy()).astype(np.float32) + acc
        assert torch.equal(_gemm(a, b, 16, reversed_k), torch.from_numpy(acc))


def test_the_same_k_order_gives_the_same_bits_in_16_and_64_row_tiles():
    a, b = torch.from_numpy(_random(100, 64, seed=12)), torch.from_numpy(_random(64, 32, seed=13))
    assert torch.equal(_gemm(a, b, 16), _gemm(a, b, 64))


def test_the_bitwise_comparison_still_sees_a_changed_k_order():
    """The hook fixes the order inside one tl.dot only: the same GEMM with its K tiles added in
    reverse is as accurate, and the suite's comparison (torch.equal) tells the two apart."""
    a, b = torch.from_numpy(_random(64, 64, seed=14)), torch.from_numpy(_random(64, 32, seed=15))
    forward, reverse = _gemm(a, b, 16), _gemm(a, b, 16, reversed_k=True)
    want = a.double() @ b.double()
    helpers.assert_close_rel(forward, want, "forward K order")
    helpers.assert_close_rel(reverse, want, "reversed K order")
    assert not torch.equal(forward, reverse)


@triton.jit
def _reversed_degree_order_k(t, second, LMAX: tl.constexpr, CF: tl.constexpr, BLOCK_K: tl.constexpr):
    """``degree_order_k`` walked backwards: the stack's K tiles in the opposite order."""
    n_k = tl.where(second, 2 * LMAX, LMAX + 1) * (CF // BLOCK_K)
    return degree_order_k(n_k - 1 - t, second, LMAX, CF, BLOCK_K)


def test_the_stack_at_level1_with_its_k_order_reversed_gives_other_bits(monkeypatch):
    """A real kernel path: the stack's GEMMs with the degree order reversed (the interpreter
    looks jit helpers up in the kernel module when it runs) stay within the float64
    contract, and the bitwise tests would catch the change."""
    case = Case(F=1, E=33, Cf=16, lmax=2, n_layers=2)
    inputs = helpers.make_inputs(case)

    def forward():
        with torch.no_grad(), mixstack.use_level(1), mixstack.dispatch_log() as log:
            out = mixstack.mixing_stack(*inputs, **case.kw)
        assert dict(log) == {"fwd:triton": 1}
        return out

    usual = forward()
    monkeypatch.setattr(mixstack.kernels.gemm, "degree_order_k", _reversed_degree_order_k)
    reversed_order = forward()
    want, _ = helpers.reference64(case, inputs)
    helpers.assert_close_rel(reversed_order, want, "forward, K order reversed")
    assert not torch.equal(usual, reversed_order)
