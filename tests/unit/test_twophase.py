"""Unit tests of the two-phase-commit sink writer base."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.twophase import Precommitted, TwoPhaseCommitSinkWriter
from lockgate.errors import CheckpointCorruptError, LockgateError


def _info(task_index: int = 0, parallelism: int = 1, attempt: int = 0) -> TaskInfo:
    return TaskInfo("job", "sink", task_index, parallelism, 128, attempt)


@dataclass(frozen=True, slots=True)
class MemHandle:
    name: str

    def to_state(self) -> dict[str, Any]:
        return {"name": self.name}


class MemWriter(TwoPhaseCommitSinkWriter[list, MemHandle]):
    """An in-memory 2PC writer that records every call."""

    def __init__(self, info: TaskInfo, store: dict[str, list[Any]] | None = None) -> None:
        super().__init__(info)
        self.calls: list[tuple[str, Any]] = []
        self.store = store if store is not None else {}  # committed txn name -> records
        self.prepared: dict[str, list[Any]] = {}
        self.n = 0
        self.recovered: list[Precommitted[MemHandle]] | None = None
        self.finished = False

    def begin_transaction(self) -> list:
        self.calls.append(("begin", None))
        return []

    def write(self, txn: list, batch: list[Any]) -> None:
        txn.extend(batch)

    def pre_commit(self, txn: list) -> MemHandle:
        name = f"t{self.info.task_index}-{self.n}"
        self.n += 1
        self.prepared[name] = list(txn)
        self.calls.append(("pre_commit", name))
        return MemHandle(name)

    def commit(self, entry: Precommitted[MemHandle]) -> None:
        name = entry.handle.name
        self.calls.append(("commit", name))
        if name in self.prepared:
            self.store[name] = self.prepared.pop(name)

    def abort(self, txn: list) -> None:
        self.calls.append(("abort", txn))

    def decode_handle(self, entry: dict[str, Any]) -> MemHandle:
        if type(entry.get("name")) is not str:
            raise CheckpointCorruptError(f"not a MemWriter handle: {entry!r}")
        return MemHandle(entry["name"])

    def recover(self, handles: list[Precommitted[MemHandle]]) -> None:
        self.recovered = handles
        for h in self.responsible_handles(handles):
            self.commit(h)

    def on_finish(self) -> None:
        self.finished = True


def test_lazy_begin_and_empty_snapshot() -> None:
    w = MemWriter(_info())
    w.restore([])
    assert w.recovered == []
    w.write_batch([])
    assert w.snapshot_state(1) == []
    assert w.calls == []
    assert not w.has_open_transaction


def test_snapshot_precommits_and_returns_all_uncommitted() -> None:
    w = MemWriter(_info(task_index=0))
    w.write_batch([1, 2])
    w.write_batch([3])
    assert w.has_open_transaction
    s1 = w.snapshot_state(1)
    assert s1 == [{"name": "t0-0", "checkpoint_id": 1, "task_index": 0}]
    assert not w.has_open_transaction
    assert w.calls == [("begin", None), ("pre_commit", "t0-0")]
    # nothing written: nothing begun, nothing pre-committed, old handle still state
    assert w.snapshot_state(2) == s1
    w.write_batch([4])
    s3 = w.snapshot_state(3)
    assert [e["name"] for e in s3] == ["t0-0", "t0-1"]
    assert [e["checkpoint_id"] for e in s3] == [1, 3]
    assert w.pending_checkpoints == [1, 3]


def test_notify_complete_commits_in_order_up_to_n() -> None:
    w = MemWriter(_info())
    for cid in (1, 2, 3):
        w.write_batch([cid])
        w.snapshot_state(cid)
    w.notify_checkpoint_complete(2)
    assert [c for c in w.calls if c[0] == "commit"] == [("commit", "t0-0"), ("commit", "t0-1")]
    assert w.store == {"t0-0": [1], "t0-1": [2]}
    assert w.pending_checkpoints == [3]
    assert [e["name"] for e in w.snapshot_state(4)] == ["t0-2"]
    # a stale notification commits nothing
    w.notify_checkpoint_complete(1)
    assert len([c for c in w.calls if c[0] == "commit"]) == 2


def test_aborted_checkpoint_keeps_handles_for_a_later_completion() -> None:
    w = MemWriter(_info())
    w.write_batch(["a"])
    w.snapshot_state(1)
    w.notify_checkpoint_aborted(1)
    assert w.pending_checkpoints == [1]
    w.write_batch(["b"])
    state = w.snapshot_state(2)
    assert [e["name"] for e in state] == ["t0-0", "t0-1"]
    w.notify_checkpoint_complete(2)
    assert w.store == {"t0-0": ["a"], "t0-1": ["b"]}
    assert w.pending_checkpoints == []
    assert w.snapshot_state(3) == []


def test_failed_commit_keeps_the_rest_pending() -> None:
    class Failing(MemWriter):
        def commit(self, entry: Precommitted[MemHandle]) -> None:
            if entry.handle.name == "t0-1":
                raise OSError("disk gone")
            super().commit(entry)

    w = Failing(_info())
    for cid in (1, 2):
        w.write_batch([cid])
        w.snapshot_state(cid)
    with pytest.raises(OSError):
        w.notify_checkpoint_complete(2)
    assert w.pending_checkpoints == [2]


def test_close_aborts_only_the_open_transaction() -> None:
    w = MemWriter(_info())
    w.write_batch([1])
    w.snapshot_state(1)
    w.write_batch([2])
    w.close()
    aborts = [c for c in w.calls if c[0] == "abort"]
    assert aborts == [("abort", [2])]
    assert not w.has_open_transaction
    w.close()  # idempotent
    assert len([c for c in w.calls if c[0] == "abort"]) == 1


def test_finish_calls_hook_and_final_checkpoint_precommits() -> None:
    w = MemWriter(_info())
    w.write_batch([1])
    w.finish()
    assert w.finished
    assert [e["name"] for e in w.snapshot_state(7)] == ["t0-0"]
    w.notify_checkpoint_complete(7)
    w.close()
    assert w.store == {"t0-0": [1]}
    assert not [c for c in w.calls if c[0] == "abort"]


@pytest.mark.parametrize(
    ("task_index", "parallelism", "expected"),
    [
        (0, 4, ["a0"]),
        (1, 4, ["b1"]),
        (3, 4, ["d3"]),
        (0, 2, ["c2", "a0"]),  # sorted by checkpoint id: c2 is from checkpoint 1
        (1, 2, ["d3", "b1"]),
        (0, 1, ["c2", "d3", "a0", "b1"]),
        (5, 8, []),
    ],
)
def test_restore_gets_union_and_responsibility_is_modulo(
    task_index: int, parallelism: int, expected: list[str]
) -> None:
    union = [
        {"name": "a0", "checkpoint_id": 2, "task_index": 0},
        {"name": "b1", "checkpoint_id": 2, "task_index": 1},
        {"name": "c2", "checkpoint_id": 1, "task_index": 2},
        {"name": "d3", "checkpoint_id": 1, "task_index": 3},
    ]
    w = MemWriter(_info(task_index, parallelism))
    w.restore(union)
    assert w.recovered is not None  # recover sees every task's handles, decoded
    assert [h.to_state() for h in w.recovered] == union
    assert [c[1] for c in w.calls if c[0] == "commit"] == expected


def test_rescaling_commits_every_transaction_exactly_once() -> None:
    union: list[dict[str, Any]] = []
    for t in range(5):
        w = MemWriter(_info(t, 5))
        w.write_batch([t])
        union += w.snapshot_state(1)
    for p in (1, 2, 3, 5, 7):
        committed = []
        for t in range(p):
            w = MemWriter(_info(t, p))
            w.restore(union)
            committed += [c[1] for c in w.calls if c[0] == "commit"]
        assert sorted(committed) == sorted(e["name"] for e in union)


def test_reserved_handle_keys_rejected() -> None:
    @dataclass(frozen=True)
    class BadHandle(MemHandle):
        def to_state(self) -> dict[str, Any]:
            return {"checkpoint_id": 3}

    class Bad(MemWriter):
        def pre_commit(self, txn: list) -> MemHandle:
            return BadHandle("x")

    w = Bad(_info())
    w.write_batch([1])
    with pytest.raises(LockgateError, match="reserved"):
        w.snapshot_state(1)


@pytest.mark.parametrize("entry", [{"name": "x"}, "x", {"checkpoint_id": 1}])
def test_restore_rejects_foreign_entries(entry: Any) -> None:
    w = MemWriter(_info())
    with pytest.raises(LockgateError, match="two-phase-commit handle"):
        w.restore([entry])


@pytest.mark.parametrize("entry", [
    {"name": "x", "checkpoint_id": "1", "task_index": 0},
    {"name": "x", "checkpoint_id": 1, "task_index": -1},
    {"name": 7, "checkpoint_id": 1, "task_index": 0},  # the sink's own check
])
def test_restore_decodes_every_entry_before_recovering(entry: dict[str, Any]) -> None:
    w = MemWriter(_info())
    good = {"name": "a", "checkpoint_id": 1, "task_index": 0}
    with pytest.raises(CheckpointCorruptError):
        w.restore([good, entry])
    assert w.recovered is None and w.calls == []  # one bad entry: nothing done
