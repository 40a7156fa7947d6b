"""The log of the paths that ran, and one-time warnings for fallbacks.

Path names (docs/contract.md §2): ``fwd:reference``, ``fwd:triton``,
``fwd:compensated``, ``bwd:reference``, ``bwd:relay``, ``bwd:fused``,
``bwd:compensated``, ``wgrad:triton``, ``wgrad:compensated``, ``bwd2:triton``,
``bwd2:compensated``; ``cfg:<family>`` where a tuned launch config ran.
Nothing is logged while a compiler traces.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter

import torch

from ..core.threads import scoped

_logs: list[Counter] = []
_logs_lock = threading.Lock()
_warned: set[str] = set()
_quiet = threading.local()


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


@contextlib.contextmanager
def unlogged():
    """Record nothing from this thread inside the block: runs mixstack makes for its own checks
    (the level-3 validation at first use) are not the caller's paths."""
    with scoped(_quiet, "on", True):
        yield


def record(path: str) -> None:
    """Count one run of ``path`` in every open ``dispatch_log``."""
    if torch.compiler.is_compiling() or getattr(_quiet, "on", False):
        return
    with _logs_lock:
        for counter in _logs:
            counter[path] += 1


def warn_once(key: str, message: str) -> None:
    """A fallback the user can act on: warn the first time only.  Silent while a compiler traces,
    which is asked first, so that the traced graph never reads ``_warned`` (a guard on it would
    recompile the graph once an eager call has warned)."""
    if torch.compiler.is_compiling() or key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, stacklevel=4)
