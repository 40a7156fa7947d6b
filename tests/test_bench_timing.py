"""The shared timing loop: statistics, rotating interleaved order, untimed setup."""

import math

import pytest

from mixstack.measure.timing import Samples, Task, beats, perf_counter_clock, quantile, rotation, time_interleaved


class ScriptedClock:
    """Runs the function, then returns the next scripted duration."""

    def __init__(self, durations):
        self.durations = iter(durations)

    def __call__(self, fn):
        fn()
        return next(self.durations)


def test_quantile_interpolates_linearly_between_order_statistics():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]                      # sorted: 1 2 3 4 5
    assert quantile(xs, 0.5) == 3.0
    assert quantile(xs, 0.2) == pytest.approx(1.8)     # pos 0.8: 1 + 0.8 * (2 - 1)
    assert quantile(xs, 0.8) == pytest.approx(4.2)     # pos 3.2: 4 + 0.2 * (5 - 4)
    assert quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 5.0
    assert quantile([2.0, 4.0], 0.5) == 3.0            # even count: midpoint
    assert quantile([7.0], 0.8) == 7.0


def test_quantile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


def test_samples_statistics_match_a_hand_calculation():
    s = Samples((0.010, 0.012, 0.011, 0.030, 0.009))   # sorted 9 10 11 12 30 ms
    assert s.median == pytest.approx(0.011)
    assert s.p20 == pytest.approx(0.0098)               # 9 + 0.8 * 1
    assert s.p80 == pytest.approx(0.0156)               # 12 + 0.2 * 18
    assert s.spread == pytest.approx(0.0058)
    assert s.rel_spread == pytest.approx(0.0058 / 0.011)
    assert s.minimum == 0.009
    d = s.to_dict()
    assert d["samples_ms"] == pytest.approx([10, 12, 11, 30, 9])
    assert d["median_ms"] == pytest.approx(11) and d["p20_ms"] == pytest.approx(9.8)
    assert d["p80_ms"] == pytest.approx(15.6)


def test_samples_need_at_least_one_time():
    with pytest.raises(ValueError):
        Samples(())


def test_beats_requires_a_margin_larger_than_the_baseline_spread():
    tight = Samples((1.00, 1.00, 1.00, 1.00, 1.00))
    noisy = Samples((0.80, 0.90, 1.00, 1.10, 1.20))     # rel. spread 0.2
    assert beats(Samples((0.97,)), tight)               # 3% faster, 2% margin
    assert not beats(Samples((0.99,)), tight)           # 1% is within the margin
    assert not beats(Samples((0.85,)), noisy)           # 15% is within a 20% spread
    assert beats(Samples((0.75,)), noisy)


def test_rotation_starts_round_r_at_variant_r_mod_n():
    names = ["a", "b", "c"]
    assert rotation(names, 0) == ["a", "b", "c"]
    assert rotation(names, 1) == ["b", "c", "a"]
    assert rotation(names, 2) == ["c", "a", "b"]
    assert rotation(names, 4) == ["b", "c", "a"]
    assert rotation([], 3) == []


def test_time_interleaved_runs_variants_in_rotating_order_and_drops_warmup():
    ran = []
    variants = {name: (lambda n=name: ran.append(n)) for name in ("a", "b", "c")}
    durations = [100.0] * 3 + [float(i) for i in range(1, 13)]   # one warm-up round, then 1..12
    seen = []
    out = time_interleaved(variants, rounds=4, warmup=1, clock=ScriptedClock(durations),
                           on_sample=lambda name, timed: seen.append((name, timed)))
    assert ran == list("abc" "abc" "bca" "cab" "abc")
    assert [t for _, t in seen] == [False] * 3 + [True] * 12
    assert list(out) == ["a", "b", "c"]
    # each variant keeps the durations of its own timed runs, in order
    assert out["a"].times == (1.0, 6.0, 8.0, 10.0)
    assert out["b"].times == (2.0, 4.0, 9.0, 11.0)
    assert out["c"].times == (3.0, 5.0, 7.0, 12.0)
    assert all(100.0 not in s.times for s in out.values())


def test_task_setup_runs_untimed_and_feeds_run():
    events = []

    class RecordingClock:
        def __call__(self, fn):
            events.append("start")
            fn()
            events.append("stop")
            return 1.0

    task = Task(setup=lambda: events.append("setup") or 42, run=lambda x: events.append(("run", x)))
    time_interleaved({"t": task}, rounds=2, warmup=0, clock=RecordingClock())
    assert events == ["setup", "start", ("run", 42), "stop"] * 2


def test_time_interleaved_rejects_bad_round_counts():
    with pytest.raises(ValueError):
        time_interleaved({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError):
        time_interleaved({"a": lambda: None}, rounds=1, warmup=-1)


def test_perf_counter_clock_measures_elapsed_time():
    import time
    t = perf_counter_clock()(lambda: time.sleep(0.02))
    assert 0.015 < t < 1.0 and math.isfinite(t)

