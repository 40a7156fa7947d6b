"""``mixstack.tune`` and ``tuner.tune_missing``: the sweep over many keys and families.

Both run ``sweep.tune_key`` (the one sweep) for each family of each key, in
``families.SWEEP_ORDER`` (the relay's GEMMs before the fused backward, which
is measured against the relay as tuned), with one ``probes.StackProbe`` per
family and key.  Covered keys are skipped before any input is allocated.

With ``warm_workers``, each key's kernels are compiled first in worker processes
(``measure.prewarm``): the launches every family's sweep will make
(``sweep.sweep_launches``, recorded on the real probes' inputs, so every argument has
the value, and Triton the specialisation, of the sweep's own launches), one task per
distinct compile.  Keys are warmed one at a time, each just before its sweep and never
during one (a worker compiling beside the timing loop would disturb it); a compile that
an earlier key already warmed is not repeated.  One key per batch costs nothing against
warming all keys first (the workers wait during the timing either way) and wastes no
compiles when ``seconds`` stops the sweep.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Iterable

import torch

from ..measure import prewarm
from ..measure.shapes import STANDARD
from ..tuning import families as _families
from ..tuning import registry, validity
from ..tuning.keys import ShapeKey, as_key
from . import probes
from .sweep import DEFAULT_ROUNDS, DEFAULT_WARMUP, TuneError, TuneProgress, TuneResult, sweep_launches, tune_key

log = logging.getLogger(__name__)

# A family measured against another one's tuned result: not swept when that one failed.
_DEPENDS_ON = {"stack_bwd_fused": "stack_bwd_relay", "stack_compensated": "stack_bwd_fused",
               "stack_compensated_tma": "stack_compensated"}


def _without_baseline(name: str, key: ShapeKey, device_name) -> bool:
    """Whether ``name``'s baseline cannot run for ``key``: it runs another family's config
    (``Family.needs_config_of``) and that family's entry is not a config."""
    needs = _families.family(name).needs_config_of
    return needs is not None and not isinstance(registry.lookup(needs, key, device_name=device_name), dict)


def default_keys() -> list[ShapeKey]:
    """The shape keys of the docs/contract.md §8 shapes S1-S4 (S1 and S3 share one)."""
    keys = [s.tuning_key() for s in STANDARD.values()]
    return list(dict.fromkeys(keys))


def resolve_families(names: Iterable[str] | None, quick: bool = False) -> list[str]:
    """``names`` checked and put in sweep order (default: every family with candidates; with
    ``quick``, those of the quick sweep, ``families.QUICK_FAMILIES``)."""
    if names is None:
        return [n for n in _families.SWEEP_ORDER if not quick or n in _families.QUICK_FAMILIES]
    if isinstance(names, str):
        names = [names]
    chosen = [_families.family(n).name for n in names]
    order = list(_families.SWEEP_ORDER) + [n for n in _families.FAMILIES if n not in _families.SWEEP_ORDER]
    return [n for n in order if n in chosen]


def tune(keys=None, *, families: Iterable[str] | None = None, force: bool = False,
         rounds: int = DEFAULT_ROUNDS, warmup: int = DEFAULT_WARMUP, margin: float = 0.02,
         persist: bool = True, device=None, progress: Callable | None = None,
         clock: Callable | None = None, make_probe: Callable | None = None,
         device_name: str | None = None, stop_on_error: bool = True, quick: bool = False,
         seconds: float | None = None, now: Callable[[], float] | None = None,
         warm_workers: int = 0, on_warm: Callable | None = None) -> list[TuneResult]:
    """Sweep ``families`` (default: ``stack_fwd``, ``stack_bwd_relay``, ``stack_bwd_fused``,
    ``stack_compensated``)
    for ``keys`` (``tuning.shape_key(...)`` values; default: S1-S4 of docs/contract.md §8) on the
    local GPU, and record each result in the user's table (``persist``; else for
    this process only).  Covered keys are skipped unless ``force``.

    A failure raises ``TuneError`` (``stop_on_error``), or with
    ``stop_on_error=False`` becomes a "failed" result and the sweep goes on
    (a family measured against a failed one is "not-run").  Returns one
    ``TuneResult`` per family and key.  ``make_probe(family, key, device=...)``
    replaces ``probes.StackProbe`` (tests); results then go to ``device_name``,
    else to the probe's ``device_name``.

    ``quick``: the quick sweep (pruned candidates, a timing set half the size; default
    families ``families.QUICK_FAMILIES``).  ``seconds``: a budget; once it is spent the
    sweep stops cleanly before the next family and key (those get status
    "out-of-time", nothing recorded; run again to go on: covered keys are skipped).
    ``now``: the clock of that budget (``time.monotonic``; tests pass a fake).

    ``warm_workers``: compile each key's kernels in that many worker processes before its
    sweep (see the module doc; 0, the default here, compiles them in the sweep itself;
    ``prewarm.auto_workers()`` is ``mixstack tune``'s default).  ``on_warm(key, summary)``
    receives each key's ``prewarm.Summary``; ``progress`` gets a ``TuneProgress`` of family
    ``"warm-up"`` after each task.
    """
    keys = default_keys() if keys is None else list(dict.fromkeys(as_key(k) for k in keys))
    names = resolve_families(families, quick)
    now = now or time.monotonic
    deadline = None if seconds is None else now() + seconds
    make_probe = make_probe or probes.StackProbe
    if make_probe is probes.StackProbe:
        device = probes.tuning_device(device)
        device_name = device_name or validity.device_name(device)
        if quick and isinstance(make_probe, type):        # the real probe (tests replace it)
            make_probe = functools.partial(make_probe, quick=True)
    results: list[TuneResult] = []
    pool = prewarm.Pool(warm_workers) if warm_workers > 0 else None
    seen: set = set()
    try:
        for key in keys:
            if pool is not None and (deadline is None or now() < deadline):
                summary = _warm_key(pool, key, names, seen, force=force, quick=quick, device=device,
                                    device_name=device_name, make_probe=make_probe, progress=progress)
                if on_warm is not None:
                    on_warm(key, summary)
            _sweep_key(key, names, results, deadline=deadline, now=now, force=force, device=device,
                       device_name=device_name, make_probe=make_probe, clock=clock, rounds=rounds, warmup=warmup,
                       margin=margin, progress=progress, persist=persist, quick=quick,
                       stop_on_error=stop_on_error)
    finally:
        if pool is not None:
            pool.close()
    return results


def _swept(name: str, key: ShapeKey, *, force: bool, device_name, quick: bool) -> bool:
    """Whether ``tune`` will sweep ``name`` for ``key`` (not covered, with candidates)."""
    if not force and device_name and registry.covered(name, key, device_name=device_name):
        return False
    return bool(_families.candidates(name, key, quick=quick)) and not _without_baseline(name, key, device_name)


def _warm_key(pool, key, names, seen, *, force, quick, device, device_name, make_probe, progress) -> prewarm.Summary:
    """Compile the kernels of every family ``tune`` will sweep for ``key`` in ``pool``'s workers."""
    launches: list = []
    earlier: list = []
    for name in names:
        if not _swept(name, key, force=force, device_name=device_name, quick=quick):
            continue
        try:
            probe = make_probe(name, key, device=device)
            launches += sweep_launches(name, key, probe=probe, quick=quick, earlier=earlier)
        except Exception as exc:                 # the sweep reports it; the warm-up only logs
            log.info("warm-up of %s %s: %s: %s", name, key, type(exc).__name__, exc)
        finally:
            probe = None
        earlier.append((name, _families.candidates(name, key, quick=quick)))
    tasks = prewarm.launch_tasks(launches, seen)
    del launches
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    def done(result, n, total):
        if progress is not None:
            progress(TuneProgress("warm-up", key, "warm", result.name, n, total))
    summary = pool.run(tasks, on_done=done)
    log.info("warm-up %s: %s", key, summary.describe())
    return summary


def _sweep_key(key, names, results, *, deadline, now, force, device, device_name, make_probe, clock, rounds,
               warmup, margin, progress, persist, quick, stop_on_error) -> None:
    """Sweep every family of ``names`` for ``key`` (see ``tune``), appending to ``results``."""
    failed: dict[str, TuneResult] = {}
    for name in names:
        if deadline is not None and now() >= deadline:
            results.append(TuneResult(name, key, "out-of-time"))
            continue
        dep = _DEPENDS_ON.get(name)
        if dep in failed:
            results.append(TuneResult(name, key, "not-run", error=failed[dep].error))
            continue
        if not force and device_name and registry.covered(name, key, device_name=device_name):
            results.append(TuneResult(name, key, "covered",
                                      config=registry.lookup(name, key, device_name=device_name)))
            continue
        if not _families.candidates(name, key, quick=quick):
            results.append(TuneResult(name, key, "no-candidates"))
            continue
        if _without_baseline(name, key, device_name):
            results.append(TuneResult(name, key, "no-baseline"))
            continue
        try:
            try:
                probe = make_probe(name, key, device=device)
            except Exception as exc:
                raise TuneError(f"tuning {name} {key}: could not set up the inputs: "
                                f"{type(exc).__name__}: {exc}") from exc
            results.append(tune_key(name, key, probe=probe, clock=clock, rounds=rounds,
                                    warmup=warmup, margin=margin, force=force, progress=progress,
                                    device_name=device_name, persist=persist, quick=quick))
        except TuneError as exc:
            if stop_on_error:
                raise
            log.info("%s", exc)
            failed[name] = TuneResult(name, key, "failed", error=exc)
            results.append(failed[name])
        finally:
            probe = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def tune_missing(keys, *, families: Iterable[str] | None = None, **kwargs) -> list[TuneResult]:
    """Tune the keys that have no entry yet (freeze calls this before export); persists."""
    return tune(keys, families=families, force=False, **kwargs)
