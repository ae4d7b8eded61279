"""The task's control handler, driven message by message: what reaches the
checkpoints, what the task is told to do next, what fails it."""

from __future__ import annotations

import pytest

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.errors import LockgateError
from lockgate.protocol import (
    Cancel,
    ControlLost,
    Drain,
    Finish,
    NotifyAborted,
    NotifyComplete,
    Start,
    TriggerCheckpoint,
)
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.task_control import ControlHandler, Next


class Checkpoints:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, BarrierKind | None]] = []

    def trigger(self, checkpoint_id: int, kind: BarrierKind) -> None:
        self.calls.append(("trigger", checkpoint_id, kind))

    def notify_complete(self, checkpoint_id: int) -> None:
        self.calls.append(("complete", checkpoint_id, None))

    def notify_aborted(self, checkpoint_id: int) -> None:
        self.calls.append(("aborted", checkpoint_id, None))


def handler() -> tuple[ControlHandler, Checkpoints]:
    checkpoints = Checkpoints()
    return ControlHandler(checkpoints, FaultInjector([], 0, 0)), checkpoints


def test_checkpoint_messages_reach_the_checkpoints_and_the_task_goes_on():
    h, checkpoints = handler()
    assert h.handle(TriggerCheckpoint(1, BarrierKind.CHECKPOINT)) is Next.GO_ON
    assert h.handle(TriggerCheckpoint(2, BarrierKind.STOP)) is Next.GO_ON
    assert h.handle(NotifyAborted(2)) is Next.GO_ON
    assert h.handle(NotifyComplete(1)) is Next.GO_ON
    assert checkpoints.calls == [("trigger", 1, BarrierKind.CHECKPOINT),
                                 ("trigger", 2, BarrierKind.STOP),
                                 ("aborted", 2, None), ("complete", 1, None)]


def test_finish_and_drain_tell_the_task_what_to_do():
    h, checkpoints = handler()
    assert h.handle(Finish()) is Next.FINISH
    assert h.handle(Drain()) is Next.DRAIN
    assert checkpoints.calls == []


def test_cancel_a_lost_coordinator_and_a_stray_message_fail_the_task():
    h, _ = handler()
    with pytest.raises(LockgateError, match="cancelled by the driver"):
        h.handle(Cancel())
    with pytest.raises(ConnectionError, match="lost the connection"):
        h.handle(ControlLost())
    with pytest.raises(LockgateError, match="unexpected control message 'start'"):
        h.handle(Start({}))
