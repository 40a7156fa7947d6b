"""The C ABI between the plugin and Python: one callback, models registered by key.

The plugin exports ``mixstack_abi_version()`` and ``mixstack_set_compute(fn)``.
Python loads the same shared object that ``plugin load`` loaded (``dlopen`` of
one path gives one handle, so they share the plugin's callback slot) and
installs ``_dispatch`` there.  Every ``pair_style mixstack KEY ...`` calls it
with its ``KEY``; ``register`` maps keys to ``DomainEvaluator``s.  The
callback never lets an exception cross into C: it logs the traceback, keeps
the exception (``last_error``) and hands LAMMPS a message, which LAMMPS
raises as its own error.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from ctypes import POINTER, c_double, c_int, c_int64, c_void_p

import numpy as np

from .domain import DomainEvaluator

log = logging.getLogger(__name__)

ABI_VERSION = 1          # pair_mixstack.cpp: mixstack_abi_version()

COMPUTE_FN = ctypes.CFUNCTYPE(c_int, c_int, c_int, c_int, POINTER(c_double), POINTER(c_int), c_int64,
                              POINTER(c_int), POINTER(c_double), POINTER(c_double), POINTER(c_double),
                              c_void_p, c_int)

_evaluators: dict[int, DomainEvaluator] = {}
_keys = itertools.count()
_libraries: dict[str, ctypes.CDLL] = {}
_last_error: BaseException | None = None


def _dispatch(key, nlocal, nghost, x, type_, npairs, pairs, f, energy, eatom, message, message_size):
    """The plugin's callback (see ``pair_mixstack.cpp`` for the arguments)."""
    global _last_error
    try:
        evaluator = _evaluators.get(key)
        if evaluator is None:
            raise KeyError(f"no model is registered under pair_style mixstack key {key} in this process "
                           f"(create the pair style with mixstack.lammps.attach)")
        n = nlocal + nghost
        positions = np.ctypeslib.as_array(x, (n, 3)) if n else np.zeros((0, 3))
        types = np.ctypeslib.as_array(type_, (n,)) if n else np.zeros(0, dtype=np.int32)
        pair = np.ctypeslib.as_array(pairs, (2, npairs)) if npairs else np.zeros((2, 0), dtype=np.int32)
        e, forces, local = evaluator.compute(nlocal, positions, types, pair)
        if n:
            np.ctypeslib.as_array(f, (n, 3))[:] += forces
        energy[0] = e
        if eatom and nlocal:
            np.ctypeslib.as_array(eatom, (n,))[:nlocal] += local
        return 0
    except BaseException as exc:                       # noqa: BLE001 - nothing may unwind into C
        _last_error = exc
        log.exception("pair_style mixstack: the model call failed")
        text = f"{type(exc).__name__}: {exc}".encode(errors="replace")[: max(message_size - 1, 0)]
        if message and message_size > 0:
            ctypes.memmove(message, text + b"\0", len(text) + 1)
        return 1


_DISPATCH = COMPUTE_FN(_dispatch)         # kept alive for as long as the process runs


def install(plugin_so: str) -> None:
    """Install the callback in the plugin at ``plugin_so`` (once per path); check its ABI."""
    if plugin_so in _libraries:
        return
    lib = ctypes.CDLL(plugin_so)
    lib.mixstack_abi_version.restype = c_int
    found = lib.mixstack_abi_version()
    if found != ABI_VERSION:
        raise RuntimeError(f"the LAMMPS plugin {plugin_so} has callback ABI {found}, this mixstack expects "
                           f"{ABI_VERSION}; rebuild it (mixstack.lammps.build.plugin_path(rebuild=True))")
    lib.mixstack_set_compute.argtypes = [COMPUTE_FN]
    lib.mixstack_set_compute.restype = None
    lib.mixstack_set_compute(_DISPATCH)
    _libraries[plugin_so] = lib


def register(evaluator: DomainEvaluator) -> int:
    """A new key under which the callback runs ``evaluator``."""
    key = next(_keys)
    _evaluators[key] = evaluator
    return key


def unregister(key: int) -> None:
    """Forget ``key`` (a later call under it is an error, not a crash)."""
    _evaluators.pop(key, None)


def last_error() -> BaseException | None:
    """The exception of the last failed callback in this process, if any."""
    return _last_error
