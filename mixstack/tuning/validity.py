"""What a tuning entry is valid for: the device model, the Triton version, the kernel sources.

An entry measured on one GPU model, one Triton version or one version of the
kernels says nothing about another (a tile on the wrong side of the spill point runs
many times slower; BENCHMARKS.md, "Lessons from an earlier implementation that the code relies
on"), so every entry carries all
three and is ignored where any differs.  The kernel-source hash of a family's entry
covers the code its runs compile, function by function (``kernel_hash``): editing a kernel
invalidates the entries that ran it, without anyone having to remember to bump a version
(FlagGems keys its cache the same way), and leaves the other entries standing (an edit to the
fused backward does not void a measured level-3 GEMM config, and a helper moved to another
file voids nothing).  Comments, docstrings and blank lines are left out of the hash.
"""

from __future__ import annotations

import datetime as _dt
import functools

import torch

from ..core import config
from ..core.version import __version__
from . import kernel_hash

INTERPRETER_DEVICE = "triton-interpreter"


def kernel_source_hash(family: str | None = None, *, roots=None, kernels_dir: str | None = None) -> str:
    """The hash of the kernel code ``family``'s runs compile (``kernel_hash.kernel_hash`` of its
    ``Family.kernels``), or of the kernels ``roots`` (``"module.function"``) name; with neither,
    of every definition of every kernel file."""
    if roots is None:
        if family is None:
            roots = kernel_hash.every_function(kernels_dir)
        else:
            from .families import family as family_named
            roots = family_named(family).kernels
    return kernel_hash.kernel_hash(roots, kernels_dir)


def triton_version() -> str:
    import triton
    return str(getattr(triton, "__version__", "unknown"))


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device=None) -> str:
    """The name tables are keyed by: the CUDA device model (``torch.cuda.get_device_name``),
    ``"triton-interpreter"`` for CPU tensors under ``TRITON_INTERPRET``, else ``"cpu"``.

    ``device`` defaults to the current CUDA device where there is one.
    """
    if device is None:
        if torch.cuda.is_available():
            return _cuda_name(torch.cuda.current_device())
        return INTERPRETER_DEVICE if config.triton_interpret() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())
    if config.triton_interpret():
        return INTERPRETER_DEVICE
    return device.type


def current(family: str) -> dict:
    """The validity fields of ``family``'s entries measured now (the device is added by the caller)."""
    return {"triton": triton_version(), "kernel_hash": kernel_source_hash(family=family)}


def stamp(device: str, family: str) -> dict:
    """Validity and provenance fields of a ``family`` entry measured now on ``device``."""
    return {
        "device": device, **current(family), "torch": torch.__version__, "mixstack": __version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def stale_reason(entry: dict, device: str, now: dict) -> str | None:
    """Why ``entry`` is not valid for ``device`` and the ``now`` fields of its family's
    ``current()``, or ``None``."""
    if entry.get("device") != device:
        return f"measured on {entry.get('device')!r}, not {device!r}"
    if entry.get("triton") != now["triton"]:
        return f"measured with Triton {entry.get('triton')}, this is Triton {now['triton']}"
    if entry.get("kernel_hash") != now["kernel_hash"]:
        return "measured on other kernel sources (a kernel module its runs launch changed since)"
    return None
