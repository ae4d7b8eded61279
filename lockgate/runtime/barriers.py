"""Barrier alignment as a small state machine, free of I/O.

A task with several input channels calls the handler for every barrier,
cancel-barrier and end-of-partition it reads; the handler decides and tells
its ``Controller`` what to do with the checkpoint (snapshot, abort, the
unaligned steps) and its ``InputGate`` what to do with the input queues
(block a channel, unblock them all, let barriers overtake, look at what a
barrier overtook). Two states: *waiting for the first barrier* and
*collecting barriers* of one checkpoint. The handler owns the barrier of the
checkpoint it collects (``barrier``: its kind and trigger time, forwarded
unchanged) and hands it to the controller.

Exactly-once (aligned): a channel that delivered ``Barrier(n)`` is blocked
until all live channels delivered it. At-least-once: nothing is blocked; the
snapshot is taken when the last barrier arrives.

Unaligned (exactly-once, FLIP-76; ``unaligned=True``): at the first barrier of
``n`` the task snapshots at once (``start_unaligned``: operator state, the
output's unsent records, the barrier forwarded ahead of them), and the gate
lets barriers of ``n`` already queued overtake; nothing is blocked. A barrier
that overtook elements queued in the mailbox (``overtaken``) has the
controller record them as that channel's in-flight data (``record_input``
with what ``InputGate.peek`` shows), and every channel still waiting for its
barrier is in ``recording``: what the task takes from it until its barrier
arrives is in-flight data too. When every live channel delivered ``n``,
``finish_unaligned`` writes it all and acknowledges. With ``aligned_timeout``
a checkpoint starts aligned and turns unaligned once it is older than that
(``tick``, or a barrier the mailbox already let overtake). Which barriers
overtake is :meth:`BarrierHandler.overtakes`: a checkpoint's, not a
savepoint's or a final one's (``BarrierKind.may_be_unaligned``), and with
``aligned_timeout`` once older than that.

The handler also measures alignment: the seconds from a checkpoint's first
barrier to its last (0 with one input channel, and in at-least-once mode,
where nothing is blocked; unaligned, nothing is blocked meanwhile); it hands
it to the controller with the snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

from lockgate.protocol import Barrier, StreamElement

TICK = 0.01
"""Seconds between two checks of the aligned timeout (:meth:`BarrierHandler.tick`)."""


class AbortReason(StrEnum):
    SUBSUMED = "a newer checkpoint's barrier arrived before alignment finished"
    CANCELLED = "an upstream task cancelled the checkpoint"


class Controller(Protocol):
    """What the barriers make the task do with a checkpoint (the task's
    :class:`~lockgate.runtime.snapshotter.Snapshotter`)."""

    def trigger_snapshot(self, barrier: Barrier, alignment: float) -> None:
        """Every live channel delivered ``barrier`` (aligned, or at least
        once): snapshot and forward it; ``alignment``: seconds the channels
        were blocked."""

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        """Give ``checkpoint_id`` up here (decline it, tell downstream)."""

    def start_unaligned(self, barrier: Barrier) -> None:
        """Snapshot operator state and the output's unsent records now, send
        ``barrier`` ahead of them."""

    def record_input(self, channel: int, elements: list[StreamElement]) -> None:
        """``elements`` of ``channel`` precede its barrier of the unaligned
        checkpoint being taken: in-flight data."""

    def finish_unaligned(self, checkpoint_id: int, alignment: float) -> None:
        """Every barrier arrived: write the snapshot and its in-flight data, ack."""


class InputGate(Protocol):
    """The task's input queues, as alignment sees them (the task's
    :class:`~lockgate.runtime.mailbox.Mailbox`)."""

    def block(self, channel: int) -> None:
        """Take nothing more from ``channel`` until :meth:`unblock_all`."""

    def unblock_all(self) -> None: ...

    def promote(self, overtakes: Callable[[Barrier], bool]) -> None:
        """Barriers already queued that ``overtakes`` accepts go ahead of
        what is queued before them."""

    def peek(self, channel: int, count: int) -> list[StreamElement]:
        """The first ``count`` elements queued on ``channel``, left in place."""


class BarrierHandler:
    """Tracks the barriers of one task's input channels."""

    def __init__(self, num_channels: int, controller: Controller, gate: InputGate,
                 aligned: bool = True, clock: Callable[[], float] = time.monotonic, *,
                 unaligned: bool = False, aligned_timeout: float | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.live: set[int] = set(range(num_channels))
        self.controller = controller
        self.gate = gate
        self.aligned = aligned
        self.unaligned = aligned and unaligned
        """Checkpoints may be taken unaligned (only in exactly-once mode)."""
        self.aligned_timeout = aligned_timeout if self.unaligned else None
        self.pending: int | None = None
        """The checkpoint being collected, or None while waiting for a first barrier."""
        self.barrier: Barrier | None = None
        """The barrier of ``pending`` (the last one accepted), forwarded as is:
        its kind and trigger time."""
        self.received: set[int] = set()
        self.last_done = 0
        """Highest checkpoint id that was snapshotted or aborted here."""
        self.clock = clock
        self.wall_clock = wall_clock
        self._first_barrier: float | None = None
        self.pending_unaligned = False
        """The pending checkpoint is being taken unaligned (its snapshot is taken)."""
        self.recording: set[int] = set()
        """Channels whose input is in-flight data of the pending unaligned
        checkpoint: live, and their barrier has not arrived yet."""
        self._started_at = 0.0
        self._may_overtake = True
        self._blocked = False
        self._next_tick = 0.0

    # -- events -----------------------------------------------------------
    def barrier_received(self, channel: int, barrier: Barrier,
                         overtaken: int | None = None) -> None:
        """``barrier`` came on ``channel``; ``overtaken``: it went ahead of
        that many elements queued on the channel (the mailbox let it
        overtake), None: it came in order."""
        checkpoint_id = barrier.checkpoint_id
        if checkpoint_id <= self.last_done:
            return  # late barrier of a checkpoint already aborted or taken
        if self.pending is not None and checkpoint_id > self.pending:
            self._abort(self.pending, AbortReason.SUBSUMED)
        if self.pending is None:
            self.pending = checkpoint_id
            self.received = set()
            # one live input never waits: its alignment is 0
            self._first_barrier = self.clock() if self.aligned and len(self.live) > 1 else None
            self._started_at = barrier.timestamp
            self._may_overtake = barrier.kind.may_be_unaligned
        if checkpoint_id < self.pending:
            return  # an older checkpoint that we already gave up
        self.barrier = barrier
        self.received.add(channel)
        if self.pending_unaligned:
            self.recording.discard(channel)
        elif overtaken is not None or (self.unaligned and self._may_overtake
                                       and self._timed_out()):
            self._go_unaligned()
        elif self.aligned:
            self.gate.block(channel)
            self._blocked = True
        if overtaken is not None:
            self.controller.record_input(channel, self.gate.peek(channel, overtaken))
        self._maybe_complete()

    def overtakes(self, barrier: Barrier) -> bool:
        """Does ``barrier`` go ahead of the input queued before it? (Called by
        the reader threads through the mailbox: reads the settings only.)"""
        if not barrier.kind.may_be_unaligned:
            return False  # savepoints and final checkpoints stay aligned
        timeout = self.aligned_timeout
        return not timeout or self.wall_clock() - barrier.timestamp > timeout

    def tick(self, wait: float) -> float:
        """Aligned timeout, called by the task's loop: every :data:`TICK`
        seconds queued barriers older than the timeout overtake, and a
        pending aligned checkpoint older than it turns unaligned. Returns
        how long the loop may wait for input (``wait``, shorter while a
        checkpoint is pending)."""
        now = self.clock()
        if now >= self._next_tick:
            self._next_tick = now + TICK
            self.gate.promote(self.overtakes)
            self.check_timeout()
        return min(wait, TICK) if self.pending is not None else wait

    def check_timeout(self) -> None:
        """An aligned checkpoint older than ``aligned_timeout`` turns unaligned."""
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

    # -- internals --------------------------------------------------------
    def _timed_out(self) -> bool:
        timeout = self.aligned_timeout
        return timeout is None or self.wall_clock() - self._started_at > timeout

    def _go_unaligned(self) -> None:
        barrier = self.barrier
        assert barrier is not None
        self.pending_unaligned = True
        self.recording = self.live - self.received
        self.controller.start_unaligned(barrier)
        n = barrier.checkpoint_id
        self.gate.promote(lambda b: b.checkpoint_id == n)  # its queued barriers overtake
        if self._blocked:
            self._blocked = False
            self.gate.unblock_all()  # channels blocked while it was aligned

    def _maybe_complete(self) -> None:
        barrier = self.barrier
        assert barrier is not None
        if self.received >= self.live:
            unaligned = self.pending_unaligned
            self._reset()
            self.last_done = barrier.checkpoint_id
            start = self._first_barrier
            alignment = 0.0 if start is None else self.clock() - start
            if unaligned:
                self.controller.finish_unaligned(barrier.checkpoint_id, alignment)
                return
            self.controller.trigger_snapshot(barrier, alignment)
            if self.aligned:
                self._blocked = False
                self.gate.unblock_all()

    def _abort(self, checkpoint_id: int, reason: AbortReason) -> None:
        self._reset()
        self.last_done = max(self.last_done, checkpoint_id)
        if self.aligned:
            self._blocked = False
            self.gate.unblock_all()
        self.controller.abort_checkpoint(checkpoint_id, reason)

    def _reset(self) -> None:
        """Back to waiting for a first barrier."""
        self.pending = None
        self.barrier = None
        self.received = set()
        self.pending_unaligned = False
        self.recording = set()
