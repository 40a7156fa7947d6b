"""Named stages of a potential's frame, so that a profiler can say where the time goes.

The potential calls each piece of a frame through ``run(name, fn, *args)``: edge frames and
Wigner rows, radial weights, gather + rotate in, the stack, rotate back, aggregation (or the
two fused as rotate-out), node update.  Normally ``run`` is just ``fn(*args)`` (a compiler
traces straight through it).  ``mixstack.bench.breakdown`` installs a runner with
``staged(runner)`` that wraps each stage in a profiler range, and may compile each stage on
its own, so that forward and backward device time can be charged to stages.
"""

from __future__ import annotations

import contextlib
from typing import Callable

EDGE_FRAMES = "edge frames + Wigner rows"
RADIAL = "radial weights"
ROTATE_IN = "gather + rotate in"
STACK = "stack"
ROTATE_BACK = "rotate back"
AGGREGATION = "aggregation"
ROTATE_OUT = "rotate back + aggregation"
NODE_UPDATE = "node update"
# In frame order; a frame runs either ROTATE_BACK and AGGREGATION (level 0) or ROTATE_OUT.
STAGES = (EDGE_FRAMES, RADIAL, ROTATE_IN, STACK, ROTATE_BACK, AGGREGATION, ROTATE_OUT, NODE_UPDATE)

_runner: Callable | None = None


def run(name: str, fn: Callable, *args):
    """``fn(*args)``, through the installed runner if there is one."""
    if _runner is None:
        return fn(*args)
    return _runner(name, fn, *args)


@contextlib.contextmanager
def staged(runner: Callable):
    """Install ``runner(name, fn, *args)`` for the frames run inside the block (one process-wide
    runner: a breakdown measures one frame at a time)."""
    global _runner
    saved, _runner = _runner, runner
    try:
        yield
    finally:
        _runner = saved
