"""``mixstack.deepmd.rest_products``: the rest of a deepmd-kit model's float32 products as
compensated fp16 products.  The split's arithmetic (each value within 2^-22 of its row's largest,
scales exact powers of two, NaN and Inf kept), the product against float64 at float32's error
(and a product that drops the tails failing the same bound), which products take the form, and
the decomposition inside AOTAutograd and Inductor as deepmd-kit's compiled inference lowers a
graph: every eligible product rewritten, the compiled result within the same bound."""

from __future__ import annotations

import pytest
import torch
from rest_products_cases import BOUND, relative_error

from mixstack.deepmd import rest_products
from mixstack.deepmd.rest_products import compensated_products, eligible, product, split


def _operands(m, k, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # rows from 1e-6 to 1e3 and columns from 1e-4 to 1e2: the scaling, not fp16's range, decides
    a = torch.randn(m, k, generator=gen) * torch.logspace(-6, 3, m)[:, None]
    b = torch.randn(k, n, generator=gen) * torch.logspace(-4, 2, n)[None, :]
    return a, b


def test_the_split_holds_each_value_to_its_rows_largest_with_exact_power_of_two_scales():
    a, _ = _operands(64, 40, 1)
    a[3, :5] = torch.tensor([1e-30, -2e-12, 0.0, 7.0, -7.0])
    hi, lo, scale = split(a, -1)
    assert hi.dtype == lo.dtype == torch.float16
    mant, _ = torch.frexp(scale)
    assert torch.all(mant == 0.5), "scales are powers of two"
    y = a / scale
    assert torch.all(y.abs().amax(-1) >= 1) and torch.all(y.abs().amax(-1) < 2)
    err = (hi.double() + lo.double() / 2048 - y.double()).abs().amax(-1)
    assert err.max().item() <= 2.0 ** -22


def test_nan_and_inf_propagate_and_a_zero_row_stays_zero():
    a = torch.tensor([[1.0, float("nan"), 2.0] * 6, [float("inf"), 1.0, 1.0] * 6, [0.0] * 18])
    b = torch.ones(18, 16)
    out = product(a, b)
    assert out[0].isnan().all() and out[1].isnan().all() and (out[2] == 0).all()


@pytest.mark.parametrize("m, k, n", [(300, 128, 128), (104, 27, 400), (64, 576, 32)])
def test_the_product_is_as_close_to_float64_as_a_float32_product(m, k, n):
    a, b = _operands(m, k, n)
    assert relative_error(product(a, b), a, b) <= BOUND
    assert relative_error(a @ b, a, b) <= BOUND                  # the same bar holds fp32's own product


def test_a_product_without_its_tails_fails_the_bound(monkeypatch):
    a, b = _operands(300, 128, 128)
    split_whole = rest_products.split

    def heads_only(x, dim):
        hi, lo, scale = split_whole(x, dim)
        return hi, torch.zeros_like(lo), scale
    monkeypatch.setattr(rest_products, "split", heads_only)
    assert relative_error(product(a, b), a, b) > 100 * BOUND


def test_the_batched_product_matches_each_batch():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 40, 32, generator=gen), torch.randn(3, 32, 24, generator=gen)
    out = product(a, b)
    assert out.shape == (3, 40, 24)
    for i in range(3):
        assert torch.equal(out[i], product(a[i], b[i]))


def test_which_products_take_the_form():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(160, 32, generator=gen), torch.randn(32, 144, generator=gen)
    assert not eligible(a, b)                               # a CPU product stays as it is
    assert eligible(a, b, cpu=True)
    assert not eligible(a.double(), b.double(), cpu=True)
    assert not eligible(a[:, :8], b[:8], cpu=True)          # a short contraction
    assert not eligible(a, b[:, :64], cpu=True)             # rows used too few times to pay for the split
    assert not eligible(a[:100], b, cpu=True)
    with torch._subclasses.FakeTensorMode(shape_env=torch.fx.experimental.symbolic_shapes.ShapeEnv()) as mode:
        edges = mode.shape_env.create_unbacked_symint()
        rows = torch.empty(edges, 32)
        assert eligible(rows, torch.empty(32, 144), cpu=True)       # edge rows, each used 144 times
        assert not eligible(rows, torch.empty(32, 64), cpu=True)
        assert not eligible(torch.empty(27, 32), torch.empty(32, edges), cpu=True)


class _Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.w1 = torch.nn.Parameter(torch.randn(27, 144, generator=gen) * 0.2)       # padded to 32
        self.b1 = torch.nn.Parameter(torch.randn(144, generator=gen))
        self.w2 = torch.nn.Parameter(torch.randn(1, 144, 136, generator=gen) * 0.2)
        self.w3 = torch.nn.Parameter(torch.randn(144, 2, generator=gen))      # too narrow: stays fp32

    def forward(self, x):
        h = torch.tanh(torch.addmm(self.b1, x, self.w1))
        g = torch.bmm(h.reshape(1, -1, 144), self.w2)
        return g.sum() + (h @ self.w3).sum(), g


@pytest.mark.parametrize("form", ["compensated", "kernel"])
def test_the_decomposition_rewrites_a_lowered_graph_and_the_result_keeps_the_bound(form):
    """As deepmd-kit's compiled inference lowers its trace: AOTAutograd with the decomposition table
    read inside ``compensated_products``, Inductor compiling the result (C++ here); the kernel form
    as the operator, kept whole as ``opaque_operators`` keeps mixstack's operators (its body on a
    CPU: the same split, the BLAS's sums)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixstack.dispatch.guards import opaque_operators

    module = _Layers()
    x = torch.randn(160, 27, generator=torch.Generator().manual_seed(4))
    traced = make_fx(module)(x)
    graphs = []

    def compiler(gm, inputs):
        graphs.append(gm)
        return compile_fx_inner(gm, inputs)

    with compensated_products(cpu=True, form=form), opaque_operators(), torch.no_grad():
        from torch._inductor import decomposition
        table = decomposition.select_decomp_table()
        compiled = aot_module_simplified(traced, [x], fw_compiler=compiler, inference_compiler=compiler,
                                         decompositions=table)
    assert decomposition.select_decomp_table is select_decomp_table, "the table is restored on exit"
    float32_products = [n for n in graphs[0].graph.nodes if n.op == "call_function"
                        and n.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                                         torch.ops.aten.addmm.default)
                        and n.meta["val"].dtype == torch.float32 and n.args[0].meta["val"].dtype == torch.float32]
    # the narrow product stays fp32; the two others became the split and an fp64 sum (the CPU's
    # form), or two calls of the operator
    assert len(float32_products) == 1 and float32_products[0].args[1].meta["val"].shape[-1] == 2
    operators = [n for n in graphs[0].graph.nodes if n.target == torch.ops.mixstack.compensated_product.default]
    cats = [n for n in graphs[0].graph.nodes if n.target == torch.ops.aten.cat.default]
    if form == "kernel":
        assert len(operators) == 2 and not cats
    else:
        assert not operators
        assert len(cats) >= 4 and all(n.meta["val"].shape[n.args[1]] % 8 == 0 for n in cats), "aligned thirds"
    _, g = compiled(x)
    with torch.no_grad():
        h = torch.tanh(torch.addmm(module.b1, x, module.w1))
    assert relative_error(g, h.reshape(1, -1, 144), module.w2.detach()) <= 4 * BOUND


def test_a_freezes_target_and_the_setting_choose_the_decompositions(monkeypatch):
    from torch._inductor import compile_fx, decomposition

    from mixstack.core import config
    from mixstack.deepmd.rest_products import for_target

    original = decomposition.select_decomp_table
    with for_target("cuda", "compensated"):
        assert decomposition.select_decomp_table is not original
        assert compile_fx.select_decomp_table is decomposition.select_decomp_table   # AOTInductor's too
    assert decomposition.select_decomp_table is compile_fx.select_decomp_table is original
    for device, products in (("cpu", "compensated"), ("cuda", "exact")):
        with for_target(device, products):
            assert decomposition.select_decomp_table is original
    with pytest.raises(ValueError, match="form"):
        with rest_products.compensated_products(form="tf32"):
            pass
    assert decomposition.select_decomp_table is original
    monkeypatch.delenv("MIXSTACK_DEEPMD_REST_PRODUCTS", raising=False)
    assert config.deepmd_rest_products() == "exact"
    monkeypatch.setenv("MIXSTACK_DEEPMD_REST_PRODUCTS", "compensated")
    assert config.deepmd_rest_products() == "compensated"
    monkeypatch.setenv("MIXSTACK_DEEPMD_REST_PRODUCTS", "tf32")
    with pytest.raises(ValueError, match="MIXSTACK_DEEPMD_REST_PRODUCTS"):
        config.deepmd_rest_products()


def test_a_freezes_batched_products_need_no_bmm_with_out_dtype(monkeypatch):
    # AOTInductor's C shims have mm with out_dtype but not bmm (a freeze's C++ failed to compile)
    from torch._inductor import decomposition
    from torch.fx.experimental.proxy_tensor import make_fx

    from mixstack.deepmd.rest_products import MAX_PACKAGE_BATCH, for_target

    monkeypatch.setattr(rest_products, "eligible", lambda a, b, cpu=False: True)    # meta operands stand for a GPU's

    def targets(fn, batch):
        a = torch.empty(batch, 256, 32, device="meta")
        b = torch.empty(batch, 32, 160, device="meta")
        return [n.target for n in make_fx(fn)(a, b).graph.nodes if n.op == "call_function"]

    with rest_products.compensated_products(form="compensated"):
        assert torch.ops.aten.bmm.dtype in targets(decomposition.select_decomp_table()[torch.ops.aten.bmm.default], 3)
    with for_target("cuda", "compensated"):
        bmm = decomposition.select_decomp_table()[torch.ops.aten.bmm.default]
        used = targets(bmm, 3)
        assert torch.ops.aten.bmm.dtype not in used and used.count(torch.ops.aten.mm.dtype) == 3
        wide = bmm(torch.empty(MAX_PACKAGE_BATCH + 1, 256, 32, device="meta"),
                   torch.empty(MAX_PACKAGE_BATCH + 1, 32, 160, device="meta"))
        assert wide is NotImplemented or wide.dtype == torch.float32 and torch.ops.aten.mm.dtype not in \
            targets(bmm, MAX_PACKAGE_BATCH + 1)                          # too many batches: left exact


def test_a_packages_batched_product_equals_the_batched_form():
    a, b = torch.randn(3, 40, 24), torch.randn(3, 24, 20)
    assert torch.equal(rest_products.product(a, b, package=True), rest_products.product(a, b))
