"""Level 3 on keys that nobody swept: whether it should engage, and with which config.

Level 3 runs compensated products only on configs validated against float64
(docs/contract.md §3).  A swept ``stack_compensated`` entry is one way; this policy is
the other, for keys without an entry: it predicts whether level 3 beats level 2 and
names the config, and ``mixstack.stack.level3`` validates that config against float64 at
the first eager call and keeps the verdict for the process.  Where the policy is not
sure, level 3 runs level 2 (``dispatch_log``: ``level3:level2``).

The rule, from the last H200 table measured (18 keys swept at Cf 32 and 64, lmax 1-6,
F 1-2, under ``results/``; BENCHMARKS.md, "Level 3 today"):

- level 3 won at every swept key except the smallest, Cf 32 lmax 1 F 1 (row of 128
  floats: the split work does not pay for itself; 1.04x at F 2), and its gain grew
  with the GEMMs' width at every step (1.20x at a 224-float row, 1.45-1.96x at Cf 32
  lmax 3-6, 2.0-2.35x at Cf 64);
- so it engages where ``Cf`` is a multiple of 32 (the K tile the swept keys used;
  widths 16, 48, 80 and 112 run 16-wide K tiles, never swept) and the row holds at
  least ``MIN_ROW`` floats;
- the config (``families.rule_config``): M64 N128 w4 s4 where a GEMM block is at least 384
  wide, or Cf >= 64 with blocks wider than 128, else M64 N64 w4 s3: the winner, or within 0.4%
  of it, at every key where level 3 won.

Where a grid run has measured a key (``mixstack bench grid``, its ``level3.json``: the user's own
copy beside their tuning table, ``<cache dir>/<device>.level3.json``, else the one shipped beside
the device's table), the measurement decides instead of the rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import store
from .configs import block_k
from .families import M64_N64, M64_N128, rule_config
from .keys import as_key

log = logging.getLogger(__name__)

POLICY_CONFIGS = (M64_N64, M64_N128)
MIN_ROW = 224                  # floats per row: Cf 32 lmax 2 (1.20x) is the smallest swept win past 1.04x
VERDICT_MARGIN = 0.02          # a grid verdict engages level 3 where it beat level 2 by this much


@dataclass(frozen=True)
class Decision:
    """What the policy says for a key: ``config`` (``None``: run level 2) and why."""

    config: dict | None
    reason: str
    source: str                # "rule", "grid" or "unsure"


def verdicts_path(device: str) -> str:
    """Where the shipped level-3 verdicts for ``device`` live: beside its built-in table."""
    return store.verdicts_path(device, "level3")


def user_verdicts_path(device: str) -> str:
    """Where a user's own level-3 verdicts for ``device`` live: beside their tuning table in the
    cache directory (``MIXSTACK_CACHE_DIR``); they replace the shipped ones for that device."""
    return store.verdicts_path(device, "level3", user=True)


_verdicts: dict[str, dict] = {}


def grid_verdicts(device: str) -> dict:
    """``{key string: {"speedup": L2 / L3 time, ...}}`` measured by a grid run on ``device``: the
    user's verdict file where it stands, else the shipped one, else none; read once per process."""
    if device not in _verdicts:
        found = store.read_device_verdicts(device, (user_verdicts_path(device), verdicts_path(device)),
                                           lambda doc: dict(doc.get("verdicts", {})))
        _verdicts[device] = found or {}
    return _verdicts[device]


def decide(key, device: str | None = None) -> Decision:
    """Whether level 3 should run compensated products on ``key`` (which has no table
    entry), and with which config (see the module doc)."""
    key = as_key(key)
    measured = grid_verdicts(device).get(str(key)) if device else None
    if measured is not None:
        speedup = float(measured.get("speedup", 0.0))
        if speedup >= 1.0 + VERDICT_MARGIN:
            return Decision(dict(measured.get("config") or rule_config(key)),
                            f"the grid measured level 3 {speedup:.2f}x level 2 here", "grid")
        return Decision(None, f"the grid measured level 3 at {speedup:.2f}x level 2 here", "grid")
    if block_k(key.layout) != 32:
        return Decision(None, f"Cf {key.focus_dim} runs 16-wide K tiles, which no sweep has measured "
                              "at level 3", "unsure")
    if key.layout.row < MIN_ROW:
        return Decision(None, f"a row of {key.layout.row} floats is below the {MIN_ROW} where level 3 "
                              "won every swept key", "unsure")
    return Decision(rule_config(key), f"Cf {key.focus_dim}, a row of {key.layout.row} floats: inside "
                                      "the region where level 3 won every swept key", "rule")


def forget_verdicts() -> None:
    """Read the verdict files again at the next ``decide`` (tests, a new file)."""
    _verdicts.clear()


__all__ = ["Decision", "POLICY_CONFIGS", "decide", "forget_verdicts", "grid_verdicts", "rule_config",
           "user_verdicts_path", "verdicts_path"]
