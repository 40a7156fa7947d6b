"""What Triton compiled, and what it only loaded from its disk cache, inside a block of code.

Why: compiling ahead (``measure.prewarm``) is meant to leave the measuring process nothing to
compile, and a key of ``mixstack bench grid`` still spent seconds in first calls after it.  A
cache hit costs milliseconds (the binary and its metadata read back), a compile a large
fraction of a second, so the list of kernels compiled in the measuring process says whether
the warm-up missed some (and which) or the time goes elsewhere.

``with compile_log() as log:`` sets Triton's compilation listener
(``triton.knobs.compilation.listener``, called by ``triton.compile`` for every compile and
every cache hit) for the block and restores the previous one after it, calling it too;
``log.compiled`` lists ``(kernel name, seconds)`` of the compiles, ``log.loaded`` the kernel
names found in the cache.  Where the installed Triton has no listener, or under the
interpreter (which compiles nothing), the lists stay empty.  Nothing here prints.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class CompileLog:
    """The compiles (``(name, seconds)``) and cache loads (names) seen by ``compile_log``."""

    compiled: list[tuple[str, float]] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)

    @property
    def compiled_seconds(self) -> float:
        return sum(s for _, s in self.compiled)

    def to_dict(self) -> dict:
        return {"compiled": [{"kernel": n, "seconds": s} for n, s in self.compiled],
                "compiled_seconds": self.compiled_seconds, "loaded": len(self.loaded)}


def _seconds(times) -> float:
    """A listener's ``times`` (``knobs.CompileTimes``, microseconds per phase) in seconds."""
    total = getattr(times, "total", None)
    if isinstance(total, (int, float)):
        return total / 1e6
    stages = sum(us for _, us in getattr(times, "lowering_stages", ()) or ())
    return (getattr(times, "ir_initialization", 0) + stages + getattr(times, "store_results", 0)) / 1e6


def _name(src, metadata) -> str:
    name = (metadata or {}).get("name") if isinstance(metadata, dict) else None
    return name or getattr(src, "name", None) or type(src).__name__


@contextlib.contextmanager
def compile_log():
    """Record what ``triton.compile`` compiles and loads inside the block (module doc)."""
    log = CompileLog()
    try:
        from triton import knobs
        compilation = knobs.compilation
        previous = compilation.listener
    except (ImportError, AttributeError):          # no Triton, or one without a listener
        yield log
        return

    def listener(*, src, metadata, metadata_group, times, cache_hit, **rest):
        if cache_hit:
            log.loaded.append(_name(src, metadata))
        else:
            log.compiled.append((_name(src, metadata), _seconds(times)))
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit,
                     **rest)

    compilation.listener = listener
    try:
        yield log
    finally:
        compilation.listener = previous
