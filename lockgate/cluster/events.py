"""What the job master's event loop hears about tasks, from the control
server (messages, disconnections) and the launchers (process exits)."""

from __future__ import annotations

from dataclasses import dataclass

from lockgate.protocol import ToDriver


@dataclass(frozen=True, slots=True)
class TaskMessage:
    attempt: int
    task: int
    message: ToDriver


@dataclass(frozen=True, slots=True)
class TaskDisconnected:
    """The task's control connection closed: after all its messages."""

    attempt: int
    task: int


@dataclass(frozen=True, slots=True)
class TaskExited:
    """The task's process ended with ``exit_code`` (None: without a word,
    as a killed process does)."""

    attempt: int
    task: int
    exit_code: int | None


TaskEvent = TaskMessage | TaskDisconnected | TaskExited
