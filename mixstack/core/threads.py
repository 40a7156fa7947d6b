"""Per-thread settings that a ``with`` block changes and restores."""

from __future__ import annotations

import contextlib
import threading


@contextlib.contextmanager
def scoped(local: threading.local, name: str, value):
    """``local.name = value`` inside the block, on this thread; the previous value (``None`` where
    there was none) restored after it."""
    saved = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, saved)
