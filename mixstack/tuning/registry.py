"""Lookup of tuning entries: registrations, then the user's table, then the built-in table.

``lookup`` answers a config dict, ``None`` (measured: the baseline wins) or
``MISSING`` (never measured here).  Launchers call it on every launch, so the
tables are read from disk once per (device, folders) and kept; ``record`` (the
sweep's write path) and ``reload`` drop the kept copies.  Entries another
process writes meanwhile are seen after ``reload()`` or in a new process.
"""

from __future__ import annotations

import contextlib
import os
import threading

from ..core import config
from . import store, validity
from .families import check_config, family
from .keys import ShapeKey, as_key


class _Missing:
    """The type of ``MISSING``: no entry for this family and key on this device."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "tuning.MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_Missing, ())


MISSING = _Missing()

_lock = threading.RLock()
_registrations: dict[tuple[str, ShapeKey], dict | None] = {}
_tables: dict[tuple, dict[tuple[str, ShapeKey], tuple[str, dict]]] = {}


def register(family_name: str, key, cfg) -> None:
    """Record ``cfg`` (a config dict, or ``None``: the baseline wins) for this process only.

    Registrations beat every stored table, on every device.
    """
    family(family_name)
    cfg = check_config(family_name, cfg)
    with _lock:
        _registrations[(family_name, as_key(key))] = cfg


def clear_registrations() -> None:
    """Forget every ``register`` of this process (the stored tables stay)."""
    with _lock:
        _registrations.clear()


def unregister(family_name: str, key) -> None:
    """Drop a registration (stored tables answer again); no error if there is none."""
    family(family_name)
    with _lock:
        _registrations.pop((family_name, as_key(key)), None)


@contextlib.contextmanager
def registration(family_name: str, key, cfg):
    """Register ``cfg`` inside the block, then restore what was registered before (also on errors)."""
    key = as_key(key)
    with _lock:
        had = (family_name, key) in _registrations
        before = _registrations.get((family_name, key))
    register(family_name, key, cfg)
    try:
        yield
    finally:
        with _lock:
            if had:
                _registrations[(family_name, key)] = before
            else:
                _registrations.pop((family_name, key), None)


@contextlib.contextmanager
def saved_registrations():
    """Restore every registration to its state at entry when the block ends (for tests)."""
    with _lock:
        saved = dict(_registrations)
    try:
        yield
    finally:
        with _lock:
            _registrations.clear()
            _registrations.update(saved)


def registrations() -> dict[tuple[str, ShapeKey], dict | None]:
    """A copy of this process's registrations."""
    with _lock:
        return {k: (None if v is None else dict(v)) for k, v in _registrations.items()}


def reload() -> None:
    """Forget the tables read from disk; the next lookup reads them again."""
    with _lock:
        _tables.clear()


def _where(device: str) -> tuple:
    """What names the two files of ``device``, cheaply (``config.cache_dir()`` expands ``~``)."""
    env = os.environ
    return (device, config._cache_dir_override, env.get("MIXSTACK_CACHE_DIR"), env.get("XDG_CACHE_HOME"),
            env.get("HOME"), store.BUILTIN_DIR)


def _table(device: str) -> dict:
    where = _where(device)
    table = _tables.get(where)
    if table is None:
        with _lock:
            builtin = store.load_table(store.builtin_path(device), device)
            user = store.load_table(store.user_path(device), device)
            table = {k: ("builtin", e) for k, e in builtin.items()}
            table.update({k: ("user", e) for k, e in user.items()})
            _tables[where] = table
    return table


def find(family_name: str, key, *, device_name: str | None = None) -> tuple[str, dict | None] | None:
    """``(source, entry)`` where ``source`` is "registered", "user" or "builtin"; ``None`` if missing.

    A registration's entry is ``{"config": cfg}``; stored entries carry
    medians, versions and date.
    """
    family(family_name)
    key = as_key(key)
    reg = _registrations.get((family_name, key), MISSING)
    if reg is not MISSING:
        return "registered", {"config": reg}
    hit = _table(device_name or validity.device_name()).get((family_name, key))
    return hit


def lookup(family_name: str, key, *, device_name: str | None = None):
    """The config dict for ``family_name`` and ``key``, ``None`` (measured: the baseline wins),
    or ``MISSING`` (never measured on this device with these kernels and this Triton).

    ``device_name`` defaults to ``validity.device_name()``: the current CUDA
    device's model, ``"triton-interpreter"`` under ``TRITON_INTERPRET`` without
    CUDA, else ``"cpu"``.  Precedence: ``register`` > the user's table > built-in.
    """
    hit = find(family_name, key, device_name=device_name)
    if hit is None:
        return MISSING
    cfg = hit[1]["config"]
    return None if cfg is None else dict(cfg)


def covered(family_name: str, key, *, device_name: str | None = None) -> bool:
    """True when the key has a measured entry (a config or ``None``): the sweep skips it unless
    forced.  An entry the level-3 policy recorded at first use (``source: "policy"``: validated,
    never timed) does not count, so a sweep still measures the key."""
    hit = find(family_name, key, device_name=device_name)
    return hit is not None and hit[1].get("source") != "policy"


def record(family_name: str, key, entry: dict, *, device_name: str, persist: bool = True) -> str | None:
    """The sweep's one write path: persist ``entry`` in the user's table (and drop the
    kept tables), or register its config for this process when ``persist`` is False."""
    key = as_key(key)
    with _lock:
        shadowed = (family_name, key) in _registrations
    if not persist or shadowed:     # a registration would hide the new result: update it too
        register(family_name, key, entry["config"])
    if not persist:
        return None
    path = store.write_entry(device_name, family_name, key, entry)
    reload()
    return path
