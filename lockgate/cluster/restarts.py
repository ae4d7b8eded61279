"""Failures and restarts (Flink's ``RestartBackoffTimeStrategy`` with the
failure handling around it), one collaborator of
:class:`~lockgate.cluster.jobmaster.JobMaster`: the root cause of a failed
attempt, a task's report in the log, the restart strategy's decision (fail
the job, or the seconds to wait before the next attempt) and the recovery
times. It sleeps, reads events and counts attempts never: the job master
does. The decisions themselves are pure (:mod:`lockgate.cluster.failures`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from lockgate import fs
from lockgate.cluster.events import TaskEvent
from lockgate.cluster.failures import (
    BROKEN_CHANNELS,
    AttemptFailed,
    repeats,
    restart_delay,
    root_cause,
    streak,
)
from lockgate.config import FailureHistory, RestartStrategy
from lockgate.errors import JobFailedError
from lockgate.state.script_classes import script_traceback

log = logging.getLogger("lockgate.driver")

ROOT_CAUSE_WAIT = 1.0
"""Seconds a failure seen as a broken channel waits for the failure that broke it."""
EXIT_WAIT = 1.0
"""Seconds a task's lost connection waits for the task's exit, which names
what ended it (a kill's signal): the launcher most often sees a local
process's exit within milliseconds, but a loaded machine can delay it, and
only a task whose exit never comes costs the whole wait."""


class Restarts:
    """One job's failures and what they lead to (see the module).

    ``task_name``: a task's name in the attempt now running (it changes with
    a rescale); ``hint``: what to add to a fatal failure's message (which
    other job's checkpoint the job started from, if it did);
    ``user_code``: the roots of the pipeline's user code, whose frames a
    task's traceback shows (:func:`script_traceback`)."""

    def __init__(self, job_id: str, strategy: RestartStrategy, task_name: Callable[[int], str],
                 user_code: Sequence[tuple[Any, Any, Any]] = (), hint: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id = job_id
        self.strategy = strategy
        self.task_name = task_name
        self.user_code = list(user_code)
        self.hint = hint
        self.clock = clock
        self.failures: list[str] = []
        """Why each failed attempt failed, oldest first (one restart each but the last)."""
        self.failure_times: list[float] = []
        """When each failure was seen (the clock's seconds), oldest first."""
        self.uptimes: list[float] = []
        """How long each failed attempt ran with every task running, oldest first."""
        self.failed_at_checkpoints: list[int] = []
        """The count of completed checkpoints at each failure (the back-off's streak)."""
        self.recovery_times: list[float] = []
        """Seconds from detecting a failure until every task of the next attempt runs."""
        self._failed_at: float | None = None
        self._running_since: float | None = None
        self._seen: tuple[float, float] | None = None
        """The failure detected and not yet decided on: when, and after how long a run."""

    # ------------------------------------------------------ an attempt fails
    def detected(self) -> None:
        """A failure of the attempt was seen: its recovery time starts."""
        self._failed_at = now = self.clock()
        self._seen = (now, 0.0 if self._running_since is None else now - self._running_since)
        self._running_since = None

    def root_cause(self, failure: AttemptFailed, events: Iterable[TaskEvent],
                   finished: Collection[int],
                   awaiting_exit: Callable[[], None] = lambda: None,
                   exits: Mapping[int, int | None] | None = None) -> AttemptFailed:
        """The failure to report for ``failure``, from what the attempt's
        tasks said next (``events``, until the caller's deadline, which
        ``awaiting_exit`` extends for a silent death's exit; ``finished``: the
        tasks that ended normally; ``exits``: the exits seen before); a cause
        found there is logged (:func:`root_cause`)."""
        cause = root_cause(failure, events, finished, self.task_name, awaiting_exit, exits)
        if cause is not failure and cause.report is not None:
            self.log_report(cause)
        return cause

    def log_report(self, failure: AttemptFailed) -> None:
        """Show a task's report of its failure: a broken channel (most often a
        peer's death) in one line, a user function's traceback once."""
        report = failure.report
        assert report is not None and failure.task is not None
        name = self.task_name(failure.task)
        if report.error_type in BROKEN_CHANNELS:
            log.warning("task %s: %s", name, report.error)
        elif self.failures and self.failures[-1] == failure.reason:
            # the same failure again: its traceback was printed already
            log.debug("task %s failed:\n%s", name, report.traceback)
        else:
            log.error("task %s failed%s:\n%s", name,
                      f" at {report.where}" if report.where else "",
                      script_traceback(report.traceback, *self.user_code))

    def restart_delay(self, failure: Exception, reason: str, attempt: int,
                      completed_checkpoints: int, restores: str | None) -> float:
        """Record attempt ``attempt``'s failure (``reason``), and return the
        seconds to wait before the next attempt; raises
        :class:`~lockgate.errors.JobFailedError` when the job fails instead (a
        fatal error, or the strategy gives up). ``completed_checkpoints``: the
        job's count so far (the back-off's streak); ``restores``: the
        checkpoint the next attempt restores (None: the beginning)."""
        if self._seen is None:  # not detected(): seen now
            self.detected()
        assert self._seen is not None
        (at, uptime), self._seen = self._seen, None
        self.failures.append(reason)
        self.failure_times.append(at)
        self.uptimes.append(uptime)
        if isinstance(failure, AttemptFailed) and failure.fatal:
            raise JobFailedError(f"job {self.job_id} failed: {reason}.{self.hint} "
                                 "Restarting cannot help; nothing committed was lost") from None
        self.failed_at_checkpoints.append(completed_checkpoints)
        history = self.history()
        try:
            delay = restart_delay(self.strategy, history,
                                  isinstance(failure, AttemptFailed) and failure.reported,
                                  streak(self.failed_at_checkpoints))
            gave_up = None if delay is not None else self.strategy.gave_up(history)
        except Exception as e:  # a user's own strategy: the job fails, it does not crash
            raise JobFailedError(
                f"job {self.job_id} failed: {reason}; its restart strategy "
                f"{type(self.strategy).__name__} raised {type(e).__name__}: {e}. A "
                "RestartStrategy's delay(history) and gave_up(history) take a FailureHistory "
                "(docs/checkpoints.md, Restart strategies); nothing committed was lost") from e
        if delay is None:
            raise JobFailedError(
                f"job {self.job_id} failed after {len(self.failures)} failure(s) "
                f"({len(self.failures) - 1} restarts); last: {reason}. The restart strategy "
                f"gave up: {gave_up}") from None
        n = repeats(self.failures)
        if n > 1:  # the traceback and the input were printed already
            log.warning("attempt %d failed the same way again (%d in a row): %s; "
                        "restart %d in %.2f s", attempt, n, reason, len(self.failures), delay)
        else:
            log.warning("attempt %d failed (%s); restarting in %.2f s from %s",
                        attempt, reason, delay,
                        fs.redact(restores) if restores else "the beginning")
        return delay

    def history(self) -> FailureHistory:
        """The job's failures so far, as the restart strategy sees them."""
        return FailureHistory(tuple(self.failure_times), tuple(self.uptimes),
                              tuple(self.failures))

    # ------------------------------------------------- the next one runs
    def all_running(self) -> None:
        """Every task of an attempt runs: a recovery in progress is over, and
        the job's stable run starts, unless it runs since before (a rescale's
        attempt): the strategy's uptime."""
        if self._running_since is None:
            self._running_since = self.clock()
        if self._failed_at is not None:
            self.recovery_times.append(self.clock() - self._failed_at)
            self._failed_at = None
