"""Level 3 for the rest of deepmd-kit's model: its float32 products as compensated fp16 products
inside deepmd-kit's compiled inference.

In an accelerated SeZM frame the stack's products are mixstack's kernels, but deepmd-kit's own
layers (radial and grid MLPs, the S2-grid transforms, attention projections, their gradients)
run as exact fp32 products on cuBLAS at the FFMA rate.  Here each of those products becomes
three fp16 tensor-core products with fp32 accumulation, the split of level 3's stack kernels
(``kernels.compensated``; docs/contract.md §3):

    a @ b  ~=  (a_hi @ b_hi + 2^-11 (a_hi @ b_lo + a_lo @ b_hi)) * s_a * s_b

``a``'s rows and ``b``'s columns are first brought into [1, 2) by exact powers of two ``s`` (the
largest magnitude along the contraction), so fp16's range costs nothing; ``x_hi`` is ``x``
rounded to fp16's 11 significant bits by integer arithmetic on its fp32 bits and ``x_lo`` the
rest scaled by 2^11, in fp16: together ~22 bits, each product ~2^-22 of ``|a| |b|``, the
dropped tail-tail product below that.  Values far below their row's largest fall into fp16's
subnormals, where their error stays under 2^-25 of that largest value.  NaN and Inf propagate.
The three products are one GEMM over the contraction laid out three times,
``[a_hi | a_hi | a_lo] @ [2^11 b_hi ; b_lo ; b_hi]`` (``2^11 b_hi`` is exact in fp16), with a
float32 result (``mm`` / ``bmm`` with ``out_dtype``; in a frozen package one ``mm`` a batch, as
AOTInductor's C shims lack ``bmm``'s) that the scales times 2^-11 undo; unlike
level 3's kernels, head and tails share one accumulator.  The head comes from bit arithmetic,
not from a cast and back, so no compiler can fold ``x - fp16(x)`` to zero (as Inductor does to
that form in ATen ops).

The rewrite is a decomposition: ``compensated_products()`` adds entries for ``aten.mm``,
``aten.bmm`` and ``aten.addmm`` to the table deepmd-kit hands AOTAutograd
(``torch._inductor.decomposition.select_decomp_table``, looked up at each compile), so the
lowered graph holds the split as elementwise work that Inductor fuses where it can, and the
products as cuBLAS fp16 GEMMs.  Each third of the contraction is zero-padded to a multiple of
``ALIGN`` (fp16 GEMMs on tensor cores want 16-byte rows; an unaligned one fell back to a slow
sm_75 kernel on an H100).  The split reads the larger operand twice (its row maxima, then the
split) and writes it three times at half the width, so only products that reuse each of its rows
many times can pay: a float32 product on a GPU takes the form when its contraction is at least
``MIN_K`` and the output side that the larger operand does not span is at least ``MIN_REUSE``
(with the larger operand's own rows symbolic, an edge or atom count, or both sides at least
``MIN_REUSE``); every other product is left to the table's own entry.  With ``form="kernel"``
each eligible product is instead the ``mixstack::compensated_product`` operator
(``product_kernel``, ``kernels.product``): the larger operand split in registers, never written
in another form, head and tails in separate accumulators.  Measured against the exact products
on an H100 (BENCHMARKS.md, "The rest of the model's products, compensated"): the ATen form was
slower in the water frame before the padding and the reuse rule; both forms are opt-in
(``accelerate(..., rest_products=)``) until a measurement says otherwise.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from ..core import config
from ..dispatch.guards import kernels_can_run

aten = torch.ops.aten
FORMS = tuple(p for p in config.REST_PRODUCTS if p != "exact")     # "compensated" (ATen operations), "kernel"

MIN_K = 16          # contraction length below which a product stays exact fp32
MIN_REUSE = 128     # uses of each of the larger operand's rows below which the split does not pay
ALIGN = 8           # fp16 elements in 16 bytes: each third of the contraction padded to a multiple
MAX_PACKAGE_BATCH = 64   # a package's batched product of the ATen form: one mm a batch, so a few only
_EXPONENT = 0x7F800000
_HALF_ULP11 = 0x1000     # half a unit in the 11th significant bit of an fp32 value
_KEEP11 = -0x2000        # 0xFFFFE000: sign, exponent and the top 10 stored mantissa bits
TAIL_SCALE = 2048.0      # 2^11: a tail in fp16 keeps its 11 bits down to 2^-25 of the row's largest


def _pow2_floor(amax: torch.Tensor) -> torch.Tensor:
    """The power of two at or below each ``amax`` (its exponent bits alone), 1 where ``amax`` is
    0 or subnormal: dividing by it is exact and brings the largest value into [1, 2)."""
    up = (amax.view(torch.int32) & _EXPONENT).view(torch.float32)
    return torch.where(up == 0, torch.ones_like(up), up)


def split(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hi, lo, scale)``: ``x / scale == hi + lo / 2^11`` to within 2^-22 of the largest
    magnitude along ``dim`` (which ``scale``, a power of two, brings into [1, 2)); ``hi`` and
    ``lo`` in fp16."""
    scale = _pow2_floor(x.abs().amax(dim=dim, keepdim=True))
    y = x / scale
    hi = ((y.view(torch.int32) + _HALF_ULP11) & _KEEP11).view(torch.float32)
    return hi.to(torch.float16), ((y - hi) * TAIL_SCALE).to(torch.float16), scale


def product(a: torch.Tensor, b: torch.Tensor, *, package: bool = False) -> torch.Tensor:
    """``a @ b`` for float32 ``a (..., M, K)`` and ``b (..., K, N)`` (2-D or 3-D alike) as one
    fp16 GEMM over the split operands with a float32 result (see the module's doc).  ``package``:
    a batched product as one ``mm`` a batch (AOTInductor's C shims have ``mm`` with ``out_dtype``
    but not ``bmm``; the batch must be static)."""
    a_hi, a_lo, a_scale = split(a, -1)
    b_hi, b_lo, b_scale = split(b, -2)
    pad = -a.shape[-1] % ALIGN
    if pad:                                     # zero columns of a and rows of b add nothing
        a_hi, a_lo = (torch.nn.functional.pad(t, (0, pad)) for t in (a_hi, a_lo))
        b_hi, b_lo = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (b_hi, b_lo))
    a3 = torch.cat((a_hi, a_hi, a_lo), dim=-1)
    b3 = torch.cat((b_hi * TAIL_SCALE, b_lo, b_hi), dim=-2)
    if a.device.type == "cpu":      # no fp16 GEMM with an fp32 result there: the same products, summed in fp64
        raw = (a3.double() @ b3.double()).float()
    elif a.dim() == 2:
        raw = aten.mm.dtype(a3, b3, torch.float32)
    elif package:
        raw = torch.stack([aten.mm.dtype(x, y, torch.float32) for x, y in zip(a3.unbind(0), b3.unbind(0))])
    else:
        raw = aten.bmm.dtype(a3, b3, torch.float32)
    return raw * (a_scale * (1.0 / TAIL_SCALE)) * b_scale


def product_kernel(a: torch.Tensor, b: torch.Tensor, *, block_m: int = 64, block_k: int = 32,
                   block_n: int | None = None, num_warps: int | None = None, num_stages: int = 3) -> torch.Tensor:
    """``a @ b`` as ``product`` computes it, by one Triton kernel (``kernels.product``): ``b``
    split here (per-column scales), ``a`` split in registers after a pass over its rows' maxima,
    head and tails in separate accumulators; the larger operand streams as the kernel's rows
    (``(b^T a^T)^T`` where ``b`` is the wider, written through the output's transpose so that the
    result is contiguous either way, as the operator's fake promises).  Float32 2-D or 3-D
    operands on a GPU, or on the CPU under ``TRITON_INTERPRET=1``.  ``block_n`` (default: the
    columns' power of two, at most 128) is the column tile."""
    import triton

    from ..kernels.product import compensated_product_kernel

    flat = a.dim() == 2
    a3, b3 = (a.unsqueeze(0), b.unsqueeze(0)) if flat else (a, b)
    result = torch.empty(*a3.shape[:-1], b3.shape[-1], device=a.device, dtype=torch.float32)
    out = result
    if b3.shape[-1] > a3.shape[-2]:         # (b^T a^T)^T, written through the transposed view: contiguous
        a3, b3, out = b3.mT, a3.mT, result.mT
    hi, lo, up = (t.contiguous() for t in split(b3, -2))
    batch, m, k = a3.shape
    n = b3.shape[-1]
    if block_n is None:                     # each column tile re-reads and re-splits its rows of a
        block_n = min(128, max(16, triton.next_power_of_2(n)))
    elif block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two of at least 16, got {block_n}")
    num_warps = num_warps or (8 if block_m * block_n > 64 * 64 else 4)    # two fp32 accumulators a program
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), batch)
    wrap_triton(compensated_product_kernel)[grid](a3, hi, lo, up, out, m, n, *a3.stride(), *hi.stride(), *out.stride(),
                                     K=k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                     num_warps=num_warps, num_stages=num_stages)
    return result[0] if flat else result


@triton_op("mixstack::compensated_product", mutates_args=())
def compensated_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The operator of the kernel form (``rest_products="kernel"``): ``product_kernel`` where
    mixstack's kernels run (a GPU, or the interpreter outside a trace), ``product`` elsewhere (the
    same split, its products summed by the BLAS).  Kept whole in deepmd-kit's compiled inference
    (``guards.opaque_operators``); traced into a package's graph under a kernel target."""
    if kernels_can_run(a) and not (config.triton_interpret() and is_fake(a)):
        return product_kernel(a, b)
    return product(a, b)


def _static(n) -> int | None:
    return n if isinstance(n, int) else None


def eligible(a: torch.Tensor, b: torch.Tensor, *, cpu: bool = False) -> bool:
    """Whether ``a @ b`` takes the compensated form: both float32 on a GPU (or the CPU where
    ``cpu``), a static contraction of at least ``MIN_K``, and each row of the larger operand used
    at least ``MIN_REUSE`` times (see the module's doc; a symbolic side counts as the larger)."""
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        return False
    if a.device.type != "cuda" and not (cpu and a.device.type == "cpu"):
        return False
    k = _static(a.shape[-1])
    if k is None or k < MIN_K:
        return False
    m, n = _static(a.shape[-2]), _static(b.shape[-1])
    if m is None and n is None:
        return False
    if m is None or n is None:              # the symbolic side is the larger operand's rows
        return (n if m is None else m) >= MIN_REUSE
    return min(m, n) >= MIN_REUSE


def _decompositions(table: dict, *, cpu: bool, form: str, package: bool = False) -> dict:
    """``table`` with compensated ``mm``, ``bmm`` and ``addmm`` (``form``: ``"compensated"``, the
    split and one fp16 GEMM in ATen operations, or ``"kernel"``, the
    ``mixstack::compensated_product`` operator); an ineligible product goes to ``table``'s own
    entry for it, or stays as it is.  ``package``: for an AOTInductor package (``product``'s
    ``package``; a batched product of the ATen form needs a static batch of at most
    ``MAX_PACKAGE_BATCH``)."""
    if form == "compensated":
        compensated = functools.partial(product, package=package)
    else:
        compensated = torch.ops.mixstack.compensated_product

    def batched(a, b):
        if not (package and form == "compensated"):
            return eligible(a, b, cpu=cpu)
        batch = _static(a.shape[0])
        return batch is not None and batch <= MAX_PACKAGE_BATCH and eligible(a, b, cpu=cpu)

    def fallback(op, *args, **kwargs):
        own = table.get(op)
        return own(*args, **kwargs) if own is not None else NotImplemented

    def mm(a, b):
        return compensated(a, b) if eligible(a, b, cpu=cpu) else fallback(aten.mm.default, a, b)

    def bmm(a, b):
        return compensated(a, b) if batched(a, b) else fallback(aten.bmm.default, a, b)

    def addmm(bias, a, b, *, beta=1, alpha=1):
        if not eligible(a, b, cpu=cpu):
            return fallback(aten.addmm.default, bias, a, b, beta=beta, alpha=alpha)
        out = compensated(a, b)
        out = out if alpha == 1 else out * alpha
        return out + (bias if beta == 1 else bias * beta)

    return {**table, aten.mm.default: mm, aten.bmm.default: bmm, aten.addmm.default: addmm}


@contextlib.contextmanager
def compensated_products(*, cpu: bool = False, form: str = "compensated", package: bool = False):
    """Inside: Inductor's decomposition table (``select_decomp_table``, as deepmd-kit's compiled
    inference reads it at each compile and AOTInductor's ``compile_fx`` for a frozen package)
    turns eligible float32 products into compensated ones of ``form`` (``FORMS``).  ``cpu`` lets
    CPU products take it too (the tests' check of the rewrite); ``package``: the products of an
    AOTInductor package (a freeze), batched ones without ``bmm``'s ``out_dtype``."""
    from torch._inductor import compile_fx, decomposition

    if form not in FORMS:                   # named before anything is patched
        raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    original = decomposition.select_decomp_table

    def select_decomp_table():
        return _decompositions(original(), cpu=cpu, form=form, package=package)

    owners = [m for m in (decomposition, compile_fx) if getattr(m, "select_decomp_table", None) is original]
    for owner in owners:
        owner.select_decomp_table = select_decomp_table
    try:
        yield
    finally:
        for owner in owners:
            owner.select_decomp_table = original


def for_model(products: str, *, package: bool = False) -> contextlib.AbstractContextManager:
    """The decompositions for a model's ``rest_products`` setting: ``"exact"`` none,
    ``"compensated"`` the ATen form, ``"kernel"`` the operator (``package``: for a freeze)."""
    if products == "exact":
        return contextlib.nullcontext()
    return compensated_products(form=products, package=package)


def for_target(device, products: str) -> contextlib.AbstractContextManager:
    """A freeze's decompositions: ``for_model(products, package=True)`` where ``device`` is a GPU;
    nothing otherwise."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return for_model(products, package=True)
