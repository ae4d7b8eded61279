"""Why an attempt failed, and what the job does about it: pure decisions.

* :func:`root_cause`: a task that lost a channel most often only saw a peer
  die; the peer's own report may come through another connection just after.
  Among the events that follow, the first real report (or a silent death) is
  the cause.
* :func:`restart_delay`: the restart strategy's delay, backed off when a task
  reports the same error again and again (a deterministic failure).
* :data:`FATAL_ERRORS`: errors a restart cannot help; the job fails at once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Collection, Iterable

from lockgate.cluster.events import TaskDisconnected, TaskEvent, TaskMessage
from lockgate.config import RestartStrategy
from lockgate.errors import (
    CheckpointCorruptError,
    ConfigurationError,
    OutputLostError,
    PipelineDefinitionError,
    SavepointMismatchError,
)
from lockgate.protocol import Failed
from lockgate.state.backend import StateTypeError
from lockgate.state.serde import StateSerializationError

FATAL_ERRORS = frozenset(e.__name__ for e in (
    # deterministic: a restart would fail the same way
    CheckpointCorruptError, StateSerializationError, StateTypeError, SavepointMismatchError,
    PipelineDefinitionError, ConfigurationError, OutputLostError,
    # the code or its records: a missing module, a record or state pickle cannot take
    ImportError, ModuleNotFoundError, pickle.PicklingError, pickle.UnpicklingError,
))
"""Errors that fail the job at once (by class name: tasks report names).
Falling back to an older checkpoint is not done on purpose: its
two-phase-commit sinks may already have committed newer output, which
replaying would duplicate."""
BROKEN_CHANNEL = ConnectionError.__name__
"""What a task reports when a peer's death broke one of its channels."""

REPEAT_BACKOFF = 0.5
"""Seconds before the restart after a task reported the same error twice in a
row (whatever the restart strategy's delay), doubling with every further
repeat up to ``REPEAT_BACKOFF_MAX``."""
REPEAT_BACKOFF_MAX = 5.0


class AttemptFailed(Exception):
    def __init__(self, reason: str, task: int | None = None, error_type: str | None = None,
                 reported: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.task = task
        self.error_type = error_type
        self.reported = reported
        """A task reported an exception (with its traceback): it may fail the
        same way after a restart, unlike a process that died."""
        self.where: str | None = None
        """Which input the failing user function was processing."""
        self.report: Failed | None = None
        """The task's own report, when there is one."""
        self.cause_type: str | None = None
        """The class name of the error's cause (a user function's own error)."""

    @property
    def fatal(self) -> bool:
        return self.error_type in FATAL_ERRORS or self.cause_type in FATAL_ERRORS


class JobEnds(Exception):
    """The job ends on request (stop with a savepoint, cancel), not by failure."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def reported_failure(task: int, report: Failed, task_name: str) -> AttemptFailed:
    """The failure a task's :class:`Failed` report stands for."""
    failed = AttemptFailed(f"task {task_name} failed: {report.error}", task, report.error_type,
                           reported=report.error_type != BROKEN_CHANNEL)
    failed.where = report.where
    failed.report = report
    failed.cause_type = report.cause_type
    return failed


def root_cause(failure: AttemptFailed, events: Iterable[TaskEvent], finished: Collection[int],
               task_name: Callable[[int], str]) -> AttemptFailed:
    """The failure to report for an attempt that failed with ``failure``:
    itself, unless it is a broken channel and ``events`` (what the attempt's
    tasks said next, in order, until the caller's deadline) hold the report
    of the task whose death broke it — or that task's silent disconnection.
    ``finished``: tasks that ended normally (their disconnection is no death)."""
    if failure.error_type != BROKEN_CHANNEL:
        return failure
    reported = {failure.task}  # tasks that said why they failed: not silent deaths
    for event in events:
        match event:
            case TaskMessage(task=task, message=Failed() as report):
                reported.add(task)
                if report.error_type != BROKEN_CHANNEL:
                    return reported_failure(task, report, task_name(task))
            case TaskDisconnected(task=task) if task not in finished and task not in reported:
                # a task's report would have come before its disconnection: it died
                return AttemptFailed(f"task {task_name(task)} lost its connection to the "
                                     f"coordinator (and {failure.reason})", task)
    return failure


def repeats(failures: list[str]) -> int:
    """How many times in a row the last failure happened."""
    n = 0
    for reason in reversed(failures):
        if reason != failures[-1]:
            break
        n += 1
    return n


def restart_delay(strategy: RestartStrategy, failures: list[str],
                  reported: bool) -> float | None:
    """Seconds before the next attempt, or None: the job fails. A user
    function failing the same way again (``reported``) is most likely
    deterministic: back off instead of spinning."""
    delay = strategy.delay(len(failures))
    n = repeats(failures)
    if delay is not None and n > 1 and reported:
        delay = max(delay, min(REPEAT_BACKOFF_MAX, REPEAT_BACKOFF * 2 ** (n - 2)))
    return delay
