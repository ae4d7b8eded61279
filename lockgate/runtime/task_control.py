"""The task's control plane, as a mixin of :class:`~lockgate.runtime.task.Task`:
the coordinator's control messages (one ``match``), what the task sends back,
and its role as the barrier handler's
:class:`~lockgate.runtime.barriers.Controller` (aborting a checkpoint, the
synchronous part of a snapshot; the mailbox is the handler's input gate)."""

from __future__ import annotations

import time
from collections.abc import Callable

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.errors import LockgateError
from lockgate.protocol import (
    Barrier,
    Cancel,
    CancelBarrier,
    ControlLost,
    ControlMessage,
    Decline,
    Drain,
    Finish,
    NotifyAborted,
    NotifyComplete,
    TriggerCheckpoint,
)
from lockgate.runtime import wire
from lockgate.runtime.barriers import AbortReason
from lockgate.runtime.chain import OperatorChain
from lockgate.runtime.operators import SourceOperator
from lockgate.runtime.spec import TaskSpec
from lockgate.runtime.unaligned import UnalignedCheckpoints


class TaskControl(UnalignedCheckpoints):
    spec: TaskSpec
    chain: OperatorChain
    source: SourceOperator | None
    control: wire.ControlChannel | None
    done: bool
    holding: int | None
    """The stop's savepoint this task snapshotted and now waits on."""
    _end_of_input: Callable[[], None]
    _flush_all: Callable[[], None]

    # -------------------------------------------------------- control plane
    def _on_control(self, msg: ControlMessage) -> None:
        match msg:
            case TriggerCheckpoint(checkpoint_id, kind):
                barrier = Barrier(checkpoint_id, kind, time.time())
                if self.spec.unaligned and kind.may_be_unaligned and not self.spec.aligned_timeout:
                    self.start_unaligned(barrier)  # a source: no input to wait for
                    self.finish_unaligned(checkpoint_id, 0.0)
                else:
                    self.trigger_snapshot(barrier, 0.0)
            case NotifyComplete(checkpoint_id):
                self.faults.hit("commit")
                for op in self.ops:
                    op.notify_complete(checkpoint_id)
                    if op.backend is not None:
                        op.backend.notify_checkpoint_complete(checkpoint_id)
            case NotifyAborted(checkpoint_id):
                if checkpoint_id == self.holding:
                    self.holding = None  # the stop failed: the job goes on
                for op in self.ops:
                    op.notify_aborted(checkpoint_id)
            case Finish():
                self.faults.hit("finish")
                self.done = True
            case Drain():
                # stop --drain: this source ends its input now, as if exhausted
                # (its position stays in state: a job resumed from the final
                # savepoint reads on from there)
                if self.source is not None and not self.reached_end:
                    self.drained = True
                    self._end_of_input()
            case Cancel():
                raise LockgateError("cancelled by the driver")
            case ControlLost():
                raise ConnectionError("lost the connection to the coordinator")
            case _:
                raise LockgateError(f"unexpected control message {msg.tag!r}")

    def _send(self, msg: ControlMessage) -> None:
        assert self.control is not None
        self.control.send(msg)

    def _counts(self) -> tuple[int, int]:
        """Records this task read from its source and wrote to its sinks."""
        return (self.chain.records_in if self.source is not None else 0,
                self.chain.written())

    # ------------------------------------ barrier handler's controller role
    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        dropped = self.in_flight.take()  # an unaligned one's in-flight data: dropped
        if dropped is not None:  # its state too: handed back to the backends
            self.snapshots.discard(dropped.snaps)
        self._send(Decline(checkpoint_id, reason.value))
        for out in self.outputs:
            out.broadcast(CancelBarrier(checkpoint_id))

    def trigger_snapshot(self, barrier: Barrier, alignment: float) -> None:
        """Synchronous part: capture every operator's state (sinks pre-commit),
        forward the barrier; the asynchronous part writes the files and acks."""
        started = time.monotonic()
        checkpoint_id = barrier.checkpoint_id
        savepoint = barrier.kind.is_savepoint  # keyed state canonical
        for op in self.ops:  # a RocksDB changelog keeps files for a canonical write
            if op.backend is not None:
                op.backend.savepoint_next = savepoint
        snaps = [(op, op.snapshot(checkpoint_id)) for op in self.ops]
        self._flush_all()
        for out in self.outputs:
            out.broadcast(barrier)
        read, written = self._counts()
        self.snapshots.submit(checkpoint_id, snaps, read=read, written=written,
                              finished=self.reached_end and not self.drained,
                              alignment=alignment, final=self.reached_end,
                              sync_duration=time.monotonic() - started, savepoint=savepoint)
        if barrier.kind is BarrierKind.STOP:
            # A stop's savepoint is synchronous (as Flink's): nothing more is
            # read, emitted or fired until it completes (then the sinks
            # commit and Finish ends the task) or is aborted.
            self.holding = checkpoint_id
