"""The coordinator's control messages to a running task: :class:`ControlHandler`.

One ``match`` over them: a checkpoint's (trigger, completion, abort) go to
the task's :class:`~lockgate.runtime.snapshotter.Snapshotter`; the others
say what the task does next (:class:`Next`): go on, finish (its final
checkpoint or its stop's savepoint completed and its sinks committed), or
end its input now (``stop --drain``). A cancel or a lost coordinator fails
the task.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from lockgate.checkpoint.kinds import BarrierKind
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
from lockgate.runtime.faults import FaultInjector


class Checkpoints(Protocol):
    """What the coordinator's checkpoint messages reach (the task's ``Snapshotter``)."""

    def trigger(self, checkpoint_id: int, kind: BarrierKind) -> None: ...

    def notify_complete(self, checkpoint_id: int) -> None: ...

    def notify_aborted(self, checkpoint_id: int) -> None: ...


class Next(Enum):
    """What the task does after a control message."""

    GO_ON = "go on"
    FINISH = "finish"
    """The job's end: the task ends (after its final checkpoint, or its stop's
    savepoint, completed)."""
    DRAIN = "drain"
    """``stop --drain``: a source ends its input now, as if exhausted (its
    position stays in state: a job resumed from the final savepoint reads on
    from there)."""


class ControlHandler:
    def __init__(self, checkpoints: Checkpoints, faults: FaultInjector) -> None:
        self.checkpoints = checkpoints
        self.faults = faults

    def handle(self, msg: ControlMessage) -> Next:
        match msg:
            case TriggerCheckpoint(checkpoint_id, kind):
                self.checkpoints.trigger(checkpoint_id, kind)
            case NotifyComplete(checkpoint_id):
                self.checkpoints.notify_complete(checkpoint_id)
            case NotifyAborted(checkpoint_id):
                self.checkpoints.notify_aborted(checkpoint_id)
            case Finish():
                self.faults.hit("finish")
                return Next.FINISH
            case Drain():
                return Next.DRAIN
            case Cancel():
                raise LockgateError("cancelled by the driver")
            case ControlLost():
                raise ConnectionError("lost the connection to the coordinator")
            case _:
                raise LockgateError(f"unexpected control message {msg.tag!r}")
        return Next.GO_ON
