"""The RocksDB keyed state backend without processes: every state kind and
the raw views of the built-in operators, snapshots in both formats, restores
from either backend, incremental checkpoints restored and rescaled, shared
files cleaned up, crafted handles refused."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.errors import CheckpointCorruptError
from lockgate.runtime.keyed_state import restore_keyed, write_keyed
from lockgate.runtime.timers import KeyedTimers
from lockgate.state.backend import (
    HeapKeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTypeError,
    ValueStateDescriptor,
)
from lockgate.state.backends import BackendScope, RocksDBStateBackend, state_backend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.incremental import (
    SHARED_DIR,
    IncrementalState,
    delete_unreferenced,
    referenced_shared,
    shared_checkpoint_id,
    unreferenced,
)
from lockgate.state.keygroups import key_group_for_key, key_group_range
from lockgate.state.serde import StateSerializer

pytest.importorskip("rocksdict")

M = 16
V = ValueStateDescriptor("v", default=0)
L = ListStateDescriptor("l")
MP = MapStateDescriptor("m")


class Out:
    """A ``ChecksumWriter`` stand-in: bytes and ``tell``."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def write(self, data: bytes) -> int:
        return self.buf.write(data)

    def tell(self) -> int:
        return self.buf.tell()


def rocks(tmp: Path, kg: range = range(M), task: int = 0, attempt: int = 0,
          job: Path | None = None):
    config = RocksDBStateBackend(local_dir=str(tmp / "local"), memory_mb=32)
    return create_keyed_backend(config, M, kg, StateSerializer(), BackendScope(
        "job", "op", task, attempt, str(job or tmp / "job")))


def fill(b, keys) -> None:
    v, lst, m = b.get_state(V), b.get_state(L), b.get_state(MP)
    for k in keys:
        b.current_key = k
        v.update(v.value() + 1)
        lst.add(("x", k))
        m.put(k, {"n": [k]})
        m.put("z", 1)


def contents(b) -> dict:
    return {name: dict(b.raw(name).items()) for name in ("v", "l", "m")}


def blocks_of(b) -> tuple[bytes, dict, dict]:
    """A savepoint's keyed state (canonical)."""
    out = Out()
    blocks = b.snapshot(savepoint=True).write(out)  # as the task does for a savepoint's barrier
    return out.buf.getvalue(), blocks.key_groups, dict(blocks.states)


def restore_blocks(b, data: bytes, groups: dict, states: dict) -> None:
    for kg, (off, n) in groups.items():
        if kg in b.key_group_range:
            b.restore_block(data[off:off + n], states)


def test_every_state_kind_with_value_semantics(tmp_path):
    b = rocks(tmp_path)
    fill(b, [1, 2, 1, "a", (1, 2)])
    b.current_key = 1
    v, lst, m = b.get_state(V), b.get_state(L), b.get_state(MP)
    assert v.value() == 2 and lst.get() == [("x", 1), ("x", 1)]
    got = m.get(1)
    got["n"].append(99)  # a copy: the state does not change
    assert m.get(1) == {"n": [1]} and m.contains("z") and sorted(map(str, m.keys())) == ["1", "z"]
    m.remove("z")
    assert m.items() == [(1, {"n": [1]})] and not m.is_empty()
    v.update(None)
    lst.update([])
    m.clear()
    assert v.value() == 0 and lst.get() == [] and m.is_empty()
    b.current_key = (1, 2)
    assert v.value() == 1 and lst.get() == [("x", (1, 2))]
    with pytest.raises(StateTypeError):
        b.get_state(ListStateDescriptor("v"))
    b.close()
    assert os.listdir(tmp_path / "local") == []  # its folders are gone


def test_raw_views_write_back_objects_changed_in_place(tmp_path):
    b = rocks(tmp_path)
    b.get_state(MapStateDescriptor("_timers"))
    t = b.raw("_timers")
    t[5] = {10: None}
    t.get(5)[11] = None  # in place, as the timers do
    for k in range(5000):  # more than the live limit: written back meanwhile
        t.setdefault(100 + k, {})[k] = None
    del t.get(5)[10]
    b.flush()
    assert t.get(5) == {11: None} and t.get(4000 + 100) == {4000: None}
    assert 5 in t and 4 not in t
    del t[5]
    assert 5 not in t and len(t) == 5000
    b.get_state(ValueStateDescriptor("reduce"))
    r = b.raw("reduce")
    r["k"] = [1]
    r["k"].append(2)
    r[3] = 7
    assert r.get("missing", "d") == "d" and r.pop(3) == 7 and 3 not in r
    assert dict(r.items()) == {"k": [1, 2]}


def test_timers_run_on_rocksdb(tmp_path):
    b = rocks(tmp_path)
    timers = KeyedTimers(b)
    for k in range(20):
        b.current_key = k
        timers.register_event_time_timer(100 - k)
        timers.register_event_time_timer(200)
    b.current_key = 3
    timers.delete_event_time_timer(200)
    fired = list(timers.due(90))
    assert fired == [(k, 100 - k) for k in range(19, 9, -1)]
    assert len(list(timers.due(300))) == 10 + 19


@pytest.mark.parametrize("src,dst", [("heap", "rocksdb"), ("rocksdb", "heap"),
                                     ("rocksdb", "rocksdb")])
def test_canonical_snapshots_restore_on_either_backend_at_any_parallelism(tmp_path, src, dst):
    def make(kind: str, kg: range, task: int):
        if kind == "heap":
            return HeapKeyedStateBackend(M, kg, StateSerializer())
        return rocks(tmp_path / f"{kind}-{task}-{kg.start}", kg, task)

    a = make(src, range(M), 0)
    fill(a, range(200))
    expected = contents(a)
    data, groups, states = blocks_of(a)
    merged: dict = {"v": {}, "l": {}, "m": {}}
    for i in range(3):  # rescaled 1 -> 3
        b = make(dst, key_group_range(i, 3, M), i)
        restore_blocks(b, data, groups, states)
        for name, table in contents(b).items():
            assert all(key_group_for_key(k, M) in b.key_group_range for k in table)
            merged[name].update(table)
    assert merged == expected


def write_incremental(b, checkpoint_id: int) -> tuple[StateHandle, bytes]:
    out = Out()
    blocks, state = write_keyed(b.snapshot(), out, checkpoint_id, savepoint=False)
    assert state is not None and not blocks.key_groups
    data = out.buf.getvalue()
    return StateHandle(f"op-{b.scope.task_index}.state", len(data), 0, 0, {}, blocks.states,
                       None, state), data


def restore_incremental(b, handles: list[tuple[StateHandle, bytes]], restore_dir: Path,
                        index: int, p: int) -> None:
    data = {h.file: d for h, d in handles}
    meta = OperatorMetadata(len(handles), OperatorStateMode.SPLIT, [h for h, _ in handles])
    restore_keyed(b, meta, index, p, M, str(restore_dir), lambda h: data[h.file])


def test_incremental_checkpoints_upload_only_new_files_and_rescale(tmp_path):
    job, chk = tmp_path / "job", tmp_path / "job" / "chk-3"
    chk.mkdir(parents=True)
    tasks = [rocks(tmp_path, key_group_range(i, 2, M), i) for i in range(2)]
    expected: dict = {"v": {}, "l": {}, "m": {}}
    for b in tasks:
        mine = [k for k in range(400) if key_group_for_key(k, M) in b.key_group_range]
        fill(b, mine[: len(mine) // 2])
        first, _ = write_incremental(b, 1)
        fill(b, mine[len(mine) // 2:])
        second, _ = write_incremental(b, 2)
        # the files of the first are referenced, not uploaded again
        assert first.incremental is not None and second.incremental is not None
        reused = set(first.incremental.shared.values()) & set(second.incremental.shared.values())
        assert reused and all(shared_checkpoint_id(f.name) == 1 for f in reused)
        for name, table in contents(b).items():
            expected[name].update(table)
    handles = [write_incremental(b, 3) for b in tasks]
    for b in tasks:
        b.close()
    # the same parallelism (a failover), then 2 -> 3 and 2 -> 1
    for p in (2, 3, 1):
        merged: dict = {"v": {}, "l": {}, "m": {}}
        for i in range(p):
            b = rocks(tmp_path / f"p{p}", key_group_range(i, p, M), i, 1, job)
            restore_incremental(b, handles, chk, i, p)
            for name, table in contents(b).items():
                assert all(key_group_for_key(k, M) in b.key_group_range for k in table)
                merged[name].update(table)
            if p == 2:  # a failover in the same job: nothing uploaded again
                assert b.uploaded == dict(handles[i][0].incremental.shared)
            b.close()
        assert merged == expected, p
    # a heap backend restores the incremental checkpoint too (3 tasks)
    merged = {"v": {}, "l": {}, "m": {}}
    meta = OperatorMetadata(2, OperatorStateMode.SPLIT, [x for x, _ in handles])
    files = {x.file: d for x, d in handles}
    for i in range(3):
        h = HeapKeyedStateBackend(M, key_group_range(i, 3, M), StateSerializer())
        restore_keyed(h, meta, i, 3, M, str(chk), lambda x: files[x.file])
        for name, table in contents(h).items():
            merged[name].update(table)
    assert merged == expected
    assert referenced_shared([x.incremental for x, _ in handles]) <= set(
        os.listdir(job / SHARED_DIR))


def test_a_rescaled_restore_references_its_base_files_in_the_next_checkpoint(tmp_path):
    """2 -> 3 in the same job folder: each new task's base handle's files
    are the job's shared files already; its first checkpoint references
    them (nothing of the base uploaded again) and holds only its key groups
    (the clipped ones deleted by range tombstones): restored at 3 and again
    rescaled to 2 from those checkpoints, the state is exact."""
    job = tmp_path / "job"
    (job / "chk-1").mkdir(parents=True)
    (job / "chk-2").mkdir()
    old = [rocks(tmp_path / "a", key_group_range(i, 2, M), i, 0, job) for i in range(2)]
    expected: dict = {"v": {}, "l": {}, "m": {}}
    for b in old:
        fill(b, [k for k in range(400) if key_group_for_key(k, M) in b.key_group_range])
        for name, table in contents(b).items():
            expected[name].update(table)
    handles = [write_incremental(b, 1) for b in old]
    for b in old:
        b.close()
    rescaled = []
    for i in range(3):
        b = rocks(tmp_path / "b", key_group_range(i, 3, M), i, 1, job)
        restore_incremental(b, handles, job / "chk-1", i, 3)
        wanted = b.key_group_range
        base = max((h.incremental for h, _ in handles),
                   key=lambda s: min(s.key_groups[1], wanted.stop)
                   - max(s.key_groups[0], wanted.start))
        assert b.uploaded == dict(base.shared)
        b.current_key = next(k for k in range(10_000, 20_000)  # a write after the restore
                             if key_group_for_key(k, M) in wanted)
        b.get_state(V).update(7)
        expected["v"][b.current_key] = 7
        h, d = write_incremental(b, 2)
        referenced = set(h.incremental.shared.values()) & set(base.shared.values())
        assert referenced and all(shared_checkpoint_id(f.name) == 1 for f in referenced)
        rescaled.append((h, d))
        b.close()
    for p in (3, 2):
        merged: dict = {"v": {}, "l": {}, "m": {}}
        for i in range(p):
            b = rocks(tmp_path / f"c{p}", key_group_range(i, p, M), i, 2, job)
            restore_incremental(b, rescaled, job / "chk-2", i, p)
            for name, table in contents(b).items():
                assert all(key_group_for_key(k, M) in b.key_group_range for k in table)
                merged[name].update(table)
            b.close()
        assert merged == expected, p


def test_shared_files_go_only_when_no_retained_checkpoint_names_them(tmp_path, monkeypatch):
    from lockgate import fs

    job = tmp_path / "job"
    shared = job / SHARED_DIR
    shared.mkdir(parents=True)
    names = {n: f"op-0-c{n}-{n:016x}.sst" for n in range(1, 7)}
    for name in names.values():
        (shared / name).write_bytes(b"x")
    (shared / "unrelated.txt").write_bytes(b"")
    retained = {names[3], names[5]}  # checkpoints 5 and 6 name these; 6 is newest
    assert unreferenced(names.values(), retained, 5) == sorted(
        [names[1], names[2], names[4]])  # c6 may be in flight: kept
    # a crash in the middle of deleting: the first delete succeeds, then "crash"
    real = fs.remove
    calls = []

    def crashing(location):
        calls.append(location)
        if len(calls) > 1:
            raise KeyboardInterrupt("crash")
        real(location)

    monkeypatch.setattr(fs, "remove", crashing)
    with pytest.raises(KeyboardInterrupt):
        delete_unreferenced(str(job), retained, 5)
    monkeypatch.setattr(fs, "remove", real)
    left = set(os.listdir(shared))
    assert retained <= left  # nothing referenced was lost
    # the next clean-up (by listing, not by a count in memory) finishes the work
    delete_unreferenced(str(job), retained, 6)
    assert set(os.listdir(shared)) == retained | {"unrelated.txt"}


@pytest.mark.parametrize("bad", [
    {"private": {"../../etc/passwd": [0, 1]}},
    {"private": {"CURRENT": [0, -1]}},
    {"shared": {"000001.sst": ["../x-c1-0123456789abcdef.sst", 1]}},
    {"shared": {"000001.sst": ["not-a-shared-name.sst", 1]}},
    {"shared": {"MANIFEST": ["op-0-c1-0123456789abcdef.sst", 1]}},
    {"key_groups": [0, 999]},
    {"backend": "leveldb"},
    {"changelog": [["../op-0-c1-0123456789abcdef.sst", 1]]},
    {"changelog": [["op-0-c1-0123456789abcdef.sst", -1]]},
    {"changelog": {"a": 1}},
    {"changelog": [["op-0-c1-0123456789abcdef.sst", 1]] * 10_001},
])
def test_crafted_incremental_handles_are_refused(bad):
    good = {"backend": "rocksdb", "key_groups": [0, 16], "private": {"CURRENT": [0, 16]},
            "shared": {"000008.sst": ["op-0-c1-0123456789abcdef.sst", 10]}}
    assert IncrementalState.from_json(good, "h", M).size == 26
    with pytest.raises(CheckpointCorruptError):
        IncrementalState.from_json({**good, **bad}, "h", M)


def test_the_backend_is_chosen_by_name_object_or_environment(monkeypatch):
    assert state_backend("rocksdb") == RocksDBStateBackend()
    assert state_backend(None).name == "heap"
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "rocksdb")
    assert state_backend(None).name == "rocksdb"
    with pytest.raises(Exception, match="use 'heap'"):
        state_backend("leveldb")
