"""The closed sets a checkpoint's ``_metadata`` records, as StrEnums (their
values are the strings stored)."""

from __future__ import annotations

from enum import StrEnum


class CheckpointKind(StrEnum):
    """A periodic (or final) checkpoint, or a savepoint (``kind`` in ``_metadata``)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class OperatorStateMode(StrEnum):
    """How an operator's state entries are redistributed on restore (its
    ``operator_state_mode``, recorded per operator in ``_metadata``)."""

    SPLIT = "split"
    """Each task gets its own entries back at the same parallelism; at another
    parallelism every entry goes to exactly one task, round-robin."""
    UNION = "union"
    """Every task gets every entry and keeps those it owns."""
