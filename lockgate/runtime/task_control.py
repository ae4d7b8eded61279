"""The task's control plane, as a mixin of :class:`~lockgate.runtime.task.Task`:
the coordinator's control messages (one ``match``; a checkpoint's go to the
task's :class:`~lockgate.runtime.snapshotter.Snapshotter`) and what the task
sends back."""

from __future__ import annotations

from collections.abc import Callable

from lockgate.errors import LockgateError
from lockgate.protocol import (
    Cancel,
    ControlLost,
    ControlMessage,
    Drain,
    Finish,
    NotifyAborted,
    NotifyComplete,
    TriggerCheckpoint,
)
from lockgate.runtime import wire
from lockgate.runtime.chain import OperatorChain
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.operators import SourceOperator
from lockgate.runtime.snapshotter import Snapshotter


class TaskControl:
    chain: OperatorChain
    source: SourceOperator | None
    control: wire.ControlChannel | None
    faults: FaultInjector
    snapshotter: Snapshotter
    done: bool
    reached_end: bool
    drained: bool
    _end_of_input: Callable[[], None]

    # -------------------------------------------------------- control plane
    def _on_control(self, msg: ControlMessage) -> None:
        match msg:
            case TriggerCheckpoint(checkpoint_id, kind):
                self.snapshotter.trigger(checkpoint_id, kind)
            case NotifyComplete(checkpoint_id):
                self.snapshotter.notify_complete(checkpoint_id)
            case NotifyAborted(checkpoint_id):
                self.snapshotter.notify_aborted(checkpoint_id)
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
