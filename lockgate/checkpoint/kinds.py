"""The closed sets a checkpoint's ``_metadata`` records, as StrEnums (their
values are the strings stored)."""

from __future__ import annotations

from enum import StrEnum


class CheckpointKind(StrEnum):
    """A periodic (or final) checkpoint, or a savepoint (``kind`` in ``_metadata``)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class BarrierKind(StrEnum):
    """What a barrier (and the trigger that starts it) is for, from the
    coordinator's trigger to the tasks' snapshots; a closed set, checked when
    a trigger or a barrier is decoded."""

    CHECKPOINT = "checkpoint"
    """A periodic checkpoint: aligned or, if configured, unaligned."""
    SAVEPOINT = "savepoint"
    """A savepoint the job goes on after (canonical state, always aligned)."""
    STOP = "stop"
    """A stop's savepoint: every task holds still after its snapshot until it
    completes (sinks commit, the tasks end) or is aborted."""
    FINAL = "final"
    """The final checkpoint of a bounded job or a drain (always aligned)."""
    RESCALE = "rescale"
    """A rescale's checkpoint: every task holds still after its snapshot, as
    for a stop, but keyed state is written as a periodic checkpoint writes it
    (incrementally on RocksDB: only what changed since the last checkpoint),
    since it stays in the job's own checkpoint folder."""

    @property
    def is_savepoint(self) -> bool:
        """Keyed state is written canonically (a savepoint's, a stop's)."""
        return self in (BarrierKind.SAVEPOINT, BarrierKind.STOP)

    @property
    def holds(self) -> bool:
        """Every task holds still after its snapshot until the checkpoint
        completes (the sinks commit, the tasks end) or is aborted."""
        return self in (BarrierKind.STOP, BarrierKind.RESCALE)

    @property
    def may_be_unaligned(self) -> bool:
        """Only periodic checkpoints may overtake data; the others align."""
        return self is BarrierKind.CHECKPOINT


class OperatorStateMode(StrEnum):
    """How an operator's state entries are redistributed on restore (its
    ``operator_state_mode``, recorded per operator in ``_metadata``)."""

    SPLIT = "split"
    """Each task gets its own entries back at the same parallelism; at another
    parallelism every entry goes to exactly one task, round-robin."""
    UNION = "union"
    """Every task gets every entry and keeps those it owns."""
