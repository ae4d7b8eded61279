"""Unaligned checkpoints without processes: the mailbox lets a checkpoint's
barrier overtake queued batches (never the end of a channel, never a
savepoint's barrier), in-flight data is captured encoded, written, and read
back as untrusted data; a restore at another parallelism is refused."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata, StateHandle
from lockgate.checkpoint.restore import check_channel_state
from lockgate.checkpoint.storage import read_state_file
from lockgate.errors import CheckpointCorruptError, LockgateError
from lockgate.protocol import IDLE, Barrier, Batch, EndOfData, Watermark
from lockgate.runtime import wire
from lockgate.runtime.channel_state import (
    InFlight,
    InFlightCapture,
    parse,
    write_channel_state,
)
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.mailbox import Mailbox, Overtaking
from lockgate.state.serde import StateSerializer


def overtaking_box(channels: int = 2, capacity: int = 4) -> Mailbox:
    box = Mailbox(channels, capacity)
    box.let_overtake(lambda b: b.kind == "checkpoint")
    return box


def test_barrier_overtakes_queued_batches_and_watermarks() -> None:
    box = overtaking_box()
    box.put(0, Batch([1]))
    box.put(0, Watermark(5.0))
    box.put(0, Batch([2]))
    box.put(1, Batch([3]))
    barrier = Barrier(7, "checkpoint", 1.0)
    box.put(0, barrier)
    assert box.take(0) == (0, Overtaking(barrier, 3))
    assert box.peek(0, 3) == [Batch([1]), Watermark(5.0), Batch([2])]
    # the overtaken elements stay queued, in order, after it
    assert [box.take(0) for _ in range(4)] == [(0, Batch([1])), (1, Batch([3])),
                                               (0, Watermark(5.0)), (0, Batch([2]))]


def test_barrier_overtakes_a_full_queue_without_blocking_its_reader() -> None:
    box = overtaking_box(1, capacity=2)
    box.put(0, Batch([1]))
    box.put(0, Batch([2]))
    done = threading.Event()

    def reader() -> None:
        box.put(0, Barrier(1))
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(10), "the barrier's reader blocked on the full queue"
    assert box.take(0) == (0, Overtaking(Barrier(1), 2))


def test_savepoint_barrier_and_end_of_data_are_not_overtaken() -> None:
    box = overtaking_box()
    box.put(0, Batch([1]))
    box.put(0, Barrier(1, "savepoint"))
    assert box.take(0) == (0, Batch([1]))
    assert box.take(0) == (0, Barrier(1, "savepoint"))
    box.put(1, EndOfData(False))
    box.put(1, Barrier(2))
    assert box.take(0) == (1, EndOfData(False))  # a barrier never overtakes the end
    assert box.take(0) == (1, Barrier(2))


def test_promote_lets_a_queued_barrier_overtake() -> None:
    box = Mailbox(1)
    box.put(0, Batch([1]))
    box.put(0, Barrier(3))
    box.put(0, Batch([2]))
    box.promote(lambda b: b.checkpoint_id == 3)
    assert box.take(0) == (0, Overtaking(Barrier(3), 1))
    assert [box.take(0) for _ in range(2)] == [(0, Batch([1])), (0, Batch([2]))]


# ------------------------------------------------------------ channel state

def spec(inputs=((10, 11),), outputs=((20, 21),)):
    return SimpleNamespace(inputs=[list(e) for e in inputs], outputs=[list(e) for e in outputs],
                           task_index=0,
                           vertex=SimpleNamespace(operators=[SimpleNamespace(uid="head")]))


def captured(serializer: StateSerializer) -> InFlight:
    capture = InFlightCapture(serializer)
    out = SimpleNamespace(unsent=lambda: [(1, False, [("k", 1), ("k", 2)])])
    capture.begin(InFlight(4, [], 0, 0, False, False, 0.0), [out])  # type: ignore[list-item]
    record = {"n": [1]}
    capture.add_input(1, [Batch([record]), Watermark(9.5), IDLE, EndOfData(False)])
    record["n"].append(2)  # a later change cannot reach what was captured
    snap = capture.take()
    assert snap is not None
    return snap


def test_in_flight_data_round_trips(tmp_path) -> None:
    serializer = StateSerializer()
    s = spec()
    handle = write_channel_state(str(tmp_path), s, captured(serializer), FaultInjector([], 0, 0))
    assert handle is not None and handle.file == "head-0.channels"
    recovered = parse(read_state_file(str(tmp_path), handle), s, serializer, "test")
    assert recovered.inputs == {1: [Batch([{"n": [1]}]), Watermark(9.5), IDLE]}
    assert [(e, ch, kind, wire.decode_batch(payload))
            for e, ch, kind, payload in recovered.outputs] == [
        (0, 1, wire.Frame.BATCH, [("k", 1), ("k", 2)])]


def test_arrow_batches_in_flight_round_trip(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    serializer = StateSerializer()
    batch = pa.RecordBatch.from_pydict({"k": [1, 2], "v": [0.5, 1.5]})
    capture = InFlightCapture(serializer)
    out = SimpleNamespace(unsent=lambda: [(0, True, [batch, batch])])
    capture.begin(InFlight(2, [], 0, 0, False, False, 0.0), [out])  # type: ignore[list-item]
    capture.add_input(0, [Batch(batch), Watermark(3.0)])  # type: ignore[arg-type]
    snap = capture.take()
    assert snap is not None
    s = spec()
    handle = write_channel_state(str(tmp_path), s, snap, FaultInjector([], 0, 0))
    assert handle is not None
    recovered = parse(read_state_file(str(tmp_path), handle), s, serializer, "test")
    [element, mark] = recovered.inputs[0]
    assert element.records.equals(batch) and mark == Watermark(3.0)
    [(e, ch, kind, payload)] = recovered.outputs
    assert (e, ch, kind) == (0, 0, wire.Frame.ARROW_BATCH)
    assert wire.decode_element(kind, payload).records.to_pydict() == {
        "k": [1, 2, 1, 2], "v": [0.5, 1.5, 0.5, 1.5]}


@pytest.mark.parametrize("damage,complaint", [
    (lambda b: b[:5], "too short"),
    (lambda b: b[:-3], "not msgpack"),
    (lambda b: (1 << 40).to_bytes(8, "big") + b[8:], "header longer"),
])
def test_damaged_channel_state_is_corrupt(tmp_path, damage, complaint) -> None:
    serializer = StateSerializer()
    s = spec()
    handle = write_channel_state(str(tmp_path), s, captured(serializer), FaultInjector([], 0, 0))
    assert handle is not None
    data = read_state_file(str(tmp_path), handle)
    with pytest.raises(CheckpointCorruptError, match=complaint):
        parse(damage(data), s, serializer, "test")


def test_channel_state_of_channels_the_task_lacks_is_corrupt(tmp_path) -> None:
    serializer = StateSerializer()
    handle = write_channel_state(str(tmp_path), spec(), captured(serializer),
                                 FaultInjector([], 0, 0))
    assert handle is not None
    data = read_state_file(str(tmp_path), handle)
    with pytest.raises(CheckpointCorruptError, match="input channel 0/1"):
        parse(data, spec(inputs=((10,),)), serializer, "test")
    with pytest.raises(CheckpointCorruptError, match="output channel 0/1"):
        parse(data, spec(outputs=((20,),)), serializer, "test")


def test_pickled_records_need_allow_pickle(tmp_path) -> None:
    class Point:
        pass

    capture = InFlightCapture(StateSerializer())
    capture.begin(InFlight(1, [], 0, 0, False, False, 0.0), [])
    with pytest.raises(TypeError):  # as a state value: not without allow_pickle
        capture.add_input(0, [Batch([Point()])])


def test_restore_at_another_parallelism_is_refused_naming_savepoints() -> None:
    handle = StateHandle("head-0.channels", 100, 1)
    op = OperatorMetadata(2, OperatorStateMode.SPLIT, [None, None], channel_state=[handle, None])
    meta = CheckpointMetadata("job", 3, CheckpointKind.CHECKPOINT, 0.0, False, 128,
                              {"head": op})
    check_channel_state(meta, {"head": 2}, "checkpoint chk-3")  # same parallelism: fine
    with pytest.raises(LockgateError, match="another parallelism.*savepoint"):
        check_channel_state(meta, {"head": 3}, "checkpoint chk-3")
    with pytest.raises(LockgateError, match="no longer start a chain.*savepoint"):
        check_channel_state(meta, {"head": 2}, "checkpoint chk-3", heads={"other"})
    back = CheckpointMetadata.from_json(meta.to_json(), "_metadata")
    assert back.operators["head"].channel_state == [handle, None]
    assert back.in_flight_size == 100


def test_the_driver_refuses_an_unaligned_checkpoint_at_another_parallelism(tmp_path) -> None:
    """``load_checkpoint`` (what ``from_checkpoint=`` runs before anything
    starts) on a checkpoint whose first operator holds in-flight data."""
    from lockgate import Pipeline
    from lockgate.checkpoint.storage import write_metadata
    from lockgate.cluster.submission import load_checkpoint
    from lockgate.connectors import FileSink, SequenceSource
    from lockgate.graph.jobgraph import build_job_graph

    def graph(parallelism: int):
        p = Pipeline("j", parallelism=parallelism)
        (p.source(SequenceSource(1, 10), uid="numbers").key_by(lambda x: x % 2)
           .reduce(lambda a, b: a + b, uid="sums").sink(FileSink(str(tmp_path / "o")), uid="out"))
        return build_job_graph(p)

    chk = tmp_path / "chk-3"
    chk.mkdir()
    (chk / "sums-0.channels").write_bytes(b"x" * 10)
    ops = {uid: OperatorMetadata(2, OperatorStateMode.SPLIT, [None, None])
           for uid in ("numbers", "sums", "out")}
    ops["sums"] = OperatorMetadata(2, OperatorStateMode.SPLIT, [None, None],
                                   channel_state=[StateHandle("sums-0.channels", 10, 0), None])
    write_metadata(str(chk), CheckpointMetadata("j", 3, CheckpointKind.CHECKPOINT, 0.0, False,
                                                graph(2).max_parallelism, ops))
    assert load_checkpoint(str(chk), graph(2)).checkpoint_id == 3
    with pytest.raises(LockgateError, match="unaligned checkpoint.*savepoint"):
        load_checkpoint(str(chk), graph(3))
    (chk / "sums-0.channels").write_bytes(b"x" * 9)
    with pytest.raises(CheckpointCorruptError, match="sums-0.channels"):
        load_checkpoint(str(chk), graph(2))


def test_config_of_unaligned_checkpoints() -> None:
    from lockgate import CheckpointConfig

    assert not CheckpointConfig().unaligned
    assert CheckpointConfig(aligned_timeout=0.5).unaligned  # implies unaligned
    with pytest.raises(ValueError, match="at_least_once"):
        CheckpointConfig(unaligned=True, mode="at_least_once")
    with pytest.raises(ValueError, match="aligned_timeout"):
        CheckpointConfig(aligned_timeout=-1.0)


def test_nothing_in_flight_writes_no_file(tmp_path) -> None:
    capture = InFlightCapture(StateSerializer())
    capture.begin(InFlight(1, [], 0, 0, False, False, 0.0), [])
    capture.add_input(0, [])
    capture.add_input(1, [EndOfData(False)])
    snap = capture.take()
    assert snap is not None
    assert write_channel_state(str(tmp_path), spec(), snap, FaultInjector([], 0, 0)) is None
    assert list(tmp_path.iterdir()) == []
