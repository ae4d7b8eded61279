"""What starts a job attempt's tasks: the ``local`` and ``spark`` launchers."""

from __future__ import annotations

import queue
from typing import Protocol

from lockgate.cluster.events import TaskEvent
from lockgate.runtime.spec import TaskSpec


class Launcher(Protocol):
    """Starts every task of one attempt and reports each one's exit as a
    :class:`~lockgate.cluster.events.TaskExited` event."""

    name: str

    def start(self, specs: list[TaskSpec], coordinator: tuple[str, int],
              secret: bytes) -> None: ...

    def pids(self) -> dict[int, int]:
        """Process id of every running task, by global task number (for tests)."""
        ...

    def stop(self) -> None:
        """End every task of the attempt; when it returns none of them runs."""
        ...

    def stalled(self) -> None:
        """The attempt did not start in time: what it ran on is not to be
        reused by the next attempt (called before :meth:`stop`)."""
        ...


def make_launcher(name: str, events: queue.Queue[TaskEvent]) -> Launcher:
    if name == "local":
        from lockgate.cluster.local.launcher import LocalLauncher

        return LocalLauncher(events)
    from lockgate.cluster.spark.launcher import SparkLauncher

    return SparkLauncher(events)


def end_job(name: str, job_id: str) -> None:
    """The job is over (every attempt stopped): free what its launcher kept
    across attempts (the ``spark`` launcher's barrier stage of task hosts)."""
    if name == "spark":
        from lockgate.cluster.spark.stage import release

        release(job_id)
