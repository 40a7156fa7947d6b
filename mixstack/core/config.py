"""The ``MIXSTACK_*`` environment variables, read in one place and only when asked.

| variable | meaning | Python equivalent |
|---|---|---|
| ``MIXSTACK_LEVEL`` | process default level 0..3 | ``mixstack.set_level`` |
| ``MIXSTACK_CACHE_DIR`` | where tuning results persist | ``mixstack.core.config.set_cache_dir`` |
| ``MIXSTACK_CONV_KERNELS`` | ``0``: the convolution's operators run their reference at every level | — |
| ``MIXSTACK_PRODUCTS`` | ``auto`` (default): the exact products of the keys the device's grid chose run on the BLAS; ``blas`` / ``triton``: every key's | ``mixstack.tuning.products.use_products`` |
| ``MIXSTACK_DEEPMD`` | ``1``: deepmd-kit's commands run SeZM (DPA4) models through ``mixstack.deepmd`` | ``mixstack.deepmd.accelerate`` |
| ``MIXSTACK_DEEPMD_REST_PRODUCTS`` | ``exact`` (default), ``compensated`` or ``kernel``: how deepmd-kit's compiled graphs of an accelerated model (its compiled inference, ``dp --pt freeze`` / ``--pt-expt freeze`` to a GPU) run the rest of its float32 products | ``mixstack.deepmd.accelerate(..., rest_products=)`` |
| ``MIXSTACK_FREEZE_TUNE_SECONDS`` | the freeze-time tuning's budget in seconds (default 300; ``0``: no tuning) | ``mixstack.export.tune_for_freeze(..., seconds=)`` |
| ``MIXSTACK_FREEZE_SINGLE_RANK`` | ``1``: deepmd-kit's freezes write no multi-rank (with-comm) artifact: one AOTInductor compile, a package for one LAMMPS rank | ``mixstack.deepmd.freeze.single_rank`` |
| ``MIXSTACK_PRIVATE_CXX_RUNTIME`` | ``1``: a frozen package is linked with its own hidden copy of libstdc++ (``mixstack.cxx_runtime``) | ``freeze(..., private_cxx_runtime=True)`` |
| ``MIXSTACK_RESULTS_DIR`` | where the commands write results without ``--out`` | ``mixstack.core.config.set_results_dir`` |

``TRITON_INTERPRET`` (Triton's own switch) is read here too: with it set, the
Triton levels run on CPU tensors through the interpreter.
"""

from __future__ import annotations

import os
import sys

_cache_dir_override: str | None = None
_results_dir_override: str | None = None
RESULTS_DIR_VARIABLE = "MIXSTACK_RESULTS_DIR"


def env_level() -> int | None:
    """The level named by ``MIXSTACK_LEVEL``, or ``None`` when it is unset."""
    raw = os.environ.get("MIXSTACK_LEVEL", "").strip()
    if not raw:
        return None
    if raw not in {"0", "1", "2", "3"}:
        raise ValueError(f"MIXSTACK_LEVEL must be one of 0, 1, 2, 3, got {raw!r}")
    return int(raw)


def triton_interpret() -> bool:
    """True when Triton kernels run through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in {"", "0"}


def conv_kernels_enabled() -> bool:
    """False when ``MIXSTACK_CONV_KERNELS=0``: ``mixstack.rotate_in`` / ``rotate_out_sum`` (and the
    potential's convolution) stay in PyTorch at levels 1-3, where the stack still runs its
    kernels (a switch to measure the convolution's kernels against, or to step around them)."""
    raw = os.environ.get("MIXSTACK_CONV_KERNELS", "1").strip()
    if raw not in {"0", "1"}:
        raise ValueError(f"MIXSTACK_CONV_KERNELS must be 0 or 1, got {raw!r}")
    return raw == "1"


PRODUCT_ROUTES = ("auto", "blas", "triton")


def product_route(value: str, name: str) -> str:
    """``value`` if it names a route of the exact products (``tuning.products``), else a
    ``ValueError`` naming ``name``."""
    if value not in PRODUCT_ROUTES:
        raise ValueError(f"{name} must be one of {', '.join(PRODUCT_ROUTES)}, got {value!r}")
    return value


def env_products() -> str:
    """``MIXSTACK_PRODUCTS``: where the exact levels' products run (``tuning.products``)."""
    return product_route(os.environ.get("MIXSTACK_PRODUCTS", "").strip() or "auto", "MIXSTACK_PRODUCTS")


def _switch_on(name: str) -> bool:
    """An off-by-default switch: True for ``1``; ``0``, empty or unset is off; anything else a
    ``ValueError`` naming ``name``."""
    raw = os.environ.get(name, "0").strip()
    if raw not in {"", "0", "1"}:
        raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def deepmd_enabled() -> bool:
    """True when ``MIXSTACK_DEEPMD=1``: the ``deepmd.pt`` entry point (``mixstack.deepmd.plugin``)
    accelerates every SeZM descriptor deepmd-kit builds (``dp --pt train``, ``dp --pt test``, ...)."""
    return _switch_on("MIXSTACK_DEEPMD")


REST_PRODUCTS = ("exact", "compensated", "kernel")


def rest_products_setting(value: str, name: str) -> str:
    """``value`` if it is one of ``REST_PRODUCTS``; else a ``ValueError`` naming ``name``."""
    if value not in REST_PRODUCTS:
        raise ValueError(f"{name} must be one of {', '.join(REST_PRODUCTS)}, got {value!r}")
    return value


def deepmd_rest_products() -> str:
    """``MIXSTACK_DEEPMD_REST_PRODUCTS``: ``exact`` (unset), ``compensated`` or ``kernel``
    (``mixstack.deepmd.rest_products``)."""
    raw = os.environ.get("MIXSTACK_DEEPMD_REST_PRODUCTS", "").strip() or "exact"
    return rest_products_setting(raw, "MIXSTACK_DEEPMD_REST_PRODUCTS")


def private_cxx_runtime() -> bool:
    """True when ``MIXSTACK_PRIVATE_CXX_RUNTIME=1``: AOTInductor links a frozen package with a
    private, hidden copy of libstdc++ (``mixstack.cxx_runtime``)."""
    return _switch_on("MIXSTACK_PRIVATE_CXX_RUNTIME")


def freeze_single_rank() -> bool:
    """True when ``MIXSTACK_FREEZE_SINGLE_RANK=1``: deepmd-kit's freezes skip their multi-rank
    with-comm artifact (``mixstack.deepmd.freeze.single_rank``)."""
    return _switch_on("MIXSTACK_FREEZE_SINGLE_RANK")


FREEZE_TUNE_SECONDS = 300.0       # a freeze's quick sweep of the keys no table covers, at most this long


def freeze_tune_seconds() -> float:
    """``MIXSTACK_FREEZE_TUNE_SECONDS``: how long a freeze may tune the keys no table covers
    (``FREEZE_TUNE_SECONDS`` when unset; ``0``: not at all)."""
    raw = os.environ.get("MIXSTACK_FREEZE_TUNE_SECONDS", "").strip()
    if not raw:
        return FREEZE_TUNE_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"MIXSTACK_FREEZE_TUNE_SECONDS must be a number of seconds >= 0, got {raw!r}")
    return seconds


def set_cache_dir(path: str | None) -> None:
    """Override ``MIXSTACK_CACHE_DIR`` from Python (``None`` restores the default)."""
    global _cache_dir_override
    _cache_dir_override = path


def cache_dir() -> str:
    """Directory for per-user tuning results."""
    if _cache_dir_override:
        return _cache_dir_override
    env = os.environ.get("MIXSTACK_CACHE_DIR", "").strip()
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mixstack")


def set_results_dir(path: str | None) -> None:
    """Override ``MIXSTACK_RESULTS_DIR`` from Python (``None`` restores the default)."""
    global _results_dir_override
    _results_dir_override = path


def default_results_dir() -> str:
    """The platform's per-user data folder, ``mixstack/results`` in it: ``$XDG_DATA_HOME`` or
    ``~/.local/share`` on Linux, ``~/Library/Application Support`` on macOS, ``%LOCALAPPDATA%``
    on Windows.  Outside any clone, so that a run never adds files to a working tree."""
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("APPDATA") or os.path.join(home, "AppData", "Local")
    else:
        base = os.environ.get("XDG_DATA_HOME", "").strip() or os.path.join(home, ".local", "share")
    return os.path.join(base, "mixstack", "results")


def results_dir() -> str:
    """Where the ``mixstack`` commands write results when ``--out`` is not given."""
    if _results_dir_override:
        return _results_dir_override
    return os.environ.get(RESULTS_DIR_VARIABLE, "").strip() or default_results_dir()
