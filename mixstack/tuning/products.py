"""Where the exact levels' products run on the vendor BLAS instead of Triton's exact dot.

At levels 1 and 2 every product is exact fp32.  Triton's exact dot is bound by shared-memory
bandwidth below the fp32 roof, where cuBLAS (TF32 off) comes closer to it at the wide keys' long
K (BENCHMARKS.md, "No cliffs at the wide keys").  At the keys named here the
block products and the gate's two small products (``stack.blas``) run as cuBLAS products, the
rest (sigmoids, gating, residuals, alpha) in the same Triton kernels as everywhere else.

The route is chosen by the key's ``(Cf, lmax)`` and the device alone, never by the level or a
launch config, so levels 1 and 2 take the same path at every key and give the same bits
(docs/contract.md §2).  The keys come from a grid run that measured both routes
(``mixstack bench grid --levels 0c,1,2,1b,2b``; its ``products.json``): the user's own copy in the
tuning cache (``<cache dir>/<device>.products.json``) where there is one, else the one shipped beside
the device's table; a device with neither runs Triton everywhere.  ``MIXSTACK_PRODUCTS`` (``auto``,
``blas``, ``triton``) or ``use_products`` overrides the choice for every key (benches, tests).
Level 3 never takes this route: its products are the compensated tensor-core ones.
"""

from __future__ import annotations

import contextlib

import torch

from ..core.config import PRODUCT_ROUTES, env_products, product_route
from ..core.layout import StackLayout
from ..dispatch.guards import tracing
from . import store
from .validity import device_name

ROUTES = PRODUCT_ROUTES
VARIABLE = "MIXSTACK_PRODUCTS"
VERDICT_MARGIN = 0.02           # a grid verdict moves a key to the BLAS where it won by this much at both levels

_override: str | None = None
_keys: dict[str, frozenset] = {}


def route() -> str:
    """The route asked for: ``use_products``'s, else ``MIXSTACK_PRODUCTS``, else ``"auto"``."""
    return _override if _override is not None else env_products()


@contextlib.contextmanager
def use_products(which: str):
    """Inside: every key's exact products run on ``which`` (``"blas"``, ``"triton"``, or
    ``"auto"``: the device's measured keys).  Read when a call launches its kernels: a graph
    captured or a program compiled inside keeps the route it was made with."""
    global _override
    previous, _override = _override, product_route(which, "use_products(which)")
    try:
        yield
    finally:
        _override = previous


def verdicts_path(device: str) -> str:
    """Where the shipped product verdicts for ``device`` live: beside its built-in table."""
    return store.verdicts_path(device, "products")


def user_verdicts_path(device: str) -> str:
    """Where a user's own product verdicts for ``device`` live: beside their tuning table in the
    cache directory (``MIXSTACK_CACHE_DIR``); they replace the shipped ones for that device."""
    return store.verdicts_path(device, "products", user=True)


def _blas_groups(doc: dict) -> frozenset:
    """The ``(Cf, lmax)`` groups a verdict file names."""
    return frozenset((int(k["focus_dim"]), int(k["lmax"])) for k in doc.get("blas", []))


def blas_keys(device: str) -> frozenset:
    """``{(Cf, lmax)}`` whose products run on the BLAS on ``device`` (read once per process): the
    user's verdict file where it stands, else the shipped one, else none."""
    if device not in _keys:
        found = store.read_device_verdicts(device, (user_verdicts_path(device), verdicts_path(device)),
                                           _blas_groups)
        _keys[device] = found or frozenset()
    return _keys[device]


def forget_keys() -> None:
    """Read the verdict files again at the next call (tests, a new file)."""
    _keys.clear()


def on_blas(layout: StackLayout, t: torch.Tensor) -> bool:
    """Whether the exact products of ``layout``'s stack on ``t``'s device run on the BLAS.  Never
    while a compiler traces the operators' bodies: a compiled program runs Triton's products
    (docs/contract.md §3, "Exact products on the BLAS", says why)."""
    if tracing(t):
        return False
    which = route()
    if which != "auto":
        return which == "blas"
    if t.device.type != "cuda":
        return False
    return (layout.focus_dim, layout.lmax) in blas_keys(device_name(t.device))


@contextlib.contextmanager
def exact_products():
    """cuBLAS's fp32 products in IEEE fp32 (TF32 off) inside, whatever the caller set; restored
    after.  Eager calls only: a compiled program's products follow torch's setting when it runs."""
    matmul = torch.backends.cuda.matmul
    # torch's new setting where it has one: reading the legacy flag raises once a caller used the new
    name, off = ("fp32_precision", "ieee") if hasattr(matmul, "fp32_precision") else ("allow_tf32", False)
    previous = getattr(matmul, name)
    setattr(matmul, name, off)
    try:
        yield
    finally:
        setattr(matmul, name, previous)


def verdicts(records: list[dict], margin: float = VERDICT_MARGIN) -> list[dict]:
    """From grid records that measured ``L1``, ``L2``, ``L1-blas`` and ``L2-blas``: the
    ``(Cf, lmax)`` groups where the BLAS route beat Triton by ``margin`` at both levels at
    every measured F (one route per ``(Cf, lmax)``: the key the route is chosen by)."""
    groups: dict[tuple[int, int], list[float]] = {}
    for rec in records:
        med = {t["variant"]: t["median_ms"] for t in rec["timings"] if t["pass"] == "both"}
        if not all(med.get(v) for v in ("L1", "L2", "L1-blas", "L2-blas")):
            continue
        key = rec["key"]
        speedup = min(med["L1"] / med["L1-blas"], med["L2"] / med["L2-blas"])
        groups.setdefault((int(key["focus_dim"]), int(key["lmax"])), []).append(speedup)
    return [{"focus_dim": cf, "lmax": lmax, "speedup": round(min(s), 4)}
            for (cf, lmax), s in sorted(groups.items()) if min(s) >= 1.0 + margin]


__all__ = ["ROUTES", "VARIABLE", "blas_keys", "exact_products", "forget_keys", "on_blas", "route",
           "use_products", "user_verdicts_path", "verdicts", "verdicts_path"]
