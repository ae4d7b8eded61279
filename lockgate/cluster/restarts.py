"""Failures and restarts, as a mixin of
:class:`~lockgate.cluster.jobmaster.JobMaster`: the root cause of a failed
attempt (waiting a moment for the report of the task whose death broke a
channel), a task's report in the log, and the restart strategy's decision
(fail the job, or wait and count the next attempt). The decisions themselves
are pure (:mod:`lockgate.cluster.failures`)."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

from lockgate import fs
from lockgate.cluster.coordinator import CheckpointCoordinator, CheckpointFailureError
from lockgate.cluster.events import TaskEvent
from lockgate.cluster.failures import (
    BROKEN_CHANNELS,
    AttemptFailed,
    repeats,
    restart_delay,
    root_cause,
    streak,
)
from lockgate.cluster.metrics import JobMetrics
from lockgate.config import RestartStrategy
from lockgate.errors import JobFailedError
from lockgate.redact import redact
from lockgate.state.script_classes import script_traceback

log = logging.getLogger("lockgate.driver")

ROOT_CAUSE_WAIT = 1.0
"""Seconds a failure seen as a broken channel waits for the failure that broke it."""


class RestartHandler:
    job_id: str
    attempt: int
    restart: RestartStrategy
    failures: list[str]
    failed_at_checkpoints: list[int]
    """The count of completed checkpoints at each failure (the back-off's streak)."""
    events: queue.Queue[TaskEvent]
    coordinator: CheckpointCoordinator
    monitor: JobMetrics
    _finished: set[int]
    _user_code: list[tuple[Any, Any, Any]]
    _task_name: Callable[[int], str]
    _other_job: Callable[[], str]

    def _restart_after(self, e: AttemptFailed | CheckpointFailureError) -> None:
        """Fail the job, or wait for the restart strategy and count the attempt."""
        reason = e.reason if isinstance(e, AttemptFailed) else redact(str(e))
        self.failures.append(reason)
        self.monitor.on_restart(self.attempt, reason, getattr(e, "task", None), self._task_name)
        if isinstance(e, AttemptFailed) and e.fatal:
            raise JobFailedError(f"job {self.job_id} failed: {reason}.{self._other_job()} "
                                 "Restarting cannot help; nothing committed was lost") from None
        self.failed_at_checkpoints.append(self.coordinator.completed_count)
        delay = restart_delay(self.restart, self.failures,
                              isinstance(e, AttemptFailed) and e.reported,
                              streak(self.failed_at_checkpoints))
        if delay is None:
            raise JobFailedError(
                f"job {self.job_id} failed after {len(self.failures)} failure(s) "
                f"({len(self.failures) - 1} restarts); last: {reason}") from None
        n = repeats(self.failures)
        if n > 1:  # the traceback and the input were printed already
            log.warning("attempt %d failed the same way again (%d in a row): %s; "
                        "restart %d of at most %s in %.2f s", self.attempt, n, reason,
                        len(self.failures), getattr(self.restart, "max_attempts", "?"), delay)
        else:
            latest = self.coordinator.latest
            log.warning("attempt %d failed (%s); restarting in %.2f s from %s",
                        self.attempt, reason, delay,
                        fs.redact(latest.path) if latest else "the beginning")
        time.sleep(delay)
        self.attempt += 1

    def _log_report(self, failure: AttemptFailed) -> None:
        """Show a task's report of its failure: a broken channel (most often a
        peer's death) in one line, a user function's traceback once."""
        report = failure.report
        assert report is not None and failure.task is not None
        name = self._task_name(failure.task)
        if report.error_type in BROKEN_CHANNELS:
            log.warning("task %s: %s", name, report.error)
        elif self.failures and self.failures[-1] == failure.reason:
            # the same failure again: its traceback was printed already
            log.debug("task %s failed:\n%s", name, report.traceback)
        else:
            log.error("task %s failed%s:\n%s", name,
                      f" at {report.where}" if report.where else "",
                      script_traceback(report.traceback, *self._user_code))

    def _root_cause(self, failure: AttemptFailed) -> AttemptFailed:
        """Wait a moment for the report of the task whose death broke a
        channel, or of a task whose exit came first, and name it if it comes
        (:func:`root_cause`)."""
        cause = root_cause(failure, self._events_for(ROOT_CAUSE_WAIT), self._finished,
                           self._task_name)
        if cause is not failure and cause.report is not None:
            self._log_report(cause)
        return cause

    def _events_for(self, seconds: float) -> Iterator[TaskEvent]:
        """This attempt's events as they come, for ``seconds`` at most."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return
            if event.attempt == self.attempt:
                yield event
