"""Tuning tables: what every call looks up (docs/contract.md §5).

A table maps a *family* and a *shape key* to an entry: a launch config (dict),
or ``None`` meaning "measured: the baseline wins"; ``lookup`` answers
``MISSING`` where there is no valid entry.  Precedence: ``register`` (this
process) > the user's table (``MIXSTACK_CACHE_DIR``) > the built-in table
shipped in ``mixstack/tables/``.  Entries are valid only for the device model,
Triton version and kernel sources they were measured on.

| module | what |
|---|---|
| ``keys`` | ``ShapeKey``, ``shape_key`` |
| ``families`` | the families, their candidates and the paths a run must take |
| ``validity`` | device name, Triton version, kernel-source hash |
| ``store`` | JSON files: read, report and ignore bad ones, atomic locked writes |
| ``registry`` | ``register``, ``lookup``, the kept tables |

The sweep that measures and fills the tables is ``mixstack.tuner`` (it runs the
operator, so it sits above it); ``mixstack.tune`` is its entry point.
Launchers ask ``tuned_config(...)`` (a config dict, or ``None`` for "use the
level-1 config / the relay"); nothing here runs at import.
"""

from __future__ import annotations

from .families import FAMILIES, SWEEP_ORDER, candidates
from .keys import ShapeKey, shape_key
from .registry import (
    MISSING,
    clear_registrations,
    covered,
    find,
    lookup,
    record,
    register,
    registration,
    registrations,
    reload,
    saved_registrations,
    unregister,
)
from .store import TuningTableWarning
from .validity import device_name, kernel_source_hash


def tuned_config(family: str, *, focus_dim: int, lmax: int, n_focus: int, apply_alpha: bool,
                 device=None) -> dict | None:
    """The launch config to use for one launch, or ``None`` (the baseline: the level-1
    config, or the relay for ``stack_bwd_fused``) where the entry is ``None`` or missing.

    ``device``: the tensors' device (names the table); call this at level >= 2 only.  A key
    without alpha that has no entry of an exact family takes its alpha twin's: a launch config
    changes the schedule only, and the two run the same products (docs/contract.md §5).
    """
    key = shape_key(focus_dim=focus_dim, lmax=lmax, n_focus=n_focus, apply_alpha=apply_alpha)
    name = device_name(device)
    cfg = lookup(family, key, device_name=name)
    if cfg is MISSING and not apply_alpha and FAMILIES[family].candidate_level <= 2:
        twin = shape_key(focus_dim=focus_dim, lmax=lmax, n_focus=n_focus, apply_alpha=True)
        cfg = lookup(family, twin, device_name=name)
    return cfg if isinstance(cfg, dict) else None


__all__ = [
    "FAMILIES", "MISSING", "SWEEP_ORDER", "ShapeKey", "TuningTableWarning", "candidates", "clear_registrations", "covered",
    "device_name", "find", "kernel_source_hash", "lookup", "record", "register", "registration",
    "registrations", "reload", "saved_registrations", "shape_key", "tuned_config", "unregister",
]
