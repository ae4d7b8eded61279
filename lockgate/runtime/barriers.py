"""Barrier alignment as a small state machine, free of I/O.

A task with several input channels calls the handler for every barrier,
cancel-barrier and end-of-partition it reads; the handler decides and tells
its ``Controller`` what to do (block a channel, take the snapshot, abort a
checkpoint). Two states: *waiting for the first barrier* and *collecting
barriers* of one checkpoint.

Exactly-once (aligned): a channel that delivered ``Barrier(n)`` is blocked
until all live channels delivered it. At-least-once: nothing is blocked; the
snapshot is taken when the last barrier arrives.

The handler also measures alignment: how long channels were blocked for a
checkpoint, from its first barrier to its last (0 with one input channel, and
in at-least-once mode, where nothing is blocked).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol


class AbortReason(StrEnum):
    SUBSUMED = "a newer checkpoint's barrier arrived before alignment finished"
    CANCELLED = "an upstream task cancelled the checkpoint"


class Controller(Protocol):
    def block(self, channel: int) -> None: ...

    def unblock_all(self) -> None: ...

    def trigger_snapshot(self, checkpoint_id: int) -> None: ...

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None: ...


class BarrierHandler:
    """Tracks the barriers of one task's input channels."""

    def __init__(self, num_channels: int, controller: Controller, aligned: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.live: set[int] = set(range(num_channels))
        self.controller = controller
        self.aligned = aligned
        self.pending: int | None = None
        """The checkpoint being collected, or None while waiting for a first barrier."""
        self.received: set[int] = set()
        self.last_done = 0
        """Highest checkpoint id that was snapshotted or aborted here."""
        self.clock = clock
        self._first_barrier: float | None = None
        self.alignment = 0.0
        """Seconds the last snapshotted checkpoint kept channels blocked."""

    # -- events -----------------------------------------------------------
    def barrier_received(self, channel: int, checkpoint_id: int) -> None:
        if checkpoint_id <= self.last_done:
            return  # late barrier of a checkpoint already aborted or taken
        if self.pending is not None and checkpoint_id > self.pending:
            self._abort(self.pending, AbortReason.SUBSUMED)
        if self.pending is None:
            self.pending = checkpoint_id
            self.received = set()
            # one live input never waits: its alignment is 0
            self._first_barrier = self.clock() if self.aligned and len(self.live) > 1 else None
        if checkpoint_id < self.pending:
            return  # an older checkpoint that we already gave up
        self.received.add(channel)
        if self.aligned:
            self.controller.block(channel)
        self._maybe_complete()

    def cancel_received(self, channel: int, checkpoint_id: int) -> None:
        if checkpoint_id <= self.last_done:
            return
        if self.pending is not None:
            if checkpoint_id < self.pending:
                return  # older than what we collect: already given up
            if checkpoint_id == self.pending:
                self._abort(checkpoint_id, AbortReason.CANCELLED)
                return
            self._abort(self.pending, AbortReason.SUBSUMED)
        self.last_done = checkpoint_id
        self.controller.abort_checkpoint(checkpoint_id, AbortReason.CANCELLED)

    def end_of_partition(self, channel: int) -> None:
        self.live.discard(channel)
        self.received.discard(channel)
        if self.pending is not None:
            self._maybe_complete()

    def take_alignment(self) -> float:
        """The alignment time of the checkpoint being snapshotted (0 for a
        snapshot a barrier did not trigger: a source's), then reset."""
        value, self.alignment = self.alignment, 0.0
        return value

    # -- internals --------------------------------------------------------
    def _maybe_complete(self) -> None:
        assert self.pending is not None
        if self.received >= self.live:
            n = self.pending
            self.pending = None
            self.received = set()
            self.last_done = n
            start = self._first_barrier
            self.alignment = 0.0 if start is None else self.clock() - start
            self.controller.trigger_snapshot(n)
            if self.aligned:
                self.controller.unblock_all()

    def _abort(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.pending = None
        self.received = set()
        self.last_done = max(self.last_done, checkpoint_id)
        if self.aligned:
            self.controller.unblock_all()
        self.controller.abort_checkpoint(checkpoint_id, reason)
