"""Which path runs a call, and the log of the paths that ran.

Path names: ``fwd:reference``, ``fwd:triton``, ``fwd:compensated``,
``bwd:reference``, ``bwd:relay``, ``bwd:fused``, ``bwd:compensated``.
Decisions are plain Python on tensor metadata, so under tracing they resolve
once, at trace time; nothing is logged while a compiler traces.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections import Counter

import torch

from . import config, levels
from .layout import StackLayout

log = logging.getLogger(__name__)

MAX_FOCUS_DIM = 128
_logs: list[Counter] = []
_logs_lock = threading.Lock()
_warned: set[str] = set()


@contextlib.contextmanager
def dispatch_log():
    """Collect the paths that run inside the block into a ``collections.Counter``."""
    counter: Counter = Counter()
    with _logs_lock:
        _logs.append(counter)
    try:
        yield counter
    finally:
        with _logs_lock:
            _logs.remove(counter)


def record(path: str) -> None:
    """Count one run of ``path`` in every open ``dispatch_log``."""
    if torch.compiler.is_compiling():
        return
    with _logs_lock:
        for counter in _logs:
            counter[path] += 1


def warn_once(key: str, message: str) -> None:
    """A fallback the user can act on: warn the first time only."""
    if key in _warned or torch.compiler.is_compiling():
        return
    _warned.add(key)
    warnings.warn(message, stacklevel=4)


def kernels_can_run(t: torch.Tensor) -> bool:
    """Triton kernels run on CUDA tensors, or on any tensor under the interpreter."""
    return t.device.type == "cuda" or config.triton_interpret()


def unsupported_reason(layout: StackLayout, dtype: torch.dtype) -> str | None:
    """Why the Triton levels cannot run this shape/dtype, or ``None`` if they can."""
    if dtype != torch.float32:
        return f"the Triton levels run float32 only, got {dtype}"
    cf = layout.focus_dim
    if cf % 16 != 0 or cf > MAX_FOCUS_DIM:
        return f"the Triton levels need focus_dim a multiple of 16 up to {MAX_FOCUS_DIM}, got {cf}"
    return None


def forward_level(u0: torch.Tensor, layout: StackLayout) -> int:
    """The level this forward call runs at: the requested one, or 0 if it cannot run."""
    level = levels.get_level()
    if level == 0:
        return 0
    if not kernels_can_run(u0):
        return 0
    reason = unsupported_reason(layout, u0.dtype)
    if reason is not None:
        warn_once(f"unsupported:{reason}", f"mixstack: falling back to the reference: {reason}")
        log.debug("level %d falls back to the reference: %s", level, reason)
        return 0
    return level
