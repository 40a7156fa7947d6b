"""The acceleration level: process default, scoped thread-local override, environment.

Levels (docs/contract.md §3): 0 pure PyTorch; 1 exact-fp32 Triton kernels with fixed
launch configs and the relay backward; 2 adds tuned configs and the fused
backward where tuned (bitwise equal to 1); 3 adds compensated tensor-core GEMMs.
Precedence: ``use_level`` scope, then ``set_level``, then ``MIXSTACK_LEVEL``,
then the default (2 where CUDA is available, else 0).
"""

from __future__ import annotations

import contextlib
import threading

import torch

from ..core import config

LEVELS = (0, 1, 2, 3)

_process_level: int | None = None
_local = threading.local()


def _check(level) -> int:
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be an int in 0..3, got {type(level).__name__}")
    if level not in LEVELS:
        raise ValueError(f"level must be in 0..3, got {level}")
    return level


def set_level(level: int | None) -> None:
    """Set the process default level (``None`` returns to environment/default)."""
    global _process_level
    _process_level = None if level is None else _check(level)


def process_level() -> int | None:
    """What ``set_level`` set (``None``: the environment or the default decides)."""
    return _process_level


def level_source() -> tuple[int, str]:
    """The requested level and where it came from: scope, api, environment or default."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1], "use_level"
    if _process_level is not None:
        return _process_level, "set_level"
    env = config.env_level()
    if env is not None:
        return env, "MIXSTACK_LEVEL"
    return (2 if torch.cuda.is_available() else 0), "default"


def get_level() -> int:
    """The level requested for calls made now, on this thread."""
    return level_source()[0]


@contextlib.contextmanager
def use_level(level: int):
    """Run the enclosed calls at ``level`` on this thread only."""
    _check(level)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(level)
    try:
        yield
    finally:
        stack.pop()
