"""What a tuning entry is valid for: the device model, the Triton version, the kernel sources.

An entry measured on one GPU model, one Triton version or one version of the
kernels says nothing about another (a tile on the wrong side of the spill point
runs ~10x slower; upstream-lessons §5.2), so every entry carries all three and
is ignored where any differs.  The kernel-source hash covers every
``mixstack/kernels/*.py`` file: editing any kernel body invalidates every entry
without anyone having to remember to bump a version (FlagGems keys its cache
the same way).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os

import torch

from .. import config

KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
INTERPRETER_DEVICE = "triton-interpreter"


def kernel_source_hash(kernels_dir: str | None = None) -> str:
    """sha256 over the names and bytes of every ``*.py`` in the kernels folder, in name order."""
    kernels_dir = kernels_dir or KERNELS_DIR
    h = hashlib.sha256()
    for name in sorted(os.listdir(kernels_dir)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(kernels_dir, name), "rb") as fh:
            data = fh.read()
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


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


def current() -> dict:
    """The validity fields of entries measured now (the device is added by the caller)."""
    return {"triton": triton_version(), "kernel_hash": kernel_source_hash()}


def stamp(device: str) -> dict:
    """Validity and provenance fields of an entry measured now on ``device``."""
    from .. import __version__      # not at import: launch.py imports tuning while mixstack initialises
    return {
        "device": device, **current(), "torch": torch.__version__, "mixstack": __version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def stale_reason(entry: dict, device: str, now: dict) -> str | None:
    """Why ``entry`` is not valid for ``device`` and the ``now`` fields of ``current()``, or ``None``."""
    if entry.get("device") != device:
        return f"measured on {entry.get('device')!r}, not {device!r}"
    if entry.get("triton") != now["triton"]:
        return f"measured with Triton {entry.get('triton')}, this is Triton {now['triton']}"
    if entry.get("kernel_hash") != now["kernel_hash"]:
        return "measured on other kernel sources (mixstack/kernels/*.py changed since)"
    return None
