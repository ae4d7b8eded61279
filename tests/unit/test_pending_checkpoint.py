"""Acknowledgements, completion and retention decisions of the coordinator."""

from __future__ import annotations

from lockgate.checkpoint.metadata import CheckpointMetadata, StateHandle
from lockgate.checkpoint.pending import (
    AckResult,
    CheckpointAbortReason,
    PendingCheckpoint,
    build_metadata,
    checkpoints_to_discard,
)


def pending(tasks=(0, 1, 2)) -> PendingCheckpoint:
    return PendingCheckpoint(4, 1000.0, 10.0, frozenset(tasks))


def test_acks_complete_once_every_task_acked():
    p = pending()
    assert p.acknowledge(0, {}, 10.1) is AckResult.SUCCESS
    assert p.acknowledge(0, {}, 10.2) is AckResult.DUPLICATE
    assert p.acknowledge(9, {}, 10.2) is AckResult.UNKNOWN
    assert not p.fully_acknowledged
    p.acknowledge(1, {}, 10.3)
    p.acknowledge(2, {}, 10.4)
    assert p.fully_acknowledged
    assert round(p.ack_times[2], 6) == 0.4


def test_aborted_checkpoint_discards_acks():
    p = pending()
    p.acknowledge(0, {}, 10.1)
    p.abort(CheckpointAbortReason.DECLINED)
    assert p.acknowledge(1, {}, 10.2) is AckResult.DISCARDED
    assert not p.fully_acknowledged


def test_expiry():
    p = pending()
    assert not p.expired(15.0, timeout=10.0)
    assert p.expired(20.5, timeout=10.0)


def test_retention_keeps_newest():
    assert checkpoints_to_discard([3, 1, 2, 5], 2) == [1, 2]
    assert checkpoints_to_discard([1], 3) == []


def test_metadata_places_handles_by_subtask():
    p = pending(tasks=(0, 1, 2))
    p.acknowledge(0, {"src": StateHandle("src-0.state", 3, 0)}, 11)
    p.acknowledge(1, {"sum": StateHandle("sum-0.state", 5, 0)}, 11)
    p.acknowledge(2, {"sum": None}, 11)
    meta = build_metadata("job", p, {0: (0, 0, ["src"]), 1: (1, 0, ["sum"]), 2: (1, 1, ["sum"])},
                          {"src": 1, "sum": 2}, {"src": "split", "sum": "split"}, 128)
    assert meta.operators["sum"].subtasks == [StateHandle("sum-0.state", 5, 0), None]
    assert meta.operators["src"].subtasks[0] == StateHandle("src-0.state", 3, 0)
    assert meta.checkpoint_id == 4 and meta.max_parallelism == 128
    assert p.size == 8
    stored = meta.to_json()  # as _metadata holds it, and back
    assert stored["operators"]["sum"]["subtasks"][0] == {
        "file": "sum-0.state", "size": 5, "crc32": 0, "keyed_offset": 0}
    assert CheckpointMetadata.from_json(stored, "_metadata") == meta


def test_operator_is_finished_only_when_every_subtask_finished():
    p = pending(tasks=(0, 1, 2))
    p.acknowledge(0, {"src": None}, 11, finished=True)
    p.acknowledge(1, {"sum": None}, 11, finished=True)
    p.acknowledge(2, {"sum": None}, 11, finished=False)
    meta = build_metadata("job", p, {0: (0, 0, ["src"]), 1: (1, 0, ["sum"]), 2: (1, 1, ["sum"])},
                          {"src": 1, "sum": 2}, {"src": "split", "sum": "split"}, 128)
    assert meta.operators["src"].finished is True
    assert meta.operators["sum"].finished is False  # partly finished: keeps running
