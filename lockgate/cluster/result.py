"""What a finished job reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from lockgate.checkpoint.coordinator import CheckpointRecord
from lockgate.config import CheckpointingMode


def end_to_end_guarantee(sources_replayable: list[bool], sinks_exactly_once: list[bool],
                         mode: CheckpointingMode) -> str:
    """The guarantee a job's parts allow (design: Recovery)."""
    if not all(sources_replayable):
        return "at_most_once"
    if mode == CheckpointingMode.EXACTLY_ONCE and all(sinks_exactly_once):
        return "exactly_once"
    return "at_least_once"


@dataclass
class JobResult:
    job_id: str
    status: str
    """``finished`` (input done, or stopped with a drain), ``stopped`` (stop with a
    savepoint, no drain) or ``cancelled``."""
    guarantee: str
    restarts: int
    failures: list[str]
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    latest_checkpoint: str | None = None
    records_in: int = 0
    records_out: int = 0
    duration: float = 0.0
    savepoint: str | None = None
    """The savepoint a stop (``stop --savepoint``) ended the job with."""
    recovery_times: list[float] = field(default_factory=list)
    """Per restart: seconds from detecting the failure until every task of the
    next attempt was running again (records flowing)."""

    @property
    def completed_checkpoints(self) -> list[CheckpointRecord]:
        return [c for c in self.checkpoints if c.status == "completed"]


@dataclass
class Progress:
    """A snapshot of a running job's progress, reported after every completed
    checkpoint (counts are those of the current attempt, as of its checkpoint)."""

    job_id: str
    records_read: int
    records_written: int
    checkpoints_completed: int
    last_checkpoint_id: int | None
    last_checkpoint_duration: float | None
    restarts: int
    elapsed: float
