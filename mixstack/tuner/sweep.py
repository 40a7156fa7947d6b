"""The sweep: the one implementation behind ``mixstack tune``, ``mixstack.tune`` and freeze.

``tune_key`` measures one family for one shape key, by the six rules of docs/contract.md §5:

1. It sets the level itself around every run (``mixstack.use_level``: the
   family's ``baseline_level`` for the baseline, 2 but for the TMA family's 3, and
   its ``candidate_level`` for candidates, 3 for the compensated families), and checks each run's dispatch log: a candidate or
   baseline run that did not take the path it claims raises
   ``NotEngagedError`` (never a timing).
2. A candidate is accepted only if its outputs are bitwise equal (same bits,
   not ``==``) to the baseline's, on the probe's inputs, which include an edge
   count that no block size divides; for the compensated family, only if
   every output is finite and within the accuracy contract of the probe's
   float64 reference (``probe.reference64()``, judged by ``probe.scales64()``:
   ``families.contract_difference``), on several edge counts.  The
   baseline must itself repeat bit for bit and be finite, or the comparison
   would mean nothing.
3. Baseline and accepted candidates are timed together by
   ``mixstack.measure.timing.time_interleaved`` (rotating order, several
   rounds, medians); a candidate wins only if ``timing.beats`` it (margin, 2%
   by default, and more than the baseline's own spread).  Of several winners,
   the one with the lowest median.
4. The winner, or ``None``, is recorded with the medians, device, versions and
   date; a covered key (any entry) is skipped unless ``force``.
5. A candidate the compiler or device refuses for resources is skipped with
   its reason; any other exception raises ``TuneError`` and records nothing.
6. ``progress`` receives a ``TuneProgress`` after every step.

A sweep runs Triton's products at every key (``tuning.products``: a key whose exact products run
on the BLAS takes no launch config there), so an entry always describes Triton's kernels.

The probe (``probes.StackProbe`` on a GPU, a fake in the tests) builds the
inputs and runs the operator: ``probe.run(cfg) -> (outputs, dispatch Counter)``
and ``probe.task(cfg) -> timing.Task``; ``cfg`` is a candidate or ``None`` for
the baseline.  ``tune`` sweeps many keys and families, making a probe for each.

``SweepSettings`` holds the options that travel with every sweep of one ``tune`` call (rounds,
margin, quick or full, ...).  ``sweep_launches`` lists the kernel launches ``tune_key`` will
make, recorded instead of run, for the warm-up that compiles them in worker processes first
(``measure.prewarm``).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from ..dispatch import levels
from ..dispatch.log import dispatch_log
from ..measure import prewarm, timing
from ..tuning import families, registry, validity
from ..tuning.families import contract_difference
from ..tuning.keys import ShapeKey, as_key
from ..tuning.products import use_products

log = logging.getLogger(__name__)

DEFAULT_ROUNDS = 20
DEFAULT_WARMUP = 2
QUICK_ROUNDS = 5             # the quick sweep's (mixstack tune's default)
QUICK_WARMUP = 1
_RESOURCE_MARKERS = ("out of resource", "out of shared memory", "out of registers")


class TuneError(RuntimeError):
    """A sweep failed; the key stays uncovered (nothing was recorded)."""


class NotEngagedError(TuneError):
    """A run did not take the path it claims (e.g. a fused candidate ran the relay)."""


@dataclass(frozen=True)
class TuneProgress:
    """One step of a sweep.  ``phase``: "check", "warmup", "time" or "done"."""

    family: str
    key: ShapeKey
    phase: str
    candidate: str
    done: int
    total: int


@dataclass
class TuneResult:
    """What a sweep did for one family and key.

    ``status``: "tuned" (measured and recorded), "covered" (an entry existed;
    skipped), "no-candidates" (nothing to try; nothing recorded), "failed" or
    "not-run" (only from ``tune(..., stop_on_error=False)``; nothing recorded),
    "out-of-time" (``tune(..., seconds=...)`` stopped before it; nothing recorded),
    "no-baseline" (the family's baseline needs another family's config, which the key lacks;
    nothing recorded).
    """

    family: str
    key: ShapeKey
    status: str
    config: dict | None = None
    medians_ms: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    path: str | None = None
    error: BaseException | None = None

    @property
    def baseline_ms(self) -> float | None:
        return self.medians_ms.get("baseline")

    @property
    def winner_ms(self) -> float | None:
        return None if self.config is None else self.medians_ms.get(families.label(self.config))


def _chain(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``), once each."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def resource_reason(exc: BaseException) -> str | None:
    """The reason when ``exc`` (or an exception it was raised from) is a resource refusal."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:                       # pragma: no cover - triton is a dependency
        OutOfResources = ()
    for e in _chain(exc):
        if isinstance(e, OutOfResources) or any(m in str(e).lower() for m in _RESOURCE_MARKERS):
            return f"{type(e).__name__}: {e}"
    return None


def build_reason(exc: BaseException) -> str | None:
    """The reason when ``exc`` (or an exception it was raised from) says Triton could not
    build a kernel: its compile error, or a pass pipeline that failed (the Hopper warp
    specialisation's faults end so)."""
    from triton.compiler.errors import CompilationError
    for e in _chain(exc):
        if isinstance(e, CompilationError) or "passmanager::run failed" in str(e).lower():
            last = (str(e).strip().splitlines() or [""])[-1]
            return f"does not build: {type(e).__name__}: {last[:200]}"
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if t.is_floating_point() or t.is_complex():
        return t.contiguous().view(ints[t.element_size()]) if t.element_size() in ints else t
    return t


def bitwise_difference(base, got) -> str | None:
    """Why ``got`` is not bit-for-bit ``base`` (tuples of tensors), or ``None`` when it is."""
    if len(base) != len(got):
        return f"{len(got)} outputs, the baseline has {len(base)}"
    for i, (a, b) in enumerate(zip(base, got)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {tuple(b.shape)} {b.dtype}, the baseline's is {tuple(a.shape)} {a.dtype}"
        if not torch.equal(_bits(a), _bits(b)):
            n = int((_bits(a) != _bits(b)).sum())
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
            return f"output {i}: {n} of {a.numel()} values differ from the baseline (max |diff| {diff:.3g})"
    return None


def _acceptance(fam, probe, base, out) -> str | None:
    if fam.accept == "float64":
        return contract_difference(probe.reference64(), out, scales=probe.scales64(), names=probe.output_names())
    return bitwise_difference(base, out)


def _level(fam, cfg) -> int:
    return fam.baseline_level if cfg is None else fam.candidate_level


def _check_paths(fam: families.Family, key: ShapeKey, cfg, counts) -> None:
    need, forbid = ((fam.candidate_paths, fam.candidate_forbidden) if cfg is not None
                    else (fam.baseline_paths, fam.baseline_forbidden))
    missing = [p for p in need if not counts.get(p)]
    extra = [p for p in forbid if counts.get(p)]
    if missing or extra:
        who = f"candidate {families.label(cfg)}" if cfg is not None else f"baseline ({fam.baseline_name})"
        raise NotEngagedError(
            f"tuning {fam.name} {key}: the {who} run did not take the path it claims "
            f"(missing {missing or 'nothing'}, unexpected {extra or 'nothing'}; "
            f"dispatch log {dict(counts)})")


def _run(probe, fam, key, cfg):
    with levels.use_level(_level(fam, cfg)):
        outputs, counts = probe.run(cfg)
    _check_paths(fam, key, cfg, counts)
    return tuple(outputs)


def _engaged(task: timing.Task, fam, key, cfg) -> timing.Task:
    """``task`` at the tuning level, its timed part checked against the dispatch log every sample."""
    def checked(call):
        with levels.use_level(_level(fam, cfg)), dispatch_log() as counts:
            call()
        _check_paths(fam, key, cfg, counts)

    if task.setup is None:
        return timing.Task(run=lambda: checked(task.run))

    def setup():
        with levels.use_level(_level(fam, cfg)):
            return task.setup()
    return timing.Task(run=lambda state: checked(lambda: task.run(state)), setup=setup)


class _Tracker:
    def __init__(self, callback, family: str, key: ShapeKey, total: int):
        self.callback, self.family, self.key = callback, family, key
        self.done, self.total = 0, total

    def emit(self, phase: str, candidate: str, step: bool = True) -> None:
        self.done += step
        if self.callback is not None:
            self.callback(TuneProgress(self.family, self.key, phase, candidate,
                                       min(self.done, self.total), self.total))


@dataclass(frozen=True)
class SweepSettings:
    """How a key is swept, the same for every family and key of one ``tune`` call: the timing
    (``rounds`` timed and ``warmup`` untimed samples, the ``margin`` a winner needs, ``clock`` for
    the tests), which candidates (``quick``: the pruned sets), whether a covered key is swept
    again (``force``), whether the result is written to the user's table (``persist``; else it
    is registered for this process) and who hears of every step (``progress``)."""

    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    margin: float = 0.02
    force: bool = False
    quick: bool = False
    persist: bool = True
    clock: Callable | None = None
    progress: Callable[[TuneProgress], None] | None = None

    @property
    def samples(self) -> int:
        """The samples each timed variant takes: the untimed warm-up and the timed rounds."""
        return self.warmup + self.rounds

    def with_options(self, options: dict) -> SweepSettings:
        """These settings with the fields named in ``options`` replaced; any other name raises
        ``TypeError``, as an unknown keyword argument does."""
        unknown = sorted(set(options) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
                            f"(the sweep's settings are {', '.join(f.name for f in fields(self))})")
        return replace(self, **options)


@dataclass
class _Checked:
    """What the checking runs decided: the accepted candidates (label, config), and the skipped
    and rejected ones (label -> why)."""

    accepted: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Timed:
    """What the timing decided: medians (ms) and relative spreads by variant, and the winner."""

    medians: dict
    spreads: dict
    winner: dict | None


class _KeySweep:
    """One family's sweep of one key, in the order of the module doc's rules: the checking runs
    (rules 1, 2 and 5), the timing (3) and the record (4), each step reported (6)."""

    def __init__(self, fam: families.Family, key: ShapeKey, probe, settings: SweepSettings, n_candidates: int):
        self.fam, self.key, self.probe, self.settings = fam, key, probe, settings
        self.track = _Tracker(settings.progress, fam.name, key,
                              2 + n_candidates + settings.samples * (1 + n_candidates))

    def _where(self) -> str:
        return f"tuning {self.fam.name} {self.key}"

    def baseline(self) -> tuple:
        """The baseline's outputs, checked to repeat bit for bit and to be finite."""
        self.track.emit("check", "baseline", step=False)
        try:
            base = _run(self.probe, self.fam, self.key, None)
            self.track.emit("check", "baseline (repeat)")
            again = _run(self.probe, self.fam, self.key, None)
        except TuneError:
            raise
        except Exception as exc:
            raise TuneError(f"{self._where()}: the baseline run failed: {type(exc).__name__}: {exc}") from exc
        why = bitwise_difference(base, again)
        if why is not None:
            raise TuneError(f"{self._where()}: the baseline does not repeat bit for bit ({why})")
        if not all(bool(torch.isfinite(t).all()) for t in base if t.is_floating_point()):
            raise TuneError(f"{self._where()}: the baseline's outputs are not finite")
        return base

    def check(self, candidates: list[dict]) -> _Checked:
        """Run the baseline, then every candidate, and sort the candidates by their outputs."""
        base = self.baseline()
        checked = _Checked()
        for cfg in candidates:
            self._check_candidate(cfg, base, checked)
        if checked.rejected and not checked.accepted:
            log.warning("tuning %s %s: every candidate that ran was rejected (%s); "
                        "a kernel bug? recording the baseline", self.fam.name, self.key,
                        "outside the float64 contract" if self.fam.accept == "float64" else
                        "differs from the baseline")
        return checked

    def _check_candidate(self, cfg: dict, base: tuple, checked: _Checked) -> None:
        """Skip ``cfg`` where it is refused for resources (or does not build, where its family
        may not), reject it where its outputs fail the family's acceptance, else accept it."""
        lab = families.label(cfg)
        self.track.emit("check", lab)
        try:
            out = _run(self.probe, self.fam, self.key, cfg)
        except TuneError:
            raise
        except Exception as exc:
            reason = resource_reason(exc) or (build_reason(exc) if self.fam.builds_may_fail else None)
            if reason is None:
                raise TuneError(f"{self._where()}: candidate {lab} failed: {type(exc).__name__}: {exc}") from exc
            log.info("tuning %s %s: skipping %s: %s", self.fam.name, self.key, lab, reason)
            checked.skipped[lab] = reason
            return
        why = _acceptance(self.fam, self.probe, base, out)
        del out
        if why is not None:
            log.warning("tuning %s %s: rejecting %s: %s", self.fam.name, self.key, lab, why)
            checked.rejected[lab] = why
        else:
            checked.accepted.append((lab, cfg))

    def time(self, accepted: list) -> _Timed:
        """Time the baseline and the ``accepted`` candidates together; the winner is the fastest
        candidate that beats the baseline (``None``: none does, or none was accepted)."""
        s, track = self.settings, self.track
        track.total = track.done + 1 + s.samples * (1 + len(accepted)) if accepted else track.done + 1
        if not accepted:
            return _Timed({}, {}, None)
        variants = {"baseline": _engaged(self.probe.task(None), self.fam, self.key, None)}
        variants.update({lab: _engaged(self.probe.task(cfg), self.fam, self.key, cfg) for lab, cfg in accepted})

        def on_sample(name, timed):
            track.emit("time" if timed else "warmup", name)
        try:
            samples = timing.time_interleaved(variants, rounds=s.rounds, warmup=s.warmup, clock=s.clock,
                                              device=getattr(self.probe, "device", None), on_sample=on_sample)
        except TuneError:
            raise
        except Exception as exc:
            raise TuneError(f"{self._where()}: timing failed: {type(exc).__name__}: {exc}") from exc
        wins = [(samples[lab].median, i) for i, (lab, _) in enumerate(accepted)
                if timing.beats(samples[lab], samples["baseline"], s.margin)]
        return _Timed(medians={name: x.median * 1e3 for name, x in samples.items()},
                      spreads={name: x.rel_spread for name, x in samples.items()},
                      winner=accepted[min(wins)[1]][1] if wins else None)

    def record(self, device: str, checked: _Checked, timed: _Timed) -> TuneResult:
        """Record the winner (or ``None``) with its measurements and provenance."""
        fam, s = self.fam, self.settings
        entry = {"config": timed.winner, **validity.stamp(device, fam.name), "baseline": fam.baseline_name,
                 "winner": families.label(timed.winner), "medians_ms": timed.medians, "rel_spread": timed.spreads,
                 "margin": s.margin, "rounds": s.rounds, "warmup": s.warmup, "sweep": "quick" if s.quick else "full",
                 "skipped": checked.skipped, "rejected": checked.rejected}
        path = registry.record(fam.name, self.key, entry, device_name=device, persist=s.persist)
        self.track.emit("done", families.label(timed.winner))
        log.info("tuning %s %s: %s (medians ms: %s)", fam.name, self.key, families.label(timed.winner),
                 ", ".join(f"{k} {v:.3f}" for k, v in timed.medians.items()) or "none")
        return TuneResult(fam.name, self.key, "tuned", config=timed.winner, medians_ms=timed.medians,
                          skipped=checked.skipped, rejected=checked.rejected, path=path)


def tune_key(family: str, key, *, probe, settings: SweepSettings | None = None, device_name: str | None = None,
             **options) -> TuneResult:
    """Sweep ``family`` for ``key`` with ``probe`` and record the result (see the module doc).

    ``settings``: the sweep's ``SweepSettings`` (default: its defaults), any of whose fields may
    also be given as a keyword (``rounds=2``, ``quick=True``, ...), which then replaces the
    field.  ``device_name``: the table the result goes to (default: the probe's
    ``device_name``, else the current device's).
    """
    settings = (settings or SweepSettings()).with_options(options)
    fam, key = families.family(family), as_key(key)
    device = device_name or getattr(probe, "device_name", None) or validity.device_name()
    if not settings.force and registry.covered(fam.name, key, device_name=device):
        return TuneResult(fam.name, key, "covered", config=registry.lookup(fam.name, key, device_name=device))
    cands = families.candidates(fam.name, key, quick=settings.quick)
    if not cands:
        log.info("tuning %s %s: no candidates for this key; nothing to measure", fam.name, key)
        return TuneResult(fam.name, key, "no-candidates")
    sweep = _KeySweep(fam, key, probe, settings, len(cands))
    # no registration of the probe's may outlive the sweep; the configs are Triton's, so its products are
    with registry.saved_registrations(), use_products("triton"):
        checked = sweep.check(cands)
        timed = sweep.time(checked.accepted)
    return sweep.record(device, checked, timed)


def sweep_launches(family: str, key, *, probe, quick: bool = False, earlier=()) -> list:
    """The kernel launches ``tune_key`` makes for ``family`` and ``key`` with ``probe``, recorded
    instead of run (``measure.prewarm.record``; nothing runs on the device): the baseline's and
    every candidate's checking runs, each at its level and registrations as ``tune_key`` runs
    them, and each timed task once.  ``earlier``: ``(family, candidates)`` of the families swept
    before this one for the same key; the winner of each becomes a config of this family's
    baseline, so the baseline is recorded under each of their candidates too (the probes' edge
    counts differ: the compensated family's single-row set is a specialisation of its own).
    A run that cannot be recorded is logged and left out: the sweep then compiles it itself."""
    fam = families.family(family)
    key = as_key(key)
    runs = [(cfg, ()) for cfg in [None, *families.candidates(family, key, quick=quick)]]
    runs += [(None, ((other, c),)) for other, cands in earlier for c in cands]
    out: list = []
    with registry.saved_registrations(), use_products("triton"):
        for cfg, extra in runs:
            try:
                with contextlib.ExitStack() as stack:
                    for other, c in extra:
                        stack.enter_context(registry.registration(other, key, c))
                    out += prewarm.record(_run, probe, fam, key, cfg)
                    if not extra:
                        task = _engaged(probe.task(cfg), fam, key, cfg)
                        out += prewarm.record(lambda t=task: t.run(t.setup()) if t.setup else t.run())
            except Exception as exc:
                log.info("tuning %s %s: cannot record the launches of %s for the warm-up: %s: %s", family, key,
                         families.label(cfg) if not extra else f"the baseline under {extra[0][0]} "
                         f"{families.label(extra[0][1])}", type(exc).__name__, exc)
    return out
