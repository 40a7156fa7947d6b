"""Which path runs a call: the level knob, the guards that send a call to the
reference, and the log of the paths that ran.

| module | what |
|---|---|
| ``levels`` | ``set_level`` / ``get_level`` / ``use_level`` and where the level came from |
| ``guards`` | ``kernels_can_run``, ``unsupported_reason``, ``forward_level`` |
| ``log`` | ``dispatch_log``, ``record``, ``warn_once`` |

Decisions are plain Python on tensor metadata, so under tracing they resolve
once, at trace time (docs/contract.md §3, §4).
"""

from __future__ import annotations

from .guards import MAX_FOCUS_DIM, forward_level, kernels_can_run, triton_installed, unsupported_reason
from .levels import LEVELS, get_level, level_source, set_level, use_level
from .log import dispatch_log, record, warn_once

__all__ = [
    "LEVELS", "MAX_FOCUS_DIM", "dispatch_log", "forward_level", "get_level", "kernels_can_run", "level_source",
    "record", "set_level", "triton_installed", "unsupported_reason", "use_level", "warn_once",
]
