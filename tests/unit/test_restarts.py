"""The job master's ``Restarts`` alone: what each failure leads to (the
restart strategy's delay, backed off, or the job's failure), the root cause
logged once, and the recovery times, with a fake clock and no processes."""

from __future__ import annotations

import logging

import pytest

from lockgate.cluster.events import TaskDisconnected, TaskMessage
from lockgate.cluster.failures import AttemptFailed, reported_failure
from lockgate.cluster.restarts import Restarts
from lockgate.config import (
    ExponentialBackoffRestart,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
)
from lockgate.errors import JobFailedError
from lockgate.protocol import Failed


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


THREE = FixedDelayRestart(max_attempts=3, delay_s=0.25)


def restarts(strategy: RestartStrategy = THREE,
             clock: Clock | None = None) -> Restarts:
    return Restarts("job-1", strategy, lambda t: f"t{t}", hint=" (hint)",
                    clock=clock or Clock())


def report(task: int, error_type: str, error: str) -> Failed:
    return Failed(f"{error_type}: {error}", error_type, None, "Traceback: ...")


def test_the_strategys_delay_until_it_gives_up() -> None:
    r = restarts()
    deaths = [AttemptFailed(f"task t{t} was killed by SIGKILL", t) for t in range(4)]
    delays = [r.restart_delay(e, e.reason, n, n, None) for n, e in enumerate(deaths[:3])]
    assert delays == [0.25] * 3
    with pytest.raises(JobFailedError, match=r"after 4 failure\(s\) \(3 restarts\); last: task t3"
                       r".*gave up: FixedDelayRestart\(max_attempts=3\) restarts 3 time"):
        r.restart_delay(deaths[3], deaths[3].reason, 3, 3, None)
    assert r.failures == [e.reason for e in deaths]


def test_a_fatal_failure_fails_the_job_at_once_with_the_hint() -> None:
    r = restarts()
    fatal = AttemptFailed("task t0 failed: bad state", 0, "CheckpointCorruptError", reported=True)
    with pytest.raises(JobFailedError, match=r"bad state\. \(hint\) Restarting cannot help"):
        r.restart_delay(fatal, fatal.reason, 0, 5, None)
    assert r.failures == [fatal.reason] and r.failed_at_checkpoints == []


def test_reported_failures_without_a_checkpoint_in_between_back_off() -> None:
    """Errors in turn with no checkpoint completed in between back off; one
    completed checkpoint starts the streak again; a death never backs off."""
    r = restarts(FixedDelayRestart(max_attempts=10, delay_s=0.0))
    errors = [reported_failure(t % 2, report(t % 2, "ValueError", f"x{t}"), f"t{t % 2}")
              for t in range(4)]
    assert [r.restart_delay(e, e.reason, n, 7, None) for n, e in enumerate(errors[:3])] == [
        0.0, 0.5, 1.0]
    assert r.restart_delay(errors[3], errors[3].reason, 3, 8, None) == 0.0  # a checkpoint
    death = AttemptFailed("task t1 was killed by SIGKILL", 1)
    assert r.restart_delay(death, death.reason, 4, 8, None) == 0.0


def test_no_restart_fails_on_the_first_failure() -> None:
    r = restarts(NoRestart())
    e = RuntimeError("3 checkpoints failed in a row")
    with pytest.raises(JobFailedError, match=r"after 1 failure\(s\) \(0 restarts\)"):
        r.restart_delay(e, str(e), 0, 0, None)


def test_recovery_time_from_detection_to_every_task_running() -> None:
    clock = Clock()
    r = restarts(clock=clock)
    r.all_running()  # the first attempt: no recovery
    r.detected()
    clock.now += 2.5
    r.all_running()
    clock.now += 1.0
    r.all_running()  # a rescale's attempt later: no failure before it
    assert r.recovery_times == [2.5]


def test_the_root_cause_is_logged_once_and_a_repeat_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    r = restarts()
    broken = AttemptFailed("task t2 failed: ConnectionError: channel broke", 2, "ConnectionError")
    events = [TaskMessage(0, 1, report(1, "ValueError", "bad record")), TaskDisconnected(0, 1)]
    with caplog.at_level(logging.DEBUG, "lockgate.driver"):
        cause = r.root_cause(broken, events, set())
        assert cause.task == 1 and "bad record" in cause.reason
        r.restart_delay(cause, cause.reason, 0, 0, None)
        r.log_report(cause)  # the next attempt fails the same way
    levels = [rec.levelno for rec in caplog.records
              if rec.getMessage().startswith("task t1 failed")]
    assert levels == [logging.ERROR, logging.DEBUG]


def test_the_strategy_sees_when_each_failure_came_and_how_long_the_job_ran() -> None:
    """The failure's time is its detection; the run is from every task
    running (a rescale's attempt runs on) until it; failing while starting
    is no run."""
    clock = Clock()
    r = restarts(FailureRateRestart(max_failures_per_interval=2, interval_s=100.0), clock)
    death = AttemptFailed("task t0 was killed by SIGKILL", 0)
    r.all_running()
    clock.now += 30.0
    r.all_running()  # a rescale's attempt: the run goes on
    clock.now += 20.0
    r.detected()
    clock.now += 1.0  # the root cause and the tasks' end take time
    r.restart_delay(death, death.reason, 0, 0, None)
    clock.now += 5.0
    r.detected()  # the next attempt fails while starting
    r.restart_delay(death, death.reason, 1, 0, None)
    h = r.history()
    assert h.times == (60.0, 66.0) and h.uptimes == (50.0, 0.0)
    clock.now += 1.0
    with pytest.raises(JobFailedError, match=r"3 failure\(s\).*allows 2 failure\(s\) in 100 s, "
                       r"and 3 came within 7.0 s: task t0 was killed"):
        r.restart_delay(death, death.reason, 2, 0, None)


def test_a_rare_failure_never_uses_a_forgetting_strategy_up() -> None:
    """A failure every week, for years: the failure rate and a backoff that
    resets after a stable run restart every time; the count did not."""
    for strategy in (FailureRateRestart(max_failures_per_interval=1, interval_s=3600.0),
                     ExponentialBackoffRestart(max_attempts=3, reset_after_s=3600.0)):
        clock = Clock()
        r = restarts(strategy, clock)
        for week in range(200):
            r.all_running()
            clock.now += 7 * 24 * 3600.0
            r.detected()
            e = AttemptFailed(f"broker blip {week}", 0)
            assert r.restart_delay(e, e.reason, week, week, None) <= 0.1


class OldStyle(RestartStrategy):
    """A strategy written for a count: ``delay(failures: int)``."""

    def delay(self, failures):  # type: ignore[no-untyped-def, override]
        return 1.0 if failures <= 3 else None


def test_a_strategy_that_raises_fails_the_job_with_what_it_takes() -> None:
    r = restarts(OldStyle())
    e = AttemptFailed("task t0 was killed by SIGKILL", 0)
    with pytest.raises(JobFailedError, match=r"task t0 was killed by SIGKILL; its restart "
                       r"strategy OldStyle raised TypeError: .*take a FailureHistory"):
        r.restart_delay(e, e.reason, 0, 0, None)
