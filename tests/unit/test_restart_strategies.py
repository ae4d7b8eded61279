"""The restart strategies alone, as pure functions of a failure history
with explicit times: what each restarts, after which delay, what it forgets,
what it refuses to be configured with."""

from __future__ import annotations

import pytest

from lockgate.config import (
    ExponentialBackoffRestart,
    FailureHistory,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
)


def failures(*times: float, uptimes: tuple[float, ...] | None = None) -> FailureHistory:
    """Failures at ``times``, each ending a run of ``uptimes`` (default: 1 s)."""
    return FailureHistory(times, uptimes or (1.0,) * len(times),
                          tuple(f"boom {i}" for i in range(len(times))))


def test_a_history_counts_the_failures_in_a_window_and_since_a_stable_run() -> None:
    h = failures(0.0, 50.0, 100.0, 105.0, uptimes=(5.0, 49.0, 45.0, 4.0))
    assert h.count == 4
    assert (h.within(5.0), h.within(5.001), h.within(60.0), h.within(1e9)) == (1, 2, 3, 4)
    assert h.since_stable(45.0) == 2 and h.since_stable(49.0) == 3 and h.since_stable(50) == 4
    assert h.since_stable(4.0) == 1
    with pytest.raises(ValueError, match="one time, uptime and reason per failure"):
        FailureHistory((1.0,), (), ("a",))
    with pytest.raises(ValueError, match="at least one failure"):
        FailureHistory((), (), ())


def test_fixed_delay_counts_the_jobs_whole_life() -> None:
    s = FixedDelayRestart(max_attempts=2, delay_s=1.5)
    assert s.delay(failures(0.0)) == 1.5 and s.delay(failures(0.0, 1e6)) == 1.5
    assert s.delay(failures(0.0, 1e6, 2e6)) is None  # a week apart: still the third
    assert "restarts 2 time(s) in the job's life" in s.gave_up(failures(0.0, 1.0, 2.0))
    assert NoRestart().delay(failures(0.0)) is None


def test_failure_rate_forgets_failures_older_than_its_interval() -> None:
    s = FailureRateRestart(max_failures_per_interval=2, interval_s=60.0, delay_s=0.5)
    spread = failures(*(70.0 * i for i in range(50)))  # one every 70 s, for ever
    assert s.delay(spread) == 0.5
    assert s.delay(failures(0.0, 30.0, 100.0, 150.0)) == 0.5  # 2 in the last 60 s
    burst = failures(0.0, 100.0, 130.0, 159.0)  # 3 in 59 s
    assert s.delay(burst) is None
    assert s.delay(failures(0.0, 100.0, 130.0, 160.0)) == 0.5  # 100 is 60 s old: forgotten
    why = s.gave_up(burst)
    assert ("FailureRateRestart(max_failures_per_interval=2, interval_s=60) allows 2 failure(s) "
            "in 60 s, and 3 came within 59.0 s: boom 1; boom 2; boom 3") == why, why

    # a crash loop: the same failure once with its count, the last five kinds only
    loop = FailureHistory(tuple(float(t) for t in range(11)), (0.0,) * 11,
                          ("a", "b", "c", "d", "e") + ("boom",) * 6)
    why = FailureRateRestart().gave_up(loop)
    assert why.endswith("and 11 came within 10.0 s: 1 earlier; b; c; d; e; boom (6 times)"), why


def test_exponential_backoff_grows_and_starts_over_after_a_stable_run() -> None:
    s = ExponentialBackoffRestart(max_attempts=3, initial_delay_s=1.0, max_delay_s=3.0,
                                  multiplier=2.0, reset_after_s=600.0)
    short = (10.0,) * 4
    assert [s.delay(failures(*range(n), uptimes=short[:n])) for n in range(1, 5)] == [
        1.0, 2.0, 3.0, None]
    # the third failure ended a run of 600 s: it is the first of a new streak
    stable = (10.0, 10.0, 600.0, 10.0, 10.0, 10.0)
    assert [s.delay(failures(*range(n), uptimes=stable[:n])) for n in range(1, 7)] == [
        1.0, 2.0, 1.0, 2.0, 3.0, None]
    assert "without a run of 600 s" in s.gave_up(failures(0.0))
    # the defaults keep their old delays, and a long streak never overflows
    d = ExponentialBackoffRestart(max_attempts=10_000)
    assert d.delay(failures(0.0)) == 0.1 and d.delay(failures(*range(3))) == 0.4
    assert d.delay(failures(*range(5000))) == 30.0


def test_jitter_moves_the_delay_within_its_fraction_and_the_cap() -> None:
    s = ExponentialBackoffRestart(initial_delay_s=1.0, max_delay_s=1.5, jitter=0.5)
    delays = [s.delay(failures(0.0)) for _ in range(200)]
    assert all(d is not None and 0.5 <= d <= 1.5 for d in delays)
    assert len(set(delays)) > 100


@pytest.mark.parametrize(("make", "message"), [
    (lambda: FixedDelayRestart(delay_s=-1), r"FixedDelayRestart: delay_s must be >= 0 seconds"),
    (lambda: FixedDelayRestart(max_attempts=-1), r"max_attempts must be >= 0"),
    (lambda: FailureRateRestart(interval_s=0), r"interval_s must be > 0 seconds"),
    (lambda: FailureRateRestart(interval_s=float("nan")), r"interval_s must be > 0"),
    (lambda: FailureRateRestart(max_failures_per_interval=0), r"use NoRestart\(\)"),
    (lambda: FailureRateRestart(delay_s=-0.5), r"delay_s must be >= 0 seconds"),
    (lambda: ExponentialBackoffRestart(initial_delay_s=5, max_delay_s=1),
     r"max_delay_s must be >= 5 seconds \(initial_delay_s\)"),
    (lambda: ExponentialBackoffRestart(multiplier=0.5), r"multiplier must be >= 1"),
    (lambda: ExponentialBackoffRestart(reset_after_s=0), r"reset_after_s must be > 0"),
    (lambda: ExponentialBackoffRestart(jitter=2), r"jitter must be 0 to 1"),
])
def test_bad_arguments_are_refused_naming_the_argument(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()
