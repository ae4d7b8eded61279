"""Why an attempt failed, and what the job does about it: pure decisions.

* :func:`root_cause`: a task that lost a channel most often only saw a peer
  die; the peer's own report may come through another connection just after.
  Among the events that follow, the first real report (or a silent death) is
  the cause. A task's exit seen before its own report waits for the report.
* :func:`restart_delay`: the restart strategy's delay, backed off when tasks
  report errors again and again with no checkpoint completed in between
  (:func:`streak`: the same task or others in turn; a deterministic failure).
* :data:`FATAL_ERRORS`: errors a restart cannot help; the job fails at once.
"""

from __future__ import annotations

import pickle
import signal
from collections.abc import Callable, Collection, Iterable, Mapping

from lockgate.cluster.events import TaskDisconnected, TaskEvent, TaskExited, TaskMessage
from lockgate.config import FailureHistory, RestartStrategy
from lockgate.errors import (
    CheckpointCorruptError,
    ConfigurationError,
    OutputLostError,
    PipelineDefinitionError,
    SavepointMismatchError,
    UnsendableRecordError,
)
from lockgate.protocol import Failed
from lockgate.redact import redact
from lockgate.state.backend import StateTypeError
from lockgate.state.serde import StateSerializationError

FATAL_ERRORS = frozenset(e.__name__ for e in (
    # deterministic: a restart would fail the same way
    CheckpointCorruptError, StateSerializationError, StateTypeError, SavepointMismatchError,
    PipelineDefinitionError, ConfigurationError, OutputLostError,
    # the code or its records: a missing module, a record or state pickle cannot take
    ImportError, ModuleNotFoundError, pickle.PicklingError, pickle.UnpicklingError,
    UnsendableRecordError,
))
"""Errors that fail the job at once (by class name: tasks report names).
Falling back to an older checkpoint is not done on purpose: its
two-phase-commit sinks may already have committed newer output, which
replaying would duplicate."""
BROKEN_CHANNELS = frozenset(e.__name__ for e in (
    ConnectionError, ConnectionResetError, ConnectionAbortedError, ConnectionRefusedError,
    BrokenPipeError, EOFError,
))
"""Every error a task reports when a peer's death broke a connection (a
reset while sending to it, a refused connection while it restarts...): the
peer is the cause, not the task that saw it."""

REPEAT_BACKOFF = 0.5
"""Seconds before the restart after a task reported the same error twice in a
row (whatever the restart strategy's delay), doubling with every further
repeat up to ``REPEAT_BACKOFF_MAX``."""
REPEAT_BACKOFF_MAX = 5.0


class AttemptFailed(Exception):
    def __init__(self, reason: str, task: int | None = None, error_type: str | None = None,
                 reported: bool = False):
        reason = redact(reason)  # a failure cause is shown and logged: no secrets
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
        self.early_exit = False
        """The task's exit was seen before its messages were: its own report
        may still come (:func:`root_cause` waits for it)."""
        self.exit_pending = False
        """The task's connection was lost before its exit was seen: how its
        process ended (a signal that killed it) may still come
        (:func:`root_cause` waits for it)."""

    @property
    def fatal(self) -> bool:
        return self.error_type in FATAL_ERRORS or self.cause_type in FATAL_ERRORS


class JobEnds(Exception):
    """The job ends on request (stop with a savepoint, cancel), not by failure."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def failure_reason(failure: Exception) -> str:
    """What a failed attempt failed of, as shown and logged (no secrets)."""
    return failure.reason if isinstance(failure, AttemptFailed) else redact(str(failure))


def reported_failure(task: int, report: Failed, task_name: str) -> AttemptFailed:
    """The failure a task's :class:`Failed` report stands for."""
    failed = AttemptFailed(f"task {task_name} failed: {report.error}", task, report.error_type,
                           reported=report.error_type not in BROKEN_CHANNELS)
    failed.where = report.where
    failed.report = report
    failed.cause_type = report.cause_type
    return failed


def root_cause(failure: AttemptFailed, events: Iterable[TaskEvent], finished: Collection[int],
               task_name: Callable[[int], str],
               awaiting_exit: Callable[[], None] = lambda: None,
               exits: Mapping[int, int | None] | None = None) -> AttemptFailed:
    """The failure to report for an attempt that failed with ``failure``:

    * a broken channel (:data:`BROKEN_CHANNELS`): the report of the task
      whose death broke it, if ``events`` (what the attempt's tasks said
      next, in order, until the caller's deadline) hold one, or that task's
      silent death (a disconnection or an exit without a report): the
      earliest death, never the connection resets it caused;
    * a task's exit seen before its messages (``early_exit``): the task's
      own report, if it comes before its disconnection; a bare exit code
      never replaces it;
    * a task's lost connection seen before its exit (``exit_pending``):
      how its process ended, if its exit comes (``was killed by SIGKILL``);
    * anything else: itself (nothing is waited for).

    A silent death (a disconnection without a report) is named by the
    process's exit when that comes among ``events``: a kill's signal, not
    the lost connection it caused.

    ``finished``: tasks that ended normally (their disconnection is no death);
    ``awaiting_exit``: called when a silent death found behind a broken
    channel waits for its exit, so that the caller's deadline gives that exit
    time of its own (the disconnection may come late in the wait);
    ``exits``: the exit codes of tasks whose exit came before the failure
    (a killed task's exit may overtake its peers' reports of the channels
    its death broke: it is the cause, and its disconnection may come later
    or have come already)."""
    events = iter(events)
    if failure.early_exit:
        for event in events:
            match event:
                case TaskMessage(task=task, message=Failed() as report) if task == failure.task:
                    return reported_failure(task, report, task_name(task))
                case TaskDisconnected(task=task) if task == failure.task:
                    return failure  # every message of it came before: there was none
        return failure
    if failure.exit_pending:
        assert failure.task is not None
        return _how_it_ended(failure.task, events, task_name) or failure
    if failure.error_type not in BROKEN_CHANNELS:
        return failure
    reported = {failure.task}  # tasks that said why they failed: not silent deaths
    for task, code in (exits or {}).items():  # killed by a signal: no report comes
        if task not in finished and task not in reported and code is not None and code < 0:
            return _killed(task, code, failure, task_name)
    for event in events:
        match event:
            case TaskMessage(task=task, message=Failed() as report):
                reported.add(task)
                if report.error_type not in BROKEN_CHANNELS:
                    return reported_failure(task, report, task_name(task))
            case TaskDisconnected(task=task) if task not in finished and task not in reported:
                # a task's report would have come before its disconnection: it
                # died; its exit, if it comes, says how
                awaiting_exit()
                death = _how_it_ended(task, events, task_name)
                if death is None:
                    death = AttemptFailed(f"task {task_name(task)} lost its connection to "
                                          "the coordinator", task)
                return AttemptFailed(f"{death.reason} (and {failure.reason})", task)
            case TaskExited(task=task, exit_code=code) if (
                    task not in finished and task not in reported
                    and (code is None or code < 0)):
                # killed (a task that fails itself exits with code 1, after
                # its report, which may still be on its way)
                return _killed(task, code, failure, task_name)
    return failure


def _killed(task: int, code: int | None, failure: AttemptFailed,
            task_name: Callable[[int], str]) -> AttemptFailed:
    """Task ``task``, which exited with ``code`` (killed) without a report,
    as the cause of ``failure`` (a broken channel its death made)."""
    return AttemptFailed(f"task {task_name(task)} {exit_text(code)} (and {failure.reason})", task)


def _how_it_ended(task: int, events: Iterable[TaskEvent],
                  task_name: Callable[[int], str]) -> AttemptFailed | None:
    """Task ``task`` disconnected without a report: its death as its exit
    among the next ``events`` tells it (``was killed by SIGKILL``), or None
    if no exit with a known code comes."""
    for event in events:
        match event:
            case TaskExited(task=t, exit_code=code) if t == task:
                if code is None:
                    return None
                return AttemptFailed(f"task {task_name(task)} {exit_text(code)}", task)
    return None


def exit_text(code: int | None) -> str:
    """How a task's process ended, in words."""
    if code is None:
        return "died without a word (killed)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def streak(completed: list[int]) -> int:
    """How many failures in a row came without a checkpoint completing in
    between (``completed``: the job's count of completed checkpoints at each
    failure, oldest first), whichever tasks failed and however."""
    n = 0
    for count in reversed(completed):
        if count != completed[-1]:
            break
        n += 1
    return n


def repeats(failures: list[str]) -> int:
    """How many times in a row the last failure happened."""
    n = 0
    for reason in reversed(failures):
        if reason != failures[-1]:
            break
        n += 1
    return n


def restart_delay(strategy: RestartStrategy, history: FailureHistory,
                  reported: bool, in_a_row: int | None = None) -> float | None:
    """Seconds before the next attempt, or None: the job fails. Tasks
    reporting errors (``reported``) again and again, with no checkpoint
    completed in between (``in_a_row`` failures, the same task or others in
    turn; default: the same failure repeated), most likely fail
    deterministically: back off instead of spinning."""
    delay = strategy.delay(history)
    n = repeats(list(history.reasons)) if in_a_row is None else in_a_row
    if delay is not None and n > 1 and reported:
        delay = max(delay, min(REPEAT_BACKOFF_MAX, REPEAT_BACKOFF * 2 ** (n - 2)))
    return delay
