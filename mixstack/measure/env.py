"""The environment record: what every result file carries and ``mixstack info`` shows.

A figure without the GPU, the software versions, the git revision and the
date is not reproducible (docs/contract.md §8), so the bench writes this record into every
JSON file.  Everything here is probed only when called, never at import, and
every probe that can fail (no GPU, no ``nvidia-smi``, not a git checkout)
gives ``None`` instead of an error.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import re
import shutil
import subprocess
import sys

import torch

from ..core import config
from ..core.version import __version__
from ..dispatch import levels
from ..dispatch.guards import kernels_can_run

log = logging.getLogger(__name__)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("%s failed: %s", cmd[0], exc)
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def git_revision() -> str | None:
    """The commit of the mixstack checkout (``+dirty`` with local changes), or ``None``."""
    if shutil.which("git") is None:
        return None
    rev = _run(["git", "rev-parse", "HEAD"], cwd=_PACKAGE_DIR)
    if rev is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_PACKAGE_DIR)
    return rev + ("+dirty" if dirty else "")


def driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, or ``None`` where it is absent."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


def parse_device(name) -> torch.device:
    """``name`` as a CPU or CUDA device; ``ValueError`` for a name torch does not know or another
    device type."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device} is not supported: use cpu, cuda or cuda:N")
    return device


def resolve_device(device=None) -> torch.device:
    """``device`` (a CUDA one with its index), or CUDA when available, else CPU.

    Raises ``ValueError`` for a device name torch does not know, a device type other
    than ``cpu`` and ``cuda``, and a CUDA device that torch cannot see.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = parse_device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} was asked for, but torch sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device {device} was asked for, but torch sees "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def triton_levels_status(device=None) -> tuple[bool, str]:
    """Whether levels 1-3 run Triton kernels on ``device``, and why (not)."""
    device = resolve_device(device)
    if device.type == "cuda":
        return True, f"CUDA device {torch.cuda.get_device_name(device)}"
    probe = torch.empty(0, device=device)
    if kernels_can_run(probe):
        return True, "TRITON_INTERPRET is set: kernels run on the CPU through the Triton interpreter (slow)"
    if not torch.cuda.is_available():
        why = "torch has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
    else:
        why = f"the device is {device.type}"
    return False, (f"{why} and TRITON_INTERPRET is not set; the Triton levels need CUDA and "
                   f"fall back to level 0 here")


def device_info(device=None) -> dict:
    """Name and properties of ``device``."""
    device = resolve_device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": platform.processor() or platform.machine() or "cpu",
                "cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}
    p = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "index": device.index, "name": p.name,
            "capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2 ** 30, 1)}


def device_slug(info: dict) -> str:
    """A short file-name-safe device name: ``nvidia-h200``, ``cpu``."""
    if info.get("type") != "cuda":
        return info.get("type", "cpu")
    return re.sub(r"[^a-z0-9]+", "-", info["name"].lower()).strip("-") or "cuda"


def level_record() -> dict:
    level, source = levels.level_source()
    return {"level": level, "source": source}


def collect(device=None) -> dict:
    """The full environment record for ``device`` (JSON-serialisable)."""
    device = resolve_device(device)
    ok, why = triton_levels_status(device)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "mixstack": __version__,
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "cuda": torch.version.cuda,
        "driver": driver_version() if device.type == "cuda" else None,
        "device": device_info(device),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "triton_interpret": config.triton_interpret(),
        "triton_levels": {"available": ok, "why": why},
        "active_level": level_record(),
    }
