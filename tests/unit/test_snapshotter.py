"""The task's side of a checkpoint (``Snapshotter``), driven directly: real
operators with heap keyed state, a real ``SnapshotWriter`` writing to a
temporary folder, a real output edge over socket pairs; what the task sends
the coordinator is a list."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lockgate.api.plan import Partitioning
from lockgate.checkpoint.kinds import BarrierKind
from lockgate.checkpoint.metadata import CHANNEL_STATE_KEY
from lockgate.checkpoint.storage import checkpoint_dir, read_state_file
from lockgate.protocol import Ack, Barrier, Batch, CancelBarrier, Decline, Watermark
from lockgate.runtime import wire
from lockgate.runtime.barriers import AbortReason
from lockgate.runtime.channel_state import parse
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.operators import OperatorSnapshot, StreamOperator
from lockgate.runtime.snapshots import SnapshotWriter
from lockgate.runtime.snapshotter import Progress, Snapshotter
from lockgate.state.backend import HeapKeyedStateBackend, ValueStateDescriptor
from lockgate.state.serde import StateSerializer
from tests.unit.test_mailbox_output import Channels, records_of, writer


class Op(StreamOperator):
    """Keyed state on the heap, the checkpoints it snapshotted as operator
    state, and the verdicts it heard."""

    def __init__(self, uid: str) -> None:
        super().__init__(SimpleNamespace(uid=uid), None)  # type: ignore[arg-type]
        self.backend = HeapKeyedStateBackend(128, range(128), StateSerializer())
        self.backend.current_key = uid
        self.backend.get_state(ValueStateDescriptor("v")).update(1)
        self.heard: list[tuple[str, int]] = []
        self.savepoints: list[bool] = []
        """Whether each snapshot was a savepoint's."""

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        snap = super().snapshot(checkpoint_id, savepoint)
        snap.operator_state = [checkpoint_id]
        self.savepoints.append(savepoint)
        return snap

    def notify_complete(self, checkpoint_id: int) -> None:
        self.heard.append(("complete", checkpoint_id))

    def notify_aborted(self, checkpoint_id: int) -> None:
        self.heard.append(("aborted", checkpoint_id))


class Harness:
    def __init__(self, tmp_path: Path, *, unaligned_at_source: bool = False) -> None:
        self.spec = SimpleNamespace(job_dir=str(tmp_path), task_index=0, inputs=[[10, 11]],
                                    outputs=[[20, 21]], inline_threshold=0,
                                    vertex=SimpleNamespace(operators=[SimpleNamespace(uid="a")]))
        self.sent: list[Any] = []
        faults = FaultInjector([], 0, 0)
        self.writer = SnapshotWriter(self.spec, StateSerializer(), faults,  # type: ignore[arg-type]
                                     self.sent.append)
        self.ops = [Op("a"), Op("b")]
        self.channels = Channels(2)
        self.out = writer(Partitioning.REBALANCE, self.channels, batch_size=100)
        self.progress = Progress(read=5, written=3, finished=False, final=False)
        self.snapshotter = Snapshotter(self.ops, [self.out], self.writer, StateSerializer(),
                                       faults, self.sent.append, lambda: self.progress,
                                       unaligned_at_source=unaligned_at_source)

    def written(self) -> list[Any]:
        """What was sent, once the writer wrote everything submitted."""
        self.writer.close()
        return self.sent


def test_aligned_snapshot_sends_the_barrier_after_the_records_and_acks(tmp_path):
    h = Harness(tmp_path)
    h.out.add([1, 2, 3])
    h.snapshotter.trigger_snapshot(Barrier(4, BarrierKind.CHECKPOINT, 99.0), 0.25)
    received = h.channels.received(0) + h.channels.received(1)
    assert sorted(records_of(received)) == [1, 2, 3]  # flushed before the barrier
    assert [e for e in received if isinstance(e, Barrier)] == [
        Barrier(4, BarrierKind.CHECKPOINT, 99.0)] * 2  # forwarded as it came
    [ack] = h.written()
    assert isinstance(ack, Ack) and ack.checkpoint_id == 4 and ack.alignment == 0.25
    assert (ack.read, ack.written, ack.finished) == (5, 3, False)
    assert set(ack.handles) == {"a", "b"} and CHANNEL_STATE_KEY not in ack.handles
    assert h.snapshotter.holding is None


def test_a_savepoints_keyed_state_is_canonical_and_a_stop_holds_until_aborted(tmp_path):
    h = Harness(tmp_path)
    h.snapshotter.trigger_snapshot(Barrier(2, BarrierKind.SAVEPOINT, 1.0), 0.0)
    assert all(op.savepoints == [True] for op in h.ops)
    assert h.snapshotter.holding is None  # a savepoint the job goes on after
    h.snapshotter.trigger_snapshot(Barrier(3, BarrierKind.STOP, 1.0), 0.0)
    assert h.snapshotter.holding == 3
    h.snapshotter.notify_aborted(2)  # another one's verdict: still holding
    assert h.snapshotter.holding == 3
    h.snapshotter.notify_aborted(3)  # the stop failed: the job goes on
    assert h.snapshotter.holding is None
    assert h.ops[0].heard == [("aborted", 2), ("aborted", 3)]
    h.snapshotter.trigger_snapshot(Barrier(4, BarrierKind.CHECKPOINT, 1.0), 0.0)
    assert all(op.savepoints == [True, True, False] for op in h.ops)  # a stop's is one too
    assert [m.checkpoint_id for m in h.written()] == [2, 3, 4]


def test_completion_reaches_every_operator(tmp_path):
    h = Harness(tmp_path)
    h.snapshotter.notify_complete(7)
    assert [op.heard for op in h.ops] == [[("complete", 7)], [("complete", 7)]]


def test_a_source_trigger_starts_the_barrier_with_its_kind_and_time(tmp_path):
    h = Harness(tmp_path)
    h.snapshotter.trigger(1, BarrierKind.FINAL)
    [barrier] = h.channels.received(0)
    assert isinstance(barrier, Barrier) and barrier.checkpoint_id == 1
    assert barrier.kind is BarrierKind.FINAL and barrier.timestamp > 0
    [ack] = h.written()
    assert isinstance(ack, Ack) and ack.alignment == 0.0


def test_unaligned_snapshot_stores_output_and_input_in_flight(tmp_path):
    h = Harness(tmp_path)
    h.out.add([1, 2, 3])  # buffered, not sent: output channel state
    h.snapshotter.start_unaligned(Barrier(5, BarrierKind.CHECKPOINT, 1.0))
    first = h.channels.received(0)
    assert first == [Barrier(5, BarrierKind.CHECKPOINT, 1.0)]  # ahead of the records
    h.snapshotter.record_input(1, [Batch([7]), Watermark(3.0)])
    h.snapshotter.finish_unaligned(5, 0.5)
    [ack] = h.written()
    assert isinstance(ack, Ack) and ack.alignment == 0.5
    handle = ack.handles[CHANNEL_STATE_KEY]
    assert handle is not None
    chk = checkpoint_dir(str(tmp_path), 5)
    recovered = parse(read_state_file(chk, handle), h.spec, StateSerializer(),  # type: ignore[arg-type]
                      "test")
    assert recovered.inputs == {1: [Batch([7]), Watermark(3.0)]}
    assert len(recovered.outputs) == 1  # the buffered records, on one channel


def test_a_source_takes_periodic_checkpoints_unaligned_if_configured(tmp_path):
    h = Harness(tmp_path, unaligned_at_source=True)
    h.out.add([1])
    h.snapshotter.trigger(1, BarrierKind.CHECKPOINT)
    [ack] = h.written()
    assert CHANNEL_STATE_KEY in ack.handles  # the unsent record went into channel state
    h = Harness(tmp_path / "sp", unaligned_at_source=True)
    h.snapshotter.trigger(2, BarrierKind.SAVEPOINT)  # savepoints stay aligned
    [ack] = h.written()
    assert CHANNEL_STATE_KEY not in ack.handles


def test_abort_declines_cancels_downstream_and_drops_the_capture(tmp_path):
    h = Harness(tmp_path)
    h.snapshotter.start_unaligned(Barrier(6, BarrierKind.CHECKPOINT, 1.0))
    h.snapshotter.abort_checkpoint(6, AbortReason.SUBSUMED)
    h.snapshotter.record_input(0, [Batch([1])])  # nothing is captured any more
    assert h.channels.received(0) == [Barrier(6, BarrierKind.CHECKPOINT, 1.0)]
    end = h.channels.ends[0]
    assert end is not None
    assert wire.decode_element(*end.recv()) == CancelBarrier(6)
    h.snapshotter.start_unaligned(Barrier(7, BarrierKind.CHECKPOINT, 1.0))
    h.snapshotter.finish_unaligned(7, 0.0)
    decline, ack = h.written()
    assert decline == Decline(6, AbortReason.SUBSUMED.value)
    assert isinstance(ack, Ack) and ack.checkpoint_id == 7
    assert ack.handles[CHANNEL_STATE_KEY] is None  # nothing was in flight
