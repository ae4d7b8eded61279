"""What a finished job reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from lockgate.checkpoint.history import CheckpointRecord
from lockgate.config import CheckpointingMode


class Guarantee(StrEnum):
    """What a job's output promises across failures and restarts."""

    EXACTLY_ONCE = "exactly_once"
    """Replayable sources, aligned checkpoints and transactional sinks: every
    record's effect is in the output once."""
    AT_LEAST_ONCE = "at_least_once"
    """A restart may write again what was written since the last checkpoint."""
    AT_MOST_ONCE = "at_most_once"
    """A source that cannot replay loses what it read since the last checkpoint."""


class JobStatus(StrEnum):
    """Where a job is in its life (``JobResult.status``, the REST API's ``status``)."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    """Input done, or stopped with a drain."""
    STOPPED = "stopped"
    """Stopped with a savepoint, without a drain."""
    CANCELLED = "cancelled"
    FAILED = "failed"
    """The restart strategy gave up."""


def end_to_end_guarantee(sources_replayable: list[bool], sinks_exactly_once: list[bool],
                         mode: CheckpointingMode | str) -> Guarantee:
    """The guarantee a job's parts allow (design: Recovery)."""
    if not all(sources_replayable):
        return Guarantee.AT_MOST_ONCE
    if mode == CheckpointingMode.EXACTLY_ONCE and all(sinks_exactly_once):
        return Guarantee.EXACTLY_ONCE
    return Guarantee.AT_LEAST_ONCE


@dataclass
class LocalRestoreRecord:
    """Local recovery at one restore of one keyed operator in one task: it
    restored from the local copy of its state on its host (``local``), or
    read the checkpoint storage because the copy was missing or failed a
    check (``reason``)."""

    attempt: int
    task: int
    operator: str
    checkpoint_id: int
    local: bool
    reason: str = ""


@dataclass
class JobResult:
    job_id: str
    status: JobStatus
    """``finished`` (input done, or stopped with a drain), ``stopped`` (stop with a
    savepoint, no drain) or ``cancelled``."""
    guarantee: Guarantee
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
    local_restores: list[LocalRestoreRecord] = field(default_factory=list)
    """Per keyed operator of a task that restored after a failure with local
    recovery on (RocksDB): whether it used its local copy, and if not why."""

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
