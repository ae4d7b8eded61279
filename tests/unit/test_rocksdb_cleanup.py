"""The RocksDB backend's hooks for TTL's incremental cleanup: the lazy,
resumable walk over a state's keys and ``filter_keys``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lockgate.state.backend import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.keygroups import key_group_for_key, key_group_range
from lockgate.state.serde import StateSerializer

pytest.importorskip("rocksdict")

from lockgate.state.rocksdb.cleanup import iter_keys

M = 16


def rocks(tmp: Path, kg: range = range(M)) -> Any:
    config = RocksDBStateBackend(local_dir=str(tmp / "local"), memory_mb=16)
    return create_keyed_backend(config, M, kg, StateSerializer(),
                                BackendScope("job", "op", 0, 0, str(tmp / "job")))


def test_walk_resumes_across_chunks_and_sees_only_the_tasks_key_groups(tmp_path):
    own = key_group_range(1, 2, M)
    b = rocks(tmp_path, own)
    v = b.get_state(ValueStateDescriptor("v", default=0))
    m = b.get_state(MapStateDescriptor("m"))
    other = b.get_state(ValueStateDescriptor("other", default=0))
    keys = [k for k in range(600)] + ["a", ("t", 1), -5, 2.5]
    for k in keys:
        b.current_key = k
        v.update(1)
        m.put("x", 1)
        m.put("y", 2)
        if k == 3:
            other.update(1)
    mine = [k for k in keys if key_group_for_key(k, M) in own]
    assert 0 < len(mine) < len(keys)
    # written back when the walk starts (a round's first chunk)
    for chunk in (1, 3, 7, 256):
        assert sorted(map(repr, iter_keys(b.raw("v"), chunk))) == sorted(map(repr, mine))
        assert sorted(map(repr, iter_keys(b.raw("m"), chunk))) == sorted(map(repr, mine))
    assert list(b.iter_state_keys("other")) == ([3] if 3 in mine else [])
    assert list(b.iter_state_keys("never")) == []
    # a walk goes on while the state changes under it: a key of a later
    # chunk (the last key group) cleared after the walk began never comes up
    walk = b.iter_state_keys("v")
    seen = [next(walk)]
    assert key_group_for_key(seen[0], M) == own[0]
    gone = next(k for k in mine if key_group_for_key(k, M) == own[-1])
    b.current_key = gone
    v.clear()
    seen.extend(walk)
    assert len(seen) == len(mine) - 1 and gone not in seen
    b.close()


def test_filter_keys_in_the_cache_and_in_the_database(tmp_path):
    b = rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", default=0))
    lst = b.get_state(ListStateDescriptor("l"))
    m = b.get_state(MapStateDescriptor("m"))
    for k in range(40):
        b.current_key = k
        v.update(k)
        lst.add_all([k, k + 1])
        m.put("a", k)
        m.put("b", -k)
    b.snapshot(savepoint=True).write(open(tmp_path / "s", "wb"))  # written back: in the database
    b.current_key = 1
    v.update(1001)  # in the cache again
    m.put("a", 1001)
    keys = list(range(40)) + ["absent"]

    def keep_value(x: int) -> int | None:
        return None if x % 2 else x

    b.filter_keys("v", keys, keep_value)
    b.filter_keys("l", keys, lambda xs: None if xs[0] % 3 == 0 else (xs if xs[0] % 3 == 1
                                                                     else xs[:1]))
    b.filter_keys("m", keys, lambda d: None if d["a"] % 2 else {"a": d["a"]})
    got = {}
    for k in range(40):
        b.current_key = k
        got[k] = (v.value(), lst.get(), m.items())
    for k in range(40):
        a = 1001 if k == 1 else k
        assert got[k][0] == (0 if a % 2 else a)
        assert got[k][1] == ([] if k % 3 == 0 else [k, k + 1] if k % 3 == 1 else [k])
        assert got[k][2] == ([] if a % 2 else [("a", a)])
    b.close()


def test_big_blocks_are_restored_by_ingestion(tmp_path, monkeypatch):
    import io

    from lockgate.state.rocksdb import backend as rocksdb

    a = rocks(tmp_path / "a")
    v = a.get_state(ValueStateDescriptor("v", default=0))
    lst = a.get_state(ListStateDescriptor("l"))
    m = a.get_state(MapStateDescriptor("m"))
    for k in range(300):
        a.current_key = k
        v.update(k)
        lst.add_all([k, "x"])
        m.put(k, {"n": k})
        m.put("z", 1)
    out = io.BytesIO()
    blocks = a.snapshot(savepoint=True).write(out)  # a savepoint's snapshot (canonical)
    data = out.getvalue()
    states = dict(blocks.states)

    def contents(b: Any) -> dict[str, Any]:
        return {name: sorted(b.raw(name).items(), key=repr) for name in ("v", "l", "m")}

    expected = contents(a)
    for threshold in (1, 10**9):  # every block ingested; none
        monkeypatch.setattr(rocksdb, "INGEST_MIN_ENTRIES", threshold)
        b = rocks(tmp_path / f"b{threshold}")
        old = b.get_state(ValueStateDescriptor("v", default=0))
        b.current_key = 7
        old.update(-1)
        b.flush()  # in the memtable, overwritten by the restore
        b.raw("v").live.clear()
        for off, n in blocks.key_groups.values():
            b.restore_block(data[off:off + n], states)
        assert contents(b) == expected
        assert not [f for f in (Path(b.folder)).iterdir() if f.suffix == ".sst"]
        b.close()
    a.close()
