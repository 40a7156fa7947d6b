"""The sweep that measures launch configs on the local GPU and fills the tables.

It runs the operator (``mixstack.mixing_stack``) under each candidate config,
so it sits above the operator and the tables it feeds (``mixstack.tuning``).
One implementation, used by every entry point: ``mixstack tune``,
``mixstack.tune(...)``, ``mixstack.freeze`` and model warm-up
(docs/contract.md §5).

| module | what |
|---|---|
| ``sweep`` | ``tune_key``: the one sweep over one family and key |
| ``probes`` | ``StackProbe``: the sweep's runs of ``mixing_stack`` on a GPU |
| ``driver`` | ``tune``, ``tune_missing``: many keys and families |
"""

from __future__ import annotations

from .driver import default_keys, resolve_families, tune, tune_missing
from .sweep import TuneError, TuneResult

__all__ = ["TuneError", "TuneResult", "default_keys", "resolve_families", "tune", "tune_missing"]
