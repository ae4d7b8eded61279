"""The checkpoint history: one record per checkpoint a job triggered, what
the job's result, its metrics and the REST API report of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.checkpoint.pending import PendingCheckpoint


class CheckpointStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class CheckpointRecord:
    """One line of the checkpoint history."""

    checkpoint_id: int
    kind: CheckpointKind
    status: CheckpointStatus
    trigger_time: float
    duration: float | None = None
    size: int = 0
    failure: str | None = None
    ack_times: dict[int, float] = field(default_factory=dict)
    alignment: float | None = None
    """Seconds of barrier alignment: the longest any task blocked its inputs."""
    alignments: dict[int, float] = field(default_factory=dict)
    sync_duration: float | None = None
    """Seconds of the longest synchronous part of a task's snapshot."""
    async_duration: float | None = None
    """Seconds of the longest asynchronous part (writing a task's files)."""
    metadata_duration: float | None = None
    """Seconds the coordinator took to write ``_metadata`` (or the savepoint)
    once every task acknowledged."""
    completed_time: float | None = None
    """Wall-clock time it completed (``time.time()``)."""
    in_flight: int = 0
    """Bytes of in-flight data (channel state) of an unaligned checkpoint,
    included in ``size``."""
    final: bool = False
    """The final checkpoint (or savepoint) of bounded input or a drain."""

    @property
    def label(self) -> str:
        """What the history shows: ``checkpoint``, ``savepoint``, ``final checkpoint``..."""
        return f"final {self.kind}" if self.final else str(self.kind)

    def completed(self, p: PendingCheckpoint, now: float) -> None:
        self.status = CheckpointStatus.COMPLETED
        self.duration = now - p.started
        self.ack_times = dict(p.ack_times)
        self.alignments = dict(p.alignments)
        self.alignment = max(p.alignments.values(), default=0.0)
        self.size = p.size
        self.in_flight = p.in_flight_size
        self.completed_time = time.time()

    def task_durations(self, sync_duration: float, async_duration: float) -> None:
        """A task's acknowledgement: keep the longest parts."""
        self.sync_duration = max(self.sync_duration or 0.0, sync_duration)
        self.async_duration = max(self.async_duration or 0.0, async_duration)
