"""A task's side of a checkpoint, in one place: :class:`Snapshotter`.

The barrier handler (:mod:`lockgate.runtime.barriers`) decides *when*; this
class does the synchronous part of every snapshot and hands it to the
:class:`~lockgate.runtime.snapshots.SnapshotWriter` (the asynchronous part:
the files, then the ack). It is the handler's
:class:`~lockgate.runtime.barriers.Controller`. One checkpoint ``n``, top
down:

* :meth:`trigger`: the coordinator's ``TriggerCheckpoint(n, kind)`` at a
  source task, which aligns nothing: the barrier starts here (kind, trigger
  time), then as below.
* :meth:`trigger_snapshot` (aligned, or at least once: every barrier of
  ``n`` arrived): every operator's state is captured (a sink pre-commits),
  the outputs flush, the barrier goes out after the records, the writer gets
  the snapshot. A savepoint's keyed state is written canonically; after a
  stop's savepoint or a rescale's checkpoint the task holds still
  (:attr:`Snapshotter.holding`) until it completes or is aborted.
* Unaligned (FLIP-76): :meth:`start_unaligned` at the first barrier (state
  captured, the outputs' unsent records become output channel state, the
  barrier goes out ahead of them); :meth:`record_input` for the input that
  precedes a channel's barrier (the elements it overtook, then what the task
  takes from the channel until its barrier arrives); :meth:`finish_unaligned`
  once every barrier arrived: the writer stores state and in-flight data.
* :meth:`abort_checkpoint`: a newer barrier or a cancel barrier gave ``n``
  up here: declined, a cancel barrier downstream, an unaligned one's
  captured state handed back.
* :meth:`notify_complete` / :meth:`notify_aborted`: the coordinator's
  verdict, to every operator (sinks commit) and, on completion, its state
  backend (local recovery keeps the newest copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.protocol import Barrier, CancelBarrier, ControlMessage, Decline, StreamElement
from lockgate.runtime.barriers import AbortReason
from lockgate.runtime.channel_state import InFlight, InFlightCapture
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.operators import StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.snapshots import SnapshotWriter
from lockgate.state.serde import StateSerializer


@dataclass(frozen=True, slots=True)
class Progress:
    """What a snapshot records of its task besides state, as of the barrier."""

    read: int
    """Records the task read from its source."""
    written: int
    """Records the task's sinks wrote."""
    finished: bool
    """The input ended (not by a drain): every operator finished (FLIP-147)."""
    final: bool
    """Taken after the task reached the end of its input."""


class Snapshotter:
    """The synchronous part of a task's snapshots; the barrier handler's controller."""

    def __init__(self, ops: list[StreamOperator], outputs: list[OutputEdgeWriter],
                 writer: SnapshotWriter, serializer: StateSerializer, faults: FaultInjector,
                 send: Callable[[ControlMessage], None], progress: Callable[[], Progress], *,
                 unaligned_at_source: bool = False) -> None:
        """``serializer``: the task thread's, for in-flight records;
        ``progress``: the task's counts and end of input, asked at every
        snapshot; ``unaligned_at_source``: a source takes its periodic
        checkpoints unaligned (unaligned checkpoints without an aligned timeout)."""
        self._ops = ops
        self._outputs = outputs
        self._writer = writer
        self._faults = faults
        self._send = send
        self._progress = progress
        self._unaligned_at_source = unaligned_at_source
        self._in_flight = InFlightCapture(serializer)
        """The pending unaligned checkpoint's capture."""
        self.holding: int | None = None
        """The stop's savepoint (or rescale's checkpoint) this task
        snapshotted and now waits on (None: none): the task reads, emits and
        fires nothing meanwhile."""

    # ------------------------------------------------------------- trigger
    def trigger(self, checkpoint_id: int, kind: BarrierKind) -> None:
        """The coordinator triggered ``checkpoint_id`` at this source task:
        the barrier starts here, with the trigger time."""
        barrier = Barrier(checkpoint_id, kind, time.time())
        if self._unaligned_at_source and kind.may_be_unaligned:
            self.start_unaligned(barrier)  # no input to wait for
            self.finish_unaligned(checkpoint_id, 0.0)
        else:
            self.trigger_snapshot(barrier, 0.0)

    # ------------------------------------------------------------- aligned
    def trigger_snapshot(self, barrier: Barrier, alignment: float) -> None:
        """Capture every operator's state (sinks pre-commit), forward
        ``barrier`` after the buffered records, submit the write."""
        started = time.monotonic()
        checkpoint_id = barrier.checkpoint_id
        savepoint = barrier.kind.is_savepoint  # keyed state written canonically
        snaps = [(op, op.snapshot(checkpoint_id, savepoint)) for op in self._ops]
        for out in self._outputs:
            out.flush()
        for out in self._outputs:
            out.broadcast(barrier)
        p = self._progress()
        self._writer.submit(checkpoint_id, snaps, read=p.read, written=p.written,
                            finished=p.finished, alignment=alignment, final=p.final,
                            sync_duration=time.monotonic() - started, savepoint=savepoint)
        if barrier.kind.holds:
            # A stop's savepoint (a rescale's checkpoint) is synchronous
            # (as Flink's): nothing more is read, emitted or fired until it
            # completes (then the sinks commit and Finish ends the task) or
            # is aborted.
            self.holding = checkpoint_id

    # ----------------------------------------------------------- unaligned
    def start_unaligned(self, barrier: Barrier) -> None:
        """The first barrier of an unaligned checkpoint: snapshot now, the
        outputs' unsent records become output channel state, the barrier goes
        out ahead of them."""
        started = time.monotonic()
        checkpoint_id = barrier.checkpoint_id
        snaps = [(op, op.snapshot(checkpoint_id)) for op in self._ops]
        p = self._progress()
        self._in_flight.begin(InFlight(checkpoint_id, snaps, p.read, p.written, p.finished,
                                       p.final, time.monotonic() - started), self._outputs)
        for out in self._outputs:
            out.send_ahead(barrier)
        self._faults.hit("unaligned_barrier")

    def record_input(self, channel: int, elements: list[StreamElement]) -> None:
        """``elements`` of ``channel`` precede its barrier: input channel state."""
        self._in_flight.add_input(channel, elements)

    def finish_unaligned(self, checkpoint_id: int, alignment: float) -> None:
        """Every barrier arrived: the writer stores state and in-flight data."""
        snap = self._in_flight.take()
        assert snap is not None and snap.checkpoint_id == checkpoint_id
        self._writer.submit(checkpoint_id, snap.snaps, read=snap.read, written=snap.written,
                            finished=snap.finished, alignment=alignment, final=snap.final,
                            sync_duration=snap.sync_duration, in_flight=snap)

    # ---------------------------------------------------------------- abort
    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        """Give ``checkpoint_id`` up here: decline it, cancel it downstream."""
        dropped = self._in_flight.take()  # an unaligned one's in-flight data: dropped
        if dropped is not None:  # its state too: handed back to the backends
            self._writer.discard(dropped.snaps)
        self._send(Decline(checkpoint_id, reason.value))
        for out in self._outputs:
            out.broadcast(CancelBarrier(checkpoint_id))

    # ------------------------------------------------- the coordinator's verdict
    def notify_complete(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` completed: every operator hears it (sinks
        commit), then its state backend (older local copies go)."""
        self._faults.hit("commit")
        for op in self._ops:
            op.notify_complete(checkpoint_id)
            if op.backend is not None:
                op.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_aborted(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` was aborted: a stop's savepoint no longer holds
        the task (the job goes on); every operator hears it."""
        if checkpoint_id == self.holding:
            self.holding = None
        for op in self._ops:
            op.notify_aborted(checkpoint_id)
