"""Two pieces of work the Triton interpreter repeats for nothing, skipped (installed by
tests/interpret/conftest.py; the kernels and what they compute are untouched).

1. Every integer ``+``, ``-`` and ``*`` of an interpreted kernel runs Triton's overflow
   sanitiser (``binary_op_sanitize_overflow_impl``): both operands cast to int64, the
   operation again, two comparisons and an ``and``, all through the semantic layer, and then a
   ``device_assert`` that returns at once because the interpreter's options have
   ``debug=False``.  The result is thrown away, so with ``debug`` off the sanitiser is switched
   off here (``sanitize_overflow=False``): the same asserts, i.e. none.
   With ``TRITON_DEBUG``-style debug options on, nothing is changed.
2. Every call of a nested ``@triton.jit`` function re-patches ``triton.language`` for the
   interpreter (``_patch_lang``: ``inspect.getmembers`` over three modules, a few hundred
   ``setattr``), although the launch that runs it has patched the same modules already and
   restores them when it ends.  A nested call whose modules are all patched by the running
   launch skips it; the launch's own patch and restore are Triton's.

Together they take the interpreter process to about 0.6 of its time (docs/testing.md, "Time").
``install`` checks the names it relies on and, where this Triton's interpreter differs, leaves it
as it is and says so: the suite then runs slower, never differently.
"""

from __future__ import annotations

import dataclasses
import warnings

_installed = False
_active_langs: list[set[int]] = []      # the modules patched by each running launch (a stack)


def _langs_of(fn, tl) -> set[int]:
    """Ids of the ``triton.language`` modules that ``_patch_lang`` would patch for ``fn``."""
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


def install() -> None:
    """Skip the two repeated pieces of work above in this process's interpreter."""
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter
    needed = ("_patch_lang", "_LangPatchScope", "interpreter_builder", "tl")
    missing = [name for name in needed if not hasattr(interpreter, name)]
    options = getattr(getattr(interpreter, "interpreter_builder", None), "options", None)
    if missing or not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow"):
        warnings.warn("tests/interp_speed.py: this Triton's interpreter differs from the one it was "
                      f"written for (missing {missing or ['options.sanitize_overflow']}); the "
                      "interpreted tests run without its shortcuts", stacklevel=2)
        _installed = True
        return

    if not options.debug:           # the sanitiser's device_assert returns unless debug is on
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)

    original = interpreter._patch_lang
    tl = interpreter.tl

    class _LaunchScope:
        """A launch's patch scope: restores as Triton's does and leaves the launch stack."""

        def __init__(self, scope):
            self._scope = scope

        def restore(self):
            _active_langs.pop()
            self._scope.restore()

    def patch_lang(fn):
        langs = _langs_of(fn, tl)
        if _active_langs and langs <= _active_langs[-1]:
            return interpreter._LangPatchScope()        # nested call: already patched, nothing to undo
        scope = original(fn)
        if _active_langs:                               # a nested call that patched more: Triton's way
            _active_langs[-1] |= langs
            return scope
        _active_langs.append(langs)
        return _LaunchScope(scope)

    interpreter._patch_lang = patch_lang
    _installed = True
