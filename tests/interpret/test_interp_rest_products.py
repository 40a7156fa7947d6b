"""``mixstack.deepmd.rest_products.product_kernel`` (the general compensated product kernel,
``kernels.product``) in the interpreter: against float64 at float32's error relative to
``|a| @ |b|``, plain, batched, strided and with the wider operand on either side; a kernel whose
tails are dropped fails the same bound."""

from __future__ import annotations

import pytest
import torch
from rest_products_cases import BOUND, relative_error

from mixstack.deepmd import rest_products
from mixstack.deepmd.rest_products import product_kernel


def _operands(shape_a, shape_b, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape_a, generator=gen) * torch.logspace(-5, 3, shape_a[-2])[:, None]
    b = torch.randn(*shape_b, generator=gen) * torch.logspace(-3, 2, shape_b[-1])[None, :]
    return a, b


@pytest.mark.parametrize("shape_a, shape_b", [((70, 27), (27, 40)),          # K and N off the tiles
                                              ((2, 40, 48), (2, 48, 24)),   # batched
                                              ((24, 40), (40, 90))])        # the wider operand is b
def test_the_kernel_is_as_close_to_float64_as_a_float32_product(shape_a, shape_b):
    a, b = _operands(shape_a, shape_b)
    out = product_kernel(a, b, block_m=32, block_k=16)
    assert out.shape == (a @ b).shape and out.dtype == torch.float32
    assert relative_error(out, a, b) <= BOUND


def test_strided_operands_give_the_contiguous_result():
    a, b = _operands((40, 32), (32, 24), seed=1)
    at, bt = a.t().contiguous().t(), b.t().contiguous().t()          # column-major views
    assert torch.equal(product_kernel(at, bt, block_m=32, block_k=16), product_kernel(a, b, block_m=32, block_k=16))


@pytest.mark.parametrize("shape_a, shape_b", [((24, 40), (40, 90)), ((2, 20, 32), (2, 32, 48))])
def test_the_result_is_contiguous_as_the_operators_fake_says_where_b_is_the_wider(shape_a, shape_b):
    # a compiled graph asserts the real strides against the fake's: a transposed result failed there
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = _operands(shape_a, shape_b, seed=4)
    out = torch.ops.mixstack.compensated_product(a, b)
    with FakeTensorMode() as mode:
        fake = torch.ops.mixstack.compensated_product(mode.from_tensor(a), mode.from_tensor(b))
    assert out.is_contiguous() and out.stride() == fake.stride()
    assert relative_error(out, a, b) <= BOUND


def test_a_kernel_without_its_tails_fails_the_bound(monkeypatch):
    a, b = _operands((70, 27), (27, 40), seed=2)
    split_whole = rest_products.split

    def heads_only(x, dim):
        hi, lo, scale = split_whole(x, dim)
        return hi, torch.zeros_like(lo), scale
    monkeypatch.setattr(rest_products, "split", heads_only)
    assert relative_error(product_kernel(a, b, block_m=32, block_k=16), a, b) > 100 * BOUND


def test_the_operator_runs_the_kernel_where_kernels_run():
    a, b = _operands((40, 32), (32, 24), seed=3)
    assert torch.equal(torch.ops.mixstack.compensated_product(a, b), product_kernel(a, b))


def test_a_wider_column_tile_gives_the_same_bound_and_a_bad_one_is_named():
    for shape_a, shape_b in (((70, 32), (32, 24)), ((40, 32), (32, 90))):    # one partial tile; b the wider
        a, b = _operands(shape_a, shape_b, seed=5)
        assert relative_error(product_kernel(a, b, block_m=32, block_k=16, block_n=64), a, b) <= BOUND
    with pytest.raises(ValueError, match="block_n"):
        product_kernel(a, b, block_n=48)
