"""Barrier alignment as a small state machine, free of I/O.

A task with several input channels calls the handler for every barrier,
cancel-barrier and end-of-partition it reads; the handler decides and tells
its ``Controller`` what to do (block a channel, take the snapshot, abort a
checkpoint). Two states: *waiting for the first barrier* and *collecting
barriers* of one checkpoint.

Exactly-once (aligned): a channel that delivered ``Barrier(n)`` is blocked
until all live channels delivered it. At-least-once: nothing is blocked; the
snapshot is taken when the last barrier arrives.

Unaligned (exactly-once, FLIP-76; ``unaligned=True``): at the first barrier of
``n`` the task snapshots at once (``start_unaligned``: operator state, the
output's unsent records, the barrier forwarded ahead of them); nothing is
blocked. A barrier that overtook batches queued in the mailbox (``priority``)
has the controller record them as that channel's in-flight data
(``record_overtaken``), and every channel still waiting for its barrier is in
``recording``: what the task takes from it until its barrier arrives is
in-flight data too. When every live channel delivered ``n``,
``finish_unaligned`` writes it all and acknowledges. With ``aligned_timeout``
a checkpoint starts aligned and turns unaligned once it is older than that
(``check_timeout``, or a barrier the mailbox already let overtake). Barriers
of savepoints and final checkpoints (``may_overtake=False``) stay aligned.

The handler also measures alignment: the seconds from a checkpoint's first
barrier to its last (0 with one input channel, and in at-least-once mode,
where nothing is blocked; unaligned, nothing is blocked meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol, cast


class AbortReason(StrEnum):
    SUBSUMED = "a newer checkpoint's barrier arrived before alignment finished"
    CANCELLED = "an upstream task cancelled the checkpoint"


class Controller(Protocol):
    def block(self, channel: int) -> None: ...

    def unblock_all(self) -> None: ...

    def trigger_snapshot(self, checkpoint_id: int) -> None: ...

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None: ...


class UnalignedController(Controller, Protocol):
    def start_unaligned(self, checkpoint_id: int) -> None:
        """Snapshot operator state and the output's unsent records now, send
        the barrier ahead of them, let queued barriers of ``checkpoint_id``
        overtake."""

    def record_overtaken(self, channel: int) -> None:
        """The batches the barrier just taken from ``channel`` overtook are
        in-flight data of the checkpoint being taken."""

    def finish_unaligned(self, checkpoint_id: int) -> None:
        """Every barrier arrived: write the snapshot and its in-flight data, ack."""


class BarrierHandler:
    """Tracks the barriers of one task's input channels."""

    def __init__(self, num_channels: int, controller: Controller, aligned: bool = True,
                 clock: Callable[[], float] = time.monotonic, *, unaligned: bool = False,
                 aligned_timeout: float | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.live: set[int] = set(range(num_channels))
        self.controller = controller
        self.aligned = aligned
        self.unaligned = aligned and unaligned
        """Checkpoints may be taken unaligned (only in exactly-once mode)."""
        self.aligned_timeout = aligned_timeout if self.unaligned else None
        self.pending: int | None = None
        """The checkpoint being collected, or None while waiting for a first barrier."""
        self.received: set[int] = set()
        self.last_done = 0
        """Highest checkpoint id that was snapshotted or aborted here."""
        self.clock = clock
        self.wall_clock = wall_clock
        self._first_barrier: float | None = None
        self.alignment = 0.0
        """Seconds the last snapshotted checkpoint kept channels blocked."""
        self.pending_unaligned = False
        """The pending checkpoint is being taken unaligned (its snapshot is taken)."""
        self.recording: set[int] = set()
        """Channels whose input is in-flight data of the pending unaligned
        checkpoint: live, and their barrier has not arrived yet."""
        self._started_at = 0.0
        self._may_overtake = True
        self._blocked = False

    # -- events -----------------------------------------------------------
    def barrier_received(self, channel: int, checkpoint_id: int, *, priority: bool = False,
                         may_overtake: bool = True, timestamp: float | None = None) -> None:
        """``priority``: the barrier overtook queued input (the mailbox let it);
        ``may_overtake``: a checkpoint's barrier, not a savepoint's or a final
        one; ``timestamp``: when the checkpoint was triggered (wall clock)."""
        if checkpoint_id <= self.last_done:
            return  # late barrier of a checkpoint already aborted or taken
        if self.pending is not None and checkpoint_id > self.pending:
            self._abort(self.pending, AbortReason.SUBSUMED)
        if self.pending is None:
            self.pending = checkpoint_id
            self.received = set()
            # one live input never waits: its alignment is 0
            self._first_barrier = self.clock() if self.aligned and len(self.live) > 1 else None
            self._started_at = self.wall_clock() if timestamp is None else timestamp
            self._may_overtake = may_overtake
        if checkpoint_id < self.pending:
            return  # an older checkpoint that we already gave up
        self.received.add(channel)
        if self.pending_unaligned:
            self.recording.discard(channel)
            if priority:
                self.controller_unaligned.record_overtaken(channel)
        elif priority or (self.unaligned and self._may_overtake and self._timed_out()):
            self._go_unaligned()
            if priority:
                self.controller_unaligned.record_overtaken(channel)
        elif self.aligned:
            self.controller.block(channel)
            self._blocked = True
        self._maybe_complete()

    def check_timeout(self) -> None:
        """Called now and then by the task: an aligned checkpoint older than
        ``aligned_timeout`` turns unaligned."""
        if (self.pending is not None and not self.pending_unaligned and self.unaligned
                and self._may_overtake and self.aligned_timeout is not None
                and self._timed_out()):
            self._go_unaligned()
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
        self.recording.discard(channel)
        if self.pending is not None:
            self._maybe_complete()

    def take_alignment(self) -> float:
        """The alignment time of the checkpoint being snapshotted (0 for a
        snapshot a barrier did not trigger: a source's), then reset."""
        value, self.alignment = self.alignment, 0.0
        return value

    # -- internals --------------------------------------------------------
    @property
    def controller_unaligned(self) -> UnalignedController:
        return cast(UnalignedController, self.controller)

    def _timed_out(self) -> bool:
        timeout = self.aligned_timeout
        return timeout is None or self.wall_clock() - self._started_at > timeout

    def _go_unaligned(self) -> None:
        assert self.pending is not None
        self.pending_unaligned = True
        self.recording = self.live - self.received
        self.controller_unaligned.start_unaligned(self.pending)
        if self._blocked:
            self._blocked = False
            self.controller.unblock_all()  # channels blocked while it was aligned

    def _maybe_complete(self) -> None:
        assert self.pending is not None
        if self.received >= self.live:
            n = self.pending
            unaligned = self.pending_unaligned
            self.pending = None
            self.received = set()
            self.pending_unaligned = False
            self.recording = set()
            self.last_done = n
            start = self._first_barrier
            self.alignment = 0.0 if start is None else self.clock() - start
            if unaligned:
                self.controller_unaligned.finish_unaligned(n)
                return
            self.controller.trigger_snapshot(n)
            if self.aligned:
                self._blocked = False
                self.controller.unblock_all()

    def _abort(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.pending = None
        self.received = set()
        self.pending_unaligned = False
        self.recording = set()
        self.last_done = max(self.last_done, checkpoint_id)
        if self.aligned:
            self._blocked = False
            self.controller.unblock_all()
        self.controller.abort_checkpoint(checkpoint_id, reason)
