"""Unit tests of the exactly-once file sink, its recovery planner and CollectSink."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.filesink import FileSink, FileSinkWriter
from lockgate.connectors.filesink_plan import (
    FilePartHandle,
    FileSinkRecoveryPlan,
    final_name,
    inprogress_name,
    parse_part_name,
    pending_name,
    plan_file_sink_recovery,
)
from lockgate.connectors.twophase import Precommitted
from lockgate.errors import LockgateError


def _info(
    task_index: int = 0, parallelism: int = 1, attempt: int = 0, uid: str = "out"
) -> TaskInfo:
    return TaskInfo("job", uid, task_index, parallelism, 128, attempt)


def _writer(path: Path, fmt: str = "jsonl", **kw: Any) -> FileSinkWriter:
    w = FileSink(str(path), fmt).create_writer(_info(**kw))
    assert isinstance(w, FileSinkWriter)
    return w


def _visible(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if not n.startswith("."))


def _hidden(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("."))


def _jsonl_records(path: Path) -> list[Any]:
    out = []
    for name in _visible(path):
        out += [json.loads(line) for line in (path / name).read_text().splitlines()]
    return out


# ------------------------------------------------------------------ names


def test_part_names_roundtrip() -> None:
    final = final_name("my-op.v2", 3, 7, 12, "jsonl")
    assert final == "part-my-op.v2-3-7-12.jsonl"
    for name, kind in [
        (final, "final"),
        (inprogress_name(final), "inprogress"),
        (pending_name(final), "pending"),
    ]:
        p = parse_part_name(name)
        assert p is not None
        assert (p.uid, p.task_index, p.attempt, p.seq, p.ext, p.kind) == (
            "my-op.v2",
            3,
            7,
            12,
            "jsonl",
            kind,
        )
        assert p.final == final
    for bad in ["part-x.jsonl", ".part-a-0-0-0.jsonl", "part-a-0-0-0.jsonl.pending", "_SUCCESS"]:
        assert parse_part_name(bad) is None


# --------------------------------------------------------- recovery planner


def _h(task: int, seq: int, cid: int, uid: str = "u",
       attempt: int = 0) -> Precommitted[FilePartHandle]:
    final = final_name(uid, task, attempt, seq, "jsonl")
    return Precommitted(cid, task, FilePartHandle(pending_name(final), final))


def _ip(task: int, seq: int, uid: str = "u", attempt: int = 0) -> str:
    return inprogress_name(final_name(uid, task, attempt, seq, "jsonl"))


def _pe(task: int, seq: int, uid: str = "u", attempt: int = 0) -> str:
    return pending_name(final_name(uid, task, attempt, seq, "jsonl"))


def _fi(task: int, seq: int, uid: str = "u", attempt: int = 0) -> str:
    return final_name(uid, task, attempt, seq, "jsonl")


PLAN_CASES: list[tuple[str, list[str], list[dict[str, Any]], int, int, FileSinkRecoveryPlan]] = [
    ("fresh start, empty folder", [], [], 0, 1, FileSinkRecoveryPlan([], [], 0)),
    (
        "commit my pending, delete my orphans",
        [_pe(0, 0), _pe(0, 1), _ip(0, 2), _fi(0, 3, attempt=9)],
        [_h(0, 0, 1)],
        0,
        1,
        FileSinkRecoveryPlan([(_pe(0, 0), _fi(0, 0))], [_pe(0, 1), _ip(0, 2)], 4),
    ),
    (
        "already committed handle is skipped",
        [_fi(0, 0)],
        [_h(0, 0, 1)],
        0,
        1,
        FileSinkRecoveryPlan([], [], 1),
    ),
    (
        "lost output is still planned (commit reports it)",
        [],
        [_h(0, 0, 1)],
        0,
        1,
        FileSinkRecoveryPlan([(_pe(0, 0), _fi(0, 0))], [], 1),
    ),
    (
        "commits in checkpoint order",
        [_pe(0, 5), _pe(0, 2)],
        [_h(0, 5, 3), _h(0, 2, 1)],
        0,
        1,
        FileSinkRecoveryPlan([(_pe(0, 2), _fi(0, 2)), (_pe(0, 5), _fi(0, 5))], [], 6),
    ),
    (
        "other tasks' files and handles are left alone",
        [_pe(1, 0), _ip(1, 1), _pe(0, 0)],
        [_h(1, 0, 1), _h(0, 0, 1)],
        1,
        2,
        FileSinkRecoveryPlan([(_pe(1, 0), _fi(1, 0))], [_ip(1, 1)], 2),
    ),
    (
        "scale down: task 0 deletes orphans of vanished tasks, not named ones",
        [_pe(2, 0), _ip(2, 1), _pe(3, 0), _ip(3, 4), _ip(1, 0)],
        [_h(2, 0, 1), _h(3, 0, 1)],
        0,
        2,
        FileSinkRecoveryPlan([(_pe(2, 0), _fi(2, 0))], [_ip(2, 1), _ip(3, 4)], 0),
    ),
    (
        "scale down: task 1 commits vanished task 3's handle, deletes no >=p orphan",
        [_pe(2, 0), _ip(2, 1), _pe(3, 0), _ip(3, 4)],
        [_h(2, 0, 1), _h(3, 0, 1)],
        1,
        2,
        FileSinkRecoveryPlan([(_pe(3, 0), _fi(3, 0))], [], 0),
    ),
    (
        "visible files and other uids are never touched",
        [_fi(0, 0), _ip(0, 0, uid="other"), _pe(0, 0, uid="other")]
        + ["data.csv", ".hidden", "_SUCCESS"],
        [],
        0,
        1,
        FileSinkRecoveryPlan([], [], 1),
    ),
    (
        "uid that is a prefix of another uid",
        [_ip(0, 0, uid="u-1"), _ip(0, 0)],
        [],
        0,
        1,
        FileSinkRecoveryPlan([], [_ip(0, 0)], 1),
    ),
    (
        "next_seq continues after older attempts and handles",
        [_fi(0, 7, attempt=0)],
        [_h(0, 9, 1, attempt=1)],
        0,
        1,
        FileSinkRecoveryPlan([(_pe(0, 9, attempt=1), _fi(0, 9, attempt=1))], [], 10),
    ),
]


@pytest.mark.parametrize(
    ("listing", "handles", "task", "parallelism", "expected"),
    [c[1:] for c in PLAN_CASES],
    ids=[c[0] for c in PLAN_CASES],
)
def test_plan_file_sink_recovery(
    listing: list[str],
    handles: list[Precommitted[FilePartHandle]],
    task: int,
    parallelism: int,
    expected: FileSinkRecoveryPlan,
) -> None:
    plan = plan_file_sink_recovery(listing, handles, "u", task, parallelism)
    assert plan == expected


def test_plan_never_deletes_named_or_visible_files_any_parallelism() -> None:
    listing = [_pe(t, s) for t in range(4) for s in range(3)] + [_fi(t, 9) for t in range(4)]
    handles = [_h(t, 0, 1) for t in range(4)]
    named = {h.handle.pending for h in handles}
    for p in (1, 2, 3, 4, 6):
        deleted: list[str] = []
        committed: list[str] = []
        for t in range(p):
            plan = plan_file_sink_recovery(listing, handles, "u", t, p)
            deleted += plan.to_delete
            committed += [c[0] for c in plan.to_commit]
        assert sorted(committed) == sorted(named)
        assert not set(deleted) & named
        assert all(n.startswith(".") for n in deleted)
        assert len(deleted) == len(set(deleted))
        # every unnamed hidden file is deleted by exactly one task
        assert sorted(deleted) == sorted(n for n in listing if n.startswith(".") and n not in named)


# ------------------------------------------------------------- the writer


def test_jsonl_commit_on_checkpoint_complete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = _writer(out)
    w.restore([])
    w.write_batch([{"a": 1}, [1, 2], "x", None])
    assert _visible(out) == []
    assert len(_hidden(out)) == 1 and _hidden(out)[0].endswith(".inprogress")
    state = w.snapshot_state(1)
    assert len(_hidden(out)) == 1 and _hidden(out)[0].endswith(".pending")
    assert state[0]["records"] == 4
    assert _visible(out) == []
    w.notify_checkpoint_complete(1)
    assert _hidden(out) == []
    assert _jsonl_records(out) == [{"a": 1}, [1, 2], "x", None]
    w.close()


def test_every_checkpoint_rolls_the_file(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    for cid in (1, 2, 3):
        w.write_batch([cid])
        w.snapshot_state(cid)
    w.snapshot_state(4)  # nothing written: no new file
    w.notify_checkpoint_complete(4)
    assert _visible(tmp_path) == [_fi(0, 0, uid="out"), _fi(0, 1, uid="out"), _fi(0, 2, uid="out")]
    assert _jsonl_records(tmp_path) == [1, 2, 3]


def test_crash_simulation_restores_checkpoint_1_only(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    w.write_batch([1, 2])
    s1 = w.snapshot_state(1)
    w.write_batch([3])
    w.snapshot_state(2)
    w.notify_checkpoint_complete(1)
    w.write_batch([4])  # in-progress data of the crashed attempt
    # crash: no close(); checkpoint 2 never completed; restore checkpoint 1's state
    assert len(_hidden(tmp_path)) == 2  # checkpoint-2 pending + in-progress
    w2 = _writer(tmp_path, attempt=1)
    w2.restore(s1)
    assert _jsonl_records(tmp_path) == [1, 2]
    assert _hidden(tmp_path) == []
    # replayed data goes into new, non-colliding files
    w2.write_batch([3, 4])
    w2.snapshot_state(2)
    w2.notify_checkpoint_complete(2)
    assert _hidden(tmp_path) == []
    assert _jsonl_records(tmp_path) == [1, 2, 3, 4]


def test_recovery_removes_probes_of_tasks_killed_while_probing(tmp_path: Path) -> None:
    """A task SIGKILLed between creating and removing its writability probe
    leaves it behind: the next attempt's task of that index (or the task that
    takes the index over after a rescale down) removes it, and nothing else."""
    for name in (".lockgate-probe-out-0-0", ".lockgate-probe-out-0-2",  # task 0's
                 ".lockgate-probe-out-2-1",  # task 2 of a parallelism-3 attempt: now 0's
                 ".lockgate-probe-out-1-0",  # task 1's
                 ".lockgate-probe-out-1-3",  # a peer of the running attempt probing
                 ".lockgate-probe-other-0-0"):  # another sink's
        (tmp_path / name).write_bytes(b"")
    w = _writer(tmp_path, task_index=0, parallelism=2, attempt=3)
    w.restore([])
    assert _hidden(tmp_path) == [".lockgate-probe-other-0-0", ".lockgate-probe-out-1-0",
                                 ".lockgate-probe-out-1-3"]


def test_crash_before_notify_commits_on_recovery(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    w.write_batch(["a"])
    s1 = w.snapshot_state(1)
    # checkpoint 1 completed at the coordinator, but the notice never arrived
    w2 = _writer(tmp_path, attempt=1)
    w2.restore(s1)
    assert _jsonl_records(tmp_path) == ["a"]
    # recovering twice (crash during recovery) is fine: commit is idempotent
    w3 = _writer(tmp_path, attempt=2)
    w3.restore(s1)
    assert _jsonl_records(tmp_path) == ["a"]


def test_commit_idempotent_and_lost_output(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    w.write_batch([1])
    [handle] = w.snapshot_state(1)
    entry = w.decode_entry(handle)
    w.commit(entry)
    w.commit(entry)
    w.notify_checkpoint_complete(1)
    assert _jsonl_records(tmp_path) == [1]
    os.remove(tmp_path / handle["final"])
    with pytest.raises(LockgateError, match="lost") as e:
        w.commit(entry)
    assert handle["final"] in str(e.value)
    w2 = _writer(tmp_path, attempt=1)
    with pytest.raises(LockgateError, match=handle["final"]):
        w2.restore([handle])


def test_close_deletes_open_inprogress_file(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    w.write_batch([1])
    w.snapshot_state(1)
    w.write_batch([2])
    w.close()
    assert [n for n in _hidden(tmp_path) if n.endswith(".inprogress")] == []
    assert len(_hidden(tmp_path)) == 1  # the pending file is kept for recovery


def test_rescale_down_commits_all_and_cleans_up(tmp_path: Path) -> None:
    union: list[dict[str, Any]] = []
    writers = [_writer(tmp_path, task_index=t, parallelism=4) for t in range(4)]
    for t, w in enumerate(writers):
        w.restore([])
        w.write_batch([t])
        union += w.snapshot_state(1)
        w.write_batch([t + 100])  # uncommitted, in progress
    for t in range(2):
        _writer(tmp_path, task_index=t, parallelism=2, attempt=1).restore(union)
    assert sorted(_jsonl_records(tmp_path)) == [0, 1, 2, 3]
    assert _hidden(tmp_path) == []


def test_new_job_never_overwrites_old_output(tmp_path: Path) -> None:
    for _ in range(2):  # two fresh jobs, both attempt 0, same folder and uid
        w = _writer(tmp_path)
        w.restore([])
        w.write_batch(["r"])
        w.snapshot_state(1)
        w.notify_checkpoint_complete(1)
    assert _jsonl_records(tmp_path) == ["r", "r"]


def test_parquet_readable_without_hidden_files(tmp_path: Path) -> None:
    w = _writer(tmp_path, "parquet")
    w.restore([])
    w.write_batch([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    assert _hidden(tmp_path) == []  # buffered until pre-commit
    w.snapshot_state(1)
    w.notify_checkpoint_complete(1)
    w.write_batch([{"k": "c", "v": 3}])
    w.snapshot_state(2)  # pending, not committed
    w.write_batch([{"k": "d", "v": 4}])
    assert len(_hidden(tmp_path)) == 1
    table = pq.read_table(str(tmp_path))
    assert sorted(table.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "v": 1},
        {"k": "b", "v": 2},
    ]
    w.close()


def test_parquet_non_dict_records_become_value_column(tmp_path: Path) -> None:
    w = _writer(tmp_path, "parquet")
    w.restore([])
    w.write_batch([1, 2, 3])
    w.snapshot_state(1)
    w.notify_checkpoint_complete(1)
    assert pq.read_table(str(tmp_path)).to_pylist() == [{"value": 1}, {"value": 2}, {"value": 3}]


def test_unserializable_record_names_the_fix(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.restore([])
    with pytest.raises(LockgateError, match="JSON"):
        w.write_batch([object()])


def test_unknown_format() -> None:
    with pytest.raises(LockgateError, match="format"):
        FileSink("/tmp/x", "avro")


def test_folder_is_created(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    _writer(out).restore([])
    assert out.is_dir()
    assert os.listdir(out) == []  # the probe file is gone


@pytest.mark.parametrize("entry", ["x", ["pending", "final"], 7, None])
def test_a_restored_entry_that_is_no_mapping_is_refused_by_the_two_phase_base(
        tmp_path: Path, entry: Any) -> None:
    """``check_handle`` gets mappings only: the two-phase-commit base refuses
    anything else first, and nothing in the folder is touched."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(LockgateError, match="is not a two-phase-commit handle"):
        _writer(tmp_path / "out").restore([entry])
    assert os.listdir(tmp_path / "out") == ["keep"]


def test_a_restored_handle_naming_other_files_is_refused(tmp_path: Path) -> None:
    final = final_name("other", 0, 0, 0, "jsonl")
    entry = {"pending": pending_name(final), "final": final, "checkpoint_id": 1,
             "task_index": 0}
    with pytest.raises(LockgateError, match="not this sink's part files"):
        _writer(tmp_path / "out").restore([entry])


def test_unwritable_folder_fails_at_restore(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        bad = blocker / "out"  # under a regular file: fails for root too
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        bad = locked / "out"
    w = _writer(bad)
    with pytest.raises(LockgateError) as e:
        w.restore([])
    assert str(bad) in str(e.value)
    assert "permission" in str(e.value)


def test_writable_check_catches_readonly_existing_folder(tmp_path: Path) -> None:
    """Root may write into a 0o500 folder, so as root the folder is made
    immutable (chattr +i), which stops root too."""
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(ro)], check=True)
    try:
        with pytest.raises(LockgateError, match="not writable") as e:
            _writer(ro).restore([])
        assert str(ro) in str(e.value)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ro)], check=True)


# ------------------------------------------------------------ CollectSink


@pytest.fixture
def serde(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the real StateSerializer if it exists; else a local msgpack stub."""
    try:
        import lockgate.state.serde  # noqa: F401
    except ImportError:
        import msgpack

        class StateSerializer:
            def __init__(self, allow_pickle: bool = False) -> None:
                pass

            def dumps(self, obj: Any) -> bytes:
                def default(o: Any) -> Any:
                    if isinstance(o, tuple):
                        return msgpack.ExtType(1, msgpack.packb(list(o), default=default))
                    raise TypeError(type(o))

                return msgpack.packb(obj, default=default, strict_types=True)

            def loads(self, data: bytes) -> Any:
                def ext(code: int, payload: bytes) -> Any:
                    return tuple(msgpack.unpackb(payload, ext_hook=ext))

                return msgpack.unpackb(data, ext_hook=ext)

        mod = types.ModuleType("lockgate.state.serde")
        mod.StateSerializer = StateSerializer  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "lockgate.state.serde", mod)


def test_collect_sink_exactly_once_roundtrip(tmp_path: Path, serde: None) -> None:
    from lockgate.connectors.collect import CollectSink

    sink = CollectSink(str(tmp_path / "c"))
    assert sink.exactly_once
    w = sink.create_writer(_info())
    w.restore([])
    w.write_batch([(1, "a"), {"k": [1, 2]}, 3, None, b"\x00"])
    s1 = w.snapshot_state(1)
    w.notify_checkpoint_complete(1)
    w.write_batch([(2, "b")])
    w.snapshot_state(2)
    assert sink.results() == [(1, "a"), {"k": [1, 2]}, 3, None, b"\x00"]
    # crash, restore checkpoint 1, replay
    w2 = sink.create_writer(_info(attempt=1))
    w2.restore(s1)
    w2.write_batch([(2, "b")])
    w2.snapshot_state(2)
    w2.notify_checkpoint_complete(2)
    assert sink.results() == [(1, "a"), {"k": [1, 2]}, 3, None, b"\x00", (2, "b")]


def test_collect_sink_temp_dir_and_numeric_order(serde: None) -> None:
    from lockgate.connectors.collect import CollectSink

    sink = CollectSink()
    assert sink.path is None and sink.results() == []  # no folder before the job starts
    sink.validate()
    assert sink.path is not None and os.path.isdir(sink.path)
    assert sink.results() == []
    w = sink.create_writer(_info())
    w.restore([])
    for cid in range(1, 13):
        w.write_batch([cid])
        w.snapshot_state(cid)
    w.notify_checkpoint_complete(12)
    assert sink.results() == list(range(1, 13))  # seq 10 sorts after seq 9
    sink.discard()
    assert not os.path.exists(sink.path)
