"""The task's part in unaligned checkpoints (FLIP-76), as a mixin of
:class:`~lockgate.runtime.task.Task`: it is the barrier handler's
:class:`~lockgate.runtime.barriers.UnalignedController`.

* Reader threads ask :meth:`UnalignedCheckpoints._overtakes` whether a barrier
  goes ahead of the batches queued in the mailbox (a checkpoint's, not a
  savepoint's or a final one's; with ``aligned_timeout``, once the checkpoint
  is older than that).
* :meth:`start_unaligned` (the first barrier): operator state is captured,
  the records the outputs buffered become output channel state, and the
  barrier is sent ahead of them; barriers of the checkpoint already queued
  overtake too (``Mailbox.promote``).
* :meth:`record_overtaken`: the batches a barrier overtook are input channel
  state; the task adds what it takes from a channel in ``barriers.recording``.
* :meth:`finish_unaligned` (every barrier arrived): the snapshot writer
  stores operator state and in-flight data and acknowledges.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.protocol import Barrier, ControlMessage
from lockgate.runtime.barriers import BarrierHandler
from lockgate.runtime.channel_state import InFlight, InFlightCapture
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.mailbox import Mailbox
from lockgate.runtime.operators import StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.snapshots import SnapshotWriter
from lockgate.runtime.spec import TaskSpec

TICK = 0.01
"""Seconds between two checks of the aligned timeout."""


class UnalignedCheckpoints:
    spec: TaskSpec
    ops: list[StreamOperator]
    outputs: list[OutputEdgeWriter]
    mailbox: Mailbox
    faults: FaultInjector
    barriers: BarrierHandler
    snapshots: SnapshotWriter
    in_flight: InFlightCapture
    replaying: dict[int, int]
    reached_end: bool
    drained: bool
    _barrier: tuple[BarrierKind, float]
    _overtaken: int
    _next_tick: float
    _counts: Callable[[], tuple[int, int]]
    _send: Callable[[ControlMessage], None]

    def _note_barrier(self, barrier: Barrier) -> None:
        """Keep the kind and trigger time of ``barrier`` to forward them,
        unless it is a late one of a checkpoint given up or taken here."""
        b = self.barriers
        n = barrier.checkpoint_id
        if n > b.last_done and (b.pending is None or n >= b.pending):
            self._barrier = (barrier.kind, barrier.timestamp)

    def _overtakes(self, barrier: Barrier) -> bool:
        """Called by the reader threads: does ``barrier`` overtake queued input?"""
        if not barrier.kind.may_be_unaligned:
            return False  # savepoints and final checkpoints stay aligned
        timeout = self.spec.aligned_timeout
        return not timeout or time.time() - barrier.timestamp > timeout

    def _alignment_tick(self, wait: float) -> float:
        """Aligned timeout: a checkpoint older than the timeout turns unaligned
        here (its queued barriers overtake, a pending alignment stops).
        Returns how long the loop may wait for input (``wait``, shorter while
        a checkpoint is aligning)."""
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK
            self.mailbox.promote(self._overtakes)
            self.barriers.check_timeout()
        return min(wait, TICK) if self.barriers.pending is not None else wait

    def start_unaligned(self, checkpoint_id: int) -> None:
        """The first barrier of an unaligned checkpoint: snapshot now, the
        outputs' unsent records become output channel state, the barrier goes
        out ahead of them, and queued barriers of ``checkpoint_id`` overtake."""
        started = time.monotonic()
        snaps = [(op, op.snapshot(checkpoint_id)) for op in self.ops]
        read, written = self._counts()
        self.in_flight.begin(InFlight(
            checkpoint_id, snaps, read, written, self.reached_end and not self.drained,
            self.reached_end, time.monotonic() - started), self.outputs)
        barrier = Barrier(checkpoint_id, *self._barrier)
        for out in self.outputs:
            out.send_ahead(barrier)
        self.faults.hit("unaligned_barrier")
        self.mailbox.promote(lambda b: b.checkpoint_id == checkpoint_id)

    def record_overtaken(self, channel: int) -> None:
        self.in_flight.add_input(channel, self.mailbox.peek(channel, self._overtaken))

    def finish_unaligned(self, checkpoint_id: int) -> None:
        snap = self.in_flight.take()
        assert snap is not None and snap.checkpoint_id == checkpoint_id
        self.snapshots.submit(checkpoint_id, snap.snaps, read=snap.read, written=snap.written,
                              finished=snap.finished, alignment=self.barriers.take_alignment(),
                              final=snap.final, sync_duration=snap.sync_duration,
                              in_flight=snap)

    def _replayed(self, ch: int) -> None:
        """A recovered in-flight element of ``ch`` is taken."""
        self.faults.hit("replay")
        left = self.replaying[ch] - 1
        if left:
            self.replaying[ch] = left
        else:
            del self.replaying[ch]
