"""Tuning tables on disk: the built-in ones shipped with the package and the user's own.

One JSON file per device model, in two places: ``mixstack/tables/<device>.json``
(package data, measured by the project) and ``<cache_dir>/<device>.json``
(``mixstack.core.config.cache_dir()``, env ``MIXSTACK_CACHE_DIR``: the user's
sweeps).  Format::

    {"format": 1, "device": "NVIDIA H200",
     "entries": {"stack_bwd_fused": {"focus_dim=32;lmax=3;n_focus=2;apply_alpha=1":
                   {"config": {"BLOCK_M": 32, "num_warps": 4, "num_stages": 2} | null,
                    "device": ..., "triton": ..., "kernel_hash": ..., "torch": ...,
                    "date": ..., "medians_ms": {...}, ...}}}}

Writes go to a temporary file in the same folder, then ``os.replace`` (readers
never see half a file), under an exclusive ``fcntl.flock`` on ``<file>.lock``
(two tuners merge instead of losing each other's entries; no lock where
``fcntl`` is missing).  A file that cannot be read, is not JSON or has the wrong
structure, and an entry that is malformed or stale (other device, Triton
version or kernel sources), is reported once (``TuningTableWarning``, naming the
file and why) and ignored: a table can never make a call fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import warnings

from ..core import config
from . import validity
from .families import FAMILIES, check_config
from .keys import ShapeKey

try:
    import fcntl
except ImportError:          # not POSIX: no lock (atomic replace still holds)
    fcntl = None

log = logging.getLogger(__name__)

FORMAT = 1
BUILTIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tables")

_reported: set[tuple[str, str]] = set()


class TuningTableWarning(UserWarning):
    """A tuning table file or entry was ignored (corrupt or stale)."""


def report(path: str, why: str) -> None:
    """Warn once per file and reason that something in ``path`` was ignored."""
    if (path, why) in _reported:
        return
    _reported.add((path, why))
    log.debug("tuning table %s: %s", path, why)
    warnings.warn(f"mixstack tuning table {path}: {why}; ignored", TuningTableWarning, stacklevel=3)


def file_name(device: str) -> str:
    """``NVIDIA H200`` -> ``NVIDIA_H200.json`` (the exact name is checked inside the file)."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", device).strip("_") + ".json"


def user_path(device: str) -> str:
    return os.path.join(config.cache_dir(), file_name(device))


def builtin_path(device: str) -> str:
    return os.path.join(BUILTIN_DIR, file_name(device))


def verdicts_path(device: str, kind: str, *, user: bool = False) -> str:
    """Where a grid run's ``kind`` verdicts (``"level3"``, ``"products"``) for ``device`` live:
    beside the device's built-in table, or with ``user`` beside the user's."""
    return (user_path(device) if user else builtin_path(device))[: -len(".json")] + f".{kind}.json"


def read_verdicts(path: str, parse):
    """``parse(document)`` of the verdict file ``path``; ``None`` where there is no file, and where
    it cannot be read or parsed (reported, never an error)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return parse(json.load(fh))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        report(path, f"cannot be read ({exc})")
        return None


def read_device_verdicts(device: str, paths, parse):
    """``parse(document)`` of the first verdict file in ``paths`` (the user's, then the shipped one)
    that stands for ``device``.  A file that cannot be read, or whose ``device`` names another GPU,
    is reported and skipped; ``None`` where none stands."""
    for path in paths:
        found = read_verdicts(path, lambda doc: (doc.get("device"), parse(doc)))
        if found is None:
            continue
        measured_on, parsed = found
        if measured_on not in (None, device):
            report(path, f"was measured on {measured_on}, not on {device}")
            continue
        return parsed
    return None


def _read_raw(path: str) -> tuple[dict | None, str | None]:
    """``(document, None)``, ``(None, None)`` when there is no file, or ``(None, why)``."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read ({exc})"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
        return None, "is not a mixstack tuning table (no 'entries' object)"
    if doc.get("format") != FORMAT:
        return None, f"has format {doc.get('format')!r}, this mixstack reads format {FORMAT}"
    if not all(isinstance(v, dict) for v in doc["entries"].values()):
        return None, "is not a mixstack tuning table ('entries' must map families to objects)"
    return doc, None


def load_table(path: str, device: str) -> dict[tuple[str, ShapeKey], dict]:
    """The valid entries of ``path`` for ``device``: ``{(family, key): entry}``; problems reported."""
    doc, why = _read_raw(path)
    if doc is None:
        if why:
            report(path, why)
        return {}
    now = {fam: validity.current(fam) for fam in FAMILIES}
    out: dict[tuple[str, ShapeKey], dict] = {}
    stale: dict[str, int] = {}
    for fam, entries in doc["entries"].items():
        if fam not in FAMILIES:
            log.debug("%s: skipping unknown family %r (a newer mixstack?)", path, fam)
            continue
        for key_text, entry in entries.items():
            try:
                key = ShapeKey.parse(key_text)
                if not isinstance(entry, dict) or "config" not in entry:
                    raise ValueError("an entry must be an object with a 'config'")
                entry = dict(entry, config=check_config(fam, entry["config"]))   # fields in family order
            except (TypeError, ValueError) as exc:
                report(path, f"malformed {fam} entry {key_text!r} ({exc})")
                continue
            reason = validity.stale_reason(entry, device, now[fam])
            if reason is not None:
                stale[reason] = stale.get(reason, 0) + 1
                continue
            out[(fam, key)] = entry
    for reason, n in stale.items():
        report(path, f"{n} stale entr{'y' if n == 1 else 'ies'}: {reason}")
    return out


@contextlib.contextmanager
def locked(path: str):
    """Hold an exclusive lock on ``path + '.lock'`` (a no-op without ``fcntl``)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(path + ".lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def atomic_write_json(path: str, doc: dict) -> None:
    """Write ``doc`` to a temporary file next to ``path``, then ``os.replace`` it into place."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_entry(device: str, family: str, key: ShapeKey, entry: dict, path: str | None = None) -> str:
    """Add or replace one entry in the user's table of ``device``; returns the file's path.

    Re-reads the file under the lock, so entries other processes wrote since
    are kept.  A corrupt file is reported, kept aside as ``<file>.corrupt`` and
    replaced.
    """
    check_config(family, entry.get("config"))
    path = path or user_path(device)
    with locked(path):
        doc, why = _read_raw(path)
        if why is not None:
            report(path, why)
            with contextlib.suppress(OSError):
                os.replace(path, path + ".corrupt")
        if doc is None:
            doc = {"format": FORMAT, "device": device, "entries": {}}
        doc["entries"].setdefault(family, {})[str(key)] = entry
        atomic_write_json(path, doc)
    log.info("tuning: recorded %s %s in %s", family, key, path)
    return path


def coverage(device: str) -> list[dict]:
    """What the built-in and the user's table hold for ``device``, for ``mixstack info``:
    one record per place with the path, whether the file exists, and valid entries
    per family (stale or malformed ones are reported as warnings and not counted)."""
    out = []
    for source, path in (("built-in", builtin_path(device)), ("user", user_path(device))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            entries = load_table(path, device)
        counts: dict[str, int] = {}
        for fam, _ in entries:
            counts[fam] = counts.get(fam, 0) + 1
        out.append({"source": source, "path": path, "exists": os.path.exists(path),
                    "valid_entries": counts, "problems": [str(w.message) for w in caught]})
    return out
