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
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from ..measure import prewarm
from ..measure.shapes import STANDARD
from ..tuning import families as _families
from ..tuning import registry, validity
from ..tuning.keys import ShapeKey, as_key
from . import probes
from .sweep import SweepSettings, TuneError, TuneProgress, TuneResult, sweep_launches, tune_key

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


@dataclass(frozen=True)
class _Plan:
    """What one ``tune`` call holds for all its keys: the families in sweep order, the sweep's
    settings, the probes' factory and device, the table results go to, whether a failure stops
    the call, and the budget's deadline on its clock."""

    names: list[str]
    settings: SweepSettings
    make_probe: Callable
    device: object
    device_name: str | None
    stop_on_error: bool
    deadline: float | None
    now: Callable[[], float]

    def out_of_time(self) -> bool:
        return self.deadline is not None and self.now() >= self.deadline


def tune(keys=None, *, families: Iterable[str] | None = None, device=None, seconds: float | None = None,
         warm_workers: int = 0, on_warm: Callable | None = None, stop_on_error: bool = True,
         make_probe: Callable | None = None, device_name: str | None = None,
         now: Callable[[], float] | None = None, **options) -> list[TuneResult]:
    """Sweep ``families`` (default: ``stack_fwd``, ``stack_bwd_relay``, ``stack_bwd_fused``,
    ``stack_compensated``) for ``keys`` (``tuning.shape_key(...)`` values; default: S1-S4 of
    docs/contract.md §8) on the local GPU, and record each result in the user's table.

    ``options`` are the sweep's settings (``sweep.SweepSettings``), the same for every family
    and key: ``force`` (sweep covered keys too; else they are skipped), ``rounds``, ``warmup``,
    ``margin``, ``persist`` (``False``: results for this process only), ``quick`` (the quick
    sweep: pruned candidates, a timing set half the size; default families
    ``families.QUICK_FAMILIES``), ``progress`` (receives a ``TuneProgress`` after every step)
    and ``clock`` (tests).  Any other keyword raises ``TypeError``.

    A failure raises ``TuneError`` (``stop_on_error``), or with
    ``stop_on_error=False`` becomes a "failed" result and the sweep goes on
    (a family measured against a failed one is "not-run").  Returns one
    ``TuneResult`` per family and key.  ``make_probe(family, key, device=...)``
    replaces ``probes.StackProbe`` (tests); results then go to ``device_name``,
    else to the probe's ``device_name``.

    ``seconds``: a budget; once it is spent the sweep stops cleanly before the next family and
    key (those get status "out-of-time", nothing recorded; run again to go on: covered keys are
    skipped).  ``now``: the clock of that budget (``time.monotonic``; tests pass a fake).

    ``warm_workers``: compile each key's kernels in that many worker processes before its
    sweep (see the module doc; 0, the default here, compiles them in the sweep itself;
    ``prewarm.auto_workers()`` is ``mixstack tune``'s default).  ``on_warm(key, summary)``
    receives each key's ``prewarm.Summary``; ``progress`` gets a ``TuneProgress`` of family
    ``"warm-up"`` after each task.
    """
    settings = SweepSettings().with_options(options)
    keys = default_keys() if keys is None else list(dict.fromkeys(as_key(k) for k in keys))
    plan = _plan(families, settings, make_probe, device, device_name, stop_on_error, seconds, now)
    results: list[TuneResult] = []
    pool = prewarm.Pool(warm_workers) if warm_workers > 0 else None
    seen: set = set()
    try:
        for key in keys:
            if pool is not None and not plan.out_of_time():
                summary = _warm_key(pool, key, plan, seen)
                if on_warm is not None:
                    on_warm(key, summary)
            results += _sweep_key(key, plan)
    finally:
        if pool is not None:
            pool.close()
    return results


def _plan(families, settings: SweepSettings, make_probe, device, device_name, stop_on_error, seconds, now) -> _Plan:
    """``tune``'s arguments resolved: the families in sweep order, the real probe on the tuning
    device (and the table of its name) unless ``make_probe`` replaces it, the budget's deadline."""
    names = resolve_families(families, settings.quick)
    now = now or time.monotonic
    deadline = None if seconds is None else now() + seconds
    make_probe = make_probe or probes.StackProbe
    if make_probe is probes.StackProbe:
        device = probes.tuning_device(device)
        device_name = device_name or validity.device_name(device)
        if settings.quick and isinstance(make_probe, type):        # the real probe (tests replace it)
            make_probe = functools.partial(make_probe, quick=True)
    return _Plan(names, settings, make_probe, device, device_name, stop_on_error, deadline, now)


def _swept(name: str, key: ShapeKey, plan: _Plan) -> bool:
    """Whether ``tune`` will sweep ``name`` for ``key`` (not covered, with candidates)."""
    return _not_swept(name, key, plan) is None


def _not_swept(name: str, key: ShapeKey, plan: _Plan) -> TuneResult | None:
    """The result of ``name`` for ``key`` when ``tune`` does not sweep it: covered, no
    candidates, or a baseline that needs another family's config the key lacks."""
    settings, device_name = plan.settings, plan.device_name
    if not settings.force and device_name and registry.covered(name, key, device_name=device_name):
        return TuneResult(name, key, "covered", config=registry.lookup(name, key, device_name=device_name))
    if not _families.candidates(name, key, quick=settings.quick):
        return TuneResult(name, key, "no-candidates")
    if _without_baseline(name, key, device_name):
        return TuneResult(name, key, "no-baseline")
    return None


def _warm_key(pool, key: ShapeKey, plan: _Plan, seen: set) -> prewarm.Summary:
    """Compile the kernels of every family ``tune`` will sweep for ``key`` in ``pool``'s workers."""
    quick, progress = plan.settings.quick, plan.settings.progress
    launches: list = []
    earlier: list = []
    for name in plan.names:
        if not _swept(name, key, plan):
            continue
        try:
            probe = plan.make_probe(name, key, device=plan.device)
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


def _sweep_key(key: ShapeKey, plan: _Plan) -> list[TuneResult]:
    """The results of every family of the plan for ``key`` (see ``tune``)."""
    results: list[TuneResult] = []
    failed: dict[str, TuneResult] = {}
    for name in plan.names:
        if plan.out_of_time():
            results.append(TuneResult(name, key, "out-of-time"))
            continue
        dep = _DEPENDS_ON.get(name)
        if dep in failed:
            results.append(TuneResult(name, key, "not-run", error=failed[dep].error))
            continue
        result = _not_swept(name, key, plan) or _sweep_family(name, key, plan)
        if result.status == "failed":
            failed[name] = result
        results.append(result)
    return results


def _sweep_family(name: str, key: ShapeKey, plan: _Plan) -> TuneResult:
    """``tune_key`` of ``name`` for ``key`` with a fresh probe; a ``TuneError`` becomes a
    "failed" result unless the plan stops on errors."""
    try:
        try:
            probe = plan.make_probe(name, key, device=plan.device)
        except Exception as exc:
            raise TuneError(f"tuning {name} {key}: could not set up the inputs: "
                            f"{type(exc).__name__}: {exc}") from exc
        return tune_key(name, key, probe=probe, settings=plan.settings, device_name=plan.device_name)
    except TuneError as exc:
        if plan.stop_on_error:
            raise
        log.info("%s", exc)
        return TuneResult(name, key, "failed", error=exc)
    finally:
        probe = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def tune_missing(keys, *, families: Iterable[str] | None = None, **kwargs) -> list[TuneResult]:
    """Tune the keys that have no entry yet (freeze calls this before export); persists."""
    return tune(keys, families=families, force=False, **kwargs)
