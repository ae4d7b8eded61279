"""The heap keyed-state backend: semantics, snapshot isolation, rescaling."""

from __future__ import annotations

import io

import pytest

from lockgate.errors import LockgateError
from lockgate.state.backend import (
    HeapKeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTypeError,
    ValueStateDescriptor,
)
from lockgate.state.keygroups import key_group_for_key, key_group_range
from lockgate.state.serde import StateSerializer

M = 16
VALUE = ValueStateDescriptor("count", default=0)
LIST = ListStateDescriptor("seen")
MAP = MapStateDescriptor("attrs")


def backend(kg=range(M)) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(M, kg, StateSerializer())


def fill(b: HeapKeyedStateBackend, keys) -> None:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    for k in keys:
        b.current_key = k
        v.update(v.value() + 1)
        lst.add((k, "x"))
        m.put("k", k)


def contents(b: HeapKeyedStateBackend) -> dict:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    out = {}
    for k in sorted({k for t in ("count", "seen", "attrs") for k in b.raw(t)}, key=repr):
        b.current_key = k
        out[k] = (v.value(), lst.get(), m.items())
    return out


def write(b: HeapKeyedStateBackend) -> tuple[bytes, dict]:
    buf = io.BytesIO()
    handle = b.snapshot().write(buf)
    return buf.getvalue(), handle


def restore(data: bytes, handle: dict, kg: range) -> HeapKeyedStateBackend:
    b = backend(kg)
    for g, (off, n) in handle.key_groups.items():
        if g in kg:
            b.restore_block(data[off:off + n], handle.states)
    return b


def test_value_list_map_semantics():
    b = backend()
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    b.current_key = "a"
    assert v.value() == 0 and lst.get() == [] and m.is_empty()
    v.update(5)
    lst.add_all([1, 2])
    m.put_all({"x": 1, "y": 2})
    m.remove("x")
    assert (v.value(), lst.get(), m.items(), m.contains("y")) == (5, [1, 2], [("y", 2)], True)
    got = lst.get()
    got.append(99)  # a copy: the state does not change
    assert lst.get() == [1, 2]
    b.current_key = "b"
    assert v.value() == 0
    b.current_key = "a"
    v.update(None)
    lst.update([])
    m.remove("y")
    assert b.num_keys() == 0


def test_same_name_other_kind_is_refused():
    b = backend()
    b.get_state(VALUE)
    with pytest.raises(StateTypeError, match="'count'.*value.*list"):
        b.get_state(ListStateDescriptor("count"))


def test_snapshot_is_isolated_from_later_changes():
    b = backend()
    fill(b, range(20))
    snap = b.snapshot()
    fill(b, range(10))  # records keep flowing while the snapshot is written
    buf = io.BytesIO()
    handle = snap.write(buf)
    restored = restore(buf.getvalue(), handle, range(M))
    fresh = backend()
    fill(fresh, range(20))
    assert contents(restored) == contents(fresh)


def test_rescale_split_into_three_and_merge_back():
    b = backend()
    fill(b, list(range(100)) + ["a", "b", (1, 2)] + list(range(30)))
    data, handle = write(b)
    parts = [restore(data, handle, key_group_range(i, 3, M)) for i in range(3)]
    for i, part in enumerate(parts):
        for key in part.raw("count"):
            assert key_group_for_key(key, M) in key_group_range(i, 3, M)
    merged = backend()
    for part in parts:
        d, h = write(part)
        for off, n in h.key_groups.values():
            merged.restore_block(d[off:off + n], h.states)
    assert contents(merged) == contents(b)


def test_restored_kind_is_checked_at_registration():
    b = backend()
    fill(b, [1])
    data, handle = write(b)
    fresh = backend()
    for off, n in handle.key_groups.values():
        fresh.restore_block(data[off:off + n], handle.states)
    with pytest.raises(StateTypeError, match="'seen'.*list.*map"):
        fresh.get_state(MapStateDescriptor("seen"))


def test_block_outside_the_range_is_refused():
    b = backend()
    fill(b, range(50))
    data, handle = write(b)
    owned = key_group_range(0, 2, M)
    foreign = next(g for g in handle.key_groups if g not in owned)
    off, n = handle.key_groups[foreign]
    with pytest.raises(LockgateError, match="corrupt or misassigned"):
        backend(owned).restore_block(data[off:off + n], handle.states)
