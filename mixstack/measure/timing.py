"""The one timing loop of mixstack: variants interleaved in rotating order.

Everything in the project that compares speeds goes through
``time_interleaved``: ``mixstack bench`` (every variant of every shape) and the
tuner (a baseline and its candidates).  Interleaving spreads slow drifts of the
device (clocks, temperature, other tenants) over all variants instead of
charging them to whichever ran last; rotating the order (round ``r`` starts at
variant ``r mod n``) stops any variant from always following the same
neighbour, whose leftovers in caches or in the allocator would otherwise bias
it.  The statistics are order statistics (median, 20th and 80th percentiles),
which a few preempted samples cannot drag around the way they drag a mean.

The clock is a plain callable, so tests drive the loop with a fake clock and
no GPU: ``clock(fn)`` runs ``fn`` once and returns the seconds it took.
``cuda_event_clock`` times with CUDA events; ``perf_counter_clock`` with
``time.perf_counter`` around device synchronisation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

__all__ = [
    "Clock", "Samples", "Task", "beats", "clock_for", "cuda_event_clock", "perf_counter_clock",
    "quantile", "rotation", "time_interleaved",
]


class Clock(Protocol):
    def __call__(self, fn: Callable[[], object]) -> float:
        """Run ``fn`` once and return how long it took, in seconds."""


@dataclass(frozen=True)
class Task:
    """One variant to time.  ``setup`` (untimed) runs before every sample and
    its result is passed to ``run``; without ``setup``, ``run`` takes no argument.

    The backward of the stack is timed this way: ``setup`` runs the forward,
    ``run`` the backward alone.
    """

    run: Callable[..., object]
    setup: Callable[[], Any] | None = None


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values``, interpolated linearly between order
    statistics (numpy's default ``"linear"`` method)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Samples:
    """The timed samples of one variant, in seconds, in the order they were taken."""

    times: tuple[float, ...]

    def __post_init__(self):
        if not self.times:
            raise ValueError("Samples needs at least one time")

    @property
    def median(self) -> float:
        return quantile(self.times, 0.5)

    @property
    def p20(self) -> float:
        return quantile(self.times, 0.2)

    @property
    def p80(self) -> float:
        return quantile(self.times, 0.8)

    @property
    def spread(self) -> float:
        """``p80 - p20``, in seconds: the run-to-run spread."""
        return self.p80 - self.p20

    @property
    def rel_spread(self) -> float:
        """``(p80 - p20) / median``: the spread as a fraction of the median."""
        m = self.median
        return self.spread / m if m > 0 else math.inf

    @property
    def minimum(self) -> float:
        return min(self.times)

    def to_dict(self) -> dict:
        """Milliseconds: every sample and the summary statistics."""
        ms = 1e3
        return {
            "samples_ms": [t * ms for t in self.times],
            "median_ms": self.median * ms, "p20_ms": self.p20 * ms, "p80_ms": self.p80 * ms,
            "min_ms": self.minimum * ms, "rel_spread": self.rel_spread,
        }


def beats(candidate: Samples, baseline: Samples, margin: float = 0.02) -> bool:
    """True when ``candidate`` is faster than ``baseline`` by more than noise.

    The candidate's median must undercut the baseline's by a fraction larger
    than both ``margin`` and the baseline's own relative spread (docs/contract.md §5.3).
    """
    need = max(margin, baseline.rel_spread)
    return candidate.median < baseline.median * (1.0 - need)


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of round ``round_index``: it starts at variant ``round_index mod n``."""
    if not names:
        return []
    k = round_index % len(names)
    return list(names[k:]) + list(names[:k])


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_event_clock(device) -> Clock:
    """Time with CUDA events on the current stream of ``device``.

    The device is synchronised before the start event, so each sample starts
    on an idle GPU and includes the host's launch overhead (what an eager
    caller waits for), and again after the end event to read the time.
    """
    device = torch.device(device)

    def clock(fn: Callable[[], object]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream(device)
        torch.cuda.synchronize(device)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return clock


def perf_counter_clock(device=None) -> Clock:
    """Time with ``time.perf_counter`` (synchronising a CUDA device on both sides)."""
    device = None if device is None else torch.device(device)

    def clock(fn: Callable[[], object]) -> float:
        _synchronize(device)
        t0 = time.perf_counter()
        fn()
        _synchronize(device)
        return time.perf_counter() - t0

    return clock


def clock_for(device) -> Clock:
    """CUDA events on a CUDA device, ``perf_counter`` elsewhere."""
    device = torch.device(device)
    return cuda_event_clock(device) if device.type == "cuda" else perf_counter_clock(device)


def _sample(task: Task | Callable[[], object], clock: Clock) -> float:
    if isinstance(task, Task):
        if task.setup is None:
            return clock(task.run)
        state = task.setup()
        try:
            return clock(lambda: task.run(state))
        finally:
            del state                       # free the forward's graph before the next sample
    return clock(task)


def time_interleaved(
    variants: Mapping[str, Task | Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 1,
    device=None,
    clock: Clock | None = None,
    on_sample: Callable[[str, bool], None] | None = None,
) -> dict[str, Samples]:
    """Time every variant ``rounds`` times, interleaved in rotating order.

    ``variants`` maps a name to a zero-argument callable or a ``Task``.  First
    ``warmup`` untimed rounds (compilation, autotuning, allocator growth), then
    ``rounds`` timed rounds; timed round ``r`` (from 0) runs the variants
    starting at ``r mod n`` in the mapping's order, wrapping around.  Warm-up
    rounds rotate the same way, counted from 0 on their own.  ``clock`` defaults to ``clock_for(device)`` (CPU
    ``perf_counter`` when ``device`` is ``None``).  ``on_sample(name, timed)``
    is called after every run, for progress display.

    Returns ``{name: Samples}`` in the mapping's order.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if clock is None:
        clock = clock_for(device if device is not None else "cpu")
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    schedule = [(w, False) for w in range(warmup)] + [(r, True) for r in range(rounds)]
    for r, timed in schedule:
        for name in rotation(names, r):
            t = _sample(variants[name], clock)
            if timed:
                times[name].append(t)
            if on_sample is not None:
                on_sample(name, timed)
    return {name: Samples(tuple(ts)) for name, ts in times.items()}
