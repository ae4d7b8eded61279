"""State TTL (lockgate/state/ttl.py, ttl_config.py) on both backends (heap
and RocksDB: every test that makes a backend runs on each), with an
injected clock: expiry of each state kind, update types, visibility, cleanup
on access, in snapshots and incrementally, value semantics, and the stored
form through a snapshot, a restore and a rescale."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest

from lockgate.errors import CheckpointCorruptError
from lockgate.state.backend import (
    KeyedBlocks,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTypeError,
    ValueStateDescriptor,
)
from lockgate.state.backends import (
    BackendScope,
    KeyedStateBackend,
    RocksDBStateBackend,
    close_backend,
)
from lockgate.state.factory import create_keyed_backend
from lockgate.state.keygroups import key_group_range
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl import TtlStates
from lockgate.state.ttl_config import (
    IncrementalCleanup,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
)

M = 16


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def ttl(clock: Clock, ms: int = 10, **kw) -> StateTtlConfig:
    kw.setdefault("cleanup_incrementally", None)
    return StateTtlConfig(ms, clock=clock, **kw)


BACKEND = "heap"
"""The backend ``setup`` makes: the autouse fixture ``backend`` sets it."""
_opened: list[KeyedStateBackend] = []


@pytest.fixture(autouse=True, params=["heap", "rocksdb"])
def backend(request, tmp_path):
    global BACKEND, _ROCKSDB
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    BACKEND = request.param
    _ROCKSDB = RocksDBStateBackend(local_dir=str(tmp_path / "rocks"), memory_mb=16,
                                   incremental=False)
    yield request.param
    while _opened:
        close_backend(_opened.pop())


_ROCKSDB: RocksDBStateBackend | None = None


def setup(kg: range = range(M)) -> tuple[KeyedStateBackend, TtlStates]:
    if BACKEND == "heap":
        b = create_keyed_backend(None, M, kg, StateSerializer())
    else:
        n = len(_opened)
        b = create_keyed_backend(_ROCKSDB, M, kg, StateSerializer(),
                                 BackendScope("job", f"op{n}", n, 0, "/nonexistent"))
    _opened.append(b)
    return b, TtlStates(b)


def keys(b: KeyedStateBackend, name: str) -> set:
    """The keys state ``name`` holds a value of (expired or not)."""
    return set(b.state_keys(name))


def write(b: KeyedStateBackend) -> tuple[bytes, KeyedBlocks]:
    buf = io.BytesIO()
    blocks = b.snapshot().write(buf)
    return buf.getvalue(), blocks


def restore_into(b: KeyedStateBackend, data: bytes, blocks: KeyedBlocks) -> None:
    for g, (off, n) in blocks.key_groups.items():
        if g in b.key_group_range:
            b.restore_block(data[off:off + n], blocks.states)


# ------------------------------------------------------------------ config


def test_config_takes_ms_or_timedelta_and_refuses_nonsense():
    assert StateTtlConfig(timedelta(seconds=2)).ttl_ms == 2000
    assert StateTtlConfig(5).ttl_ms == 5
    for bad in (0, -1, 1.5, timedelta(0), "10"):
        with pytest.raises(ValueError, match="ttl must be"):
            StateTtlConfig(bad)
    with pytest.raises(ValueError):
        IncrementalCleanup(0)
    assert StateTtlConfig(5, update_type="on_read_and_write").update_type is \
        UpdateType.ON_READ_AND_WRITE


def test_wall_clock_by_default():
    import time
    assert abs(StateTtlConfig(5).now() - time.time() * 1000) < 5000


# ------------------------------------------------------------------ value state


def test_value_expires_and_is_removed_on_read():
    clock = Clock()
    b, states = setup()
    s = states.get_state(ValueStateDescriptor("v", default=-1, ttl=ttl(clock)))
    b.current_key = "a"
    s.update(7)
    clock.now = 9
    assert s.value() == 7
    clock.now = 10  # ts + ttl <= now: expired
    assert "a" in keys(b, "v")
    assert s.value() == -1
    assert "a" not in keys(b, "v")  # cleanup on access


@pytest.mark.parametrize("update_type,alive_at_14", [
    (UpdateType.ON_CREATE_AND_WRITE, False), (UpdateType.ON_READ_AND_WRITE, True)])
def test_update_types(update_type, alive_at_14):
    clock = Clock()
    b, states = setup()
    s = states.get_state(ValueStateDescriptor("v", ttl=ttl(clock, update_type=update_type)))
    b.current_key = "a"
    s.update(1)
    clock.now = 5
    assert s.value() == 1  # a read: renews the timestamp with ON_READ_AND_WRITE only
    clock.now = 14
    assert (s.value() == 1) is alive_at_14
    clock.now = 30
    assert s.value() is None


def test_return_expired_if_not_cleaned_up_returns_it_once():
    clock = Clock()
    b, states = setup()
    cfg = ttl(clock, state_visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)
    s = states.get_state(ValueStateDescriptor("v", default=0, ttl=cfg))
    lst = states.get_state(ListStateDescriptor("l", ttl=cfg))
    b.current_key = "a"
    s.update(3)
    lst.add("x")
    clock.now = 50
    assert s.value() == 3 and lst.get() == ["x"]
    assert s.value() == 0 and lst.get() == []


def test_value_semantics_are_kept():
    clock = Clock()
    b, states = setup()
    s = states.get_state(ValueStateDescriptor("v", default=[], ttl=ttl(clock)))
    b.current_key = "a"
    d = s.value()
    d.append(1)
    assert s.value() == []  # the mutable default is copied
    acc = {"n": [1]}
    s.update(acc)
    acc["n"].append(2)  # after update: the state keeps what it was given
    got = s.value()
    assert got == {"n": [1]}
    got["n"].append(3)  # a copy out
    assert s.value() == {"n": [1]}
    snap = b.snapshot()
    s.update({"n": [9]})
    data = io.BytesIO()
    blocks = snap.write(data)
    b2, states2 = setup()
    restore_into(b2, data.getvalue(), blocks)
    b2.current_key = "a"
    assert states2.get_state(ValueStateDescriptor("v", ttl=ttl(clock))).value() == {"n": [1]}


# ------------------------------------------------------------------ list state


def test_list_elements_expire_each_on_its_own():
    clock = Clock()
    b, states = setup()
    lst = states.get_state(ListStateDescriptor("l", ttl=ttl(clock)))
    b.current_key = "a"
    lst.add("old")
    clock.now = 5
    lst.add_all(["new", {"m": 1}])
    clock.now = 12
    got = lst.get()
    assert got == ["new", {"m": 1}]
    got[1]["m"] = 2
    assert lst.get() == ["new", {"m": 1}]
    assert len(b.raw("l")["a"]) == 2  # the expired element was removed on access
    clock.now = 15
    assert lst.get() == []
    assert "a" not in keys(b, "l")
    lst.update([1, 2])
    clock.now = 24
    assert lst.get() == [1, 2]


def test_list_on_read_and_write_renews_every_element_read():
    clock = Clock()
    b, states = setup()
    lst = states.get_state(ListStateDescriptor(
        "l", ttl=ttl(clock, update_type=UpdateType.ON_READ_AND_WRITE)))
    b.current_key = "a"
    lst.add(1)
    clock.now = 8
    assert lst.get() == [1]
    clock.now = 17
    assert lst.get() == [1]


# ------------------------------------------------------------------ map state


def test_map_entries_expire_each_on_their_own():
    clock = Clock()
    b, states = setup()
    m = states.get_state(MapStateDescriptor("m", ttl=ttl(clock)))
    b.current_key = "a"
    m.put("old", 1)
    clock.now = 5
    m.put_all({"new": [2], "other": 3})
    clock.now = 10
    assert not m.contains("old")
    assert m.get("old", "none") == "none"
    assert m.keys() == ["new", "other"] and list(m) == ["new", "other"]
    assert m.values() == [[2], 3]
    assert m.items() == [("new", [2]), ("other", 3)]
    m.get("new").append(5)
    assert m.get("new") == [2]
    assert set(b.raw("m")["a"]) == {"new", "other"}
    assert not m.is_empty()
    m.remove("other")
    clock.now = 15
    assert m.is_empty()
    assert "a" not in keys(b, "m")


def test_map_on_read_and_write_renews_entries_read():
    clock = Clock()
    b, states = setup()
    m = states.get_state(MapStateDescriptor(
        "m", ttl=ttl(clock, update_type=UpdateType.ON_READ_AND_WRITE)))
    b.current_key = "a"
    m.put_all({"x": 1, "y": 2})
    clock.now = 8
    assert m.contains("x")  # a read of x only
    clock.now = 12
    assert m.items() == [("x", 1)]


# ------------------------------------------------------------------ cleanup


def test_snapshot_leaves_expired_entries_out():
    clock = Clock()
    b, states = setup()
    v = states.get_state(ValueStateDescriptor("v", ttl=ttl(clock)))
    lst = states.get_state(ListStateDescriptor("l", ttl=ttl(clock)))
    m = states.get_state(MapStateDescriptor("m", ttl=ttl(clock)))
    plain = states.get_state(ValueStateDescriptor("plain"))
    for k in range(20):
        b.current_key = k
        clock.now = k
        v.update(k)
        lst.add(k)
        m.put("k", k)
        plain.update(k)
    b.current_key = 19
    lst.add("late")  # at 19: the list of key 19 keeps both
    clock.now = 25  # keys 0..15 expired
    data, blocks = write(b)
    assert blocks.states == {"v": "value+ttl", "l": "list+ttl", "m": "map+ttl",
                             "plain": "value"}
    stored: dict[str, dict] = {}
    for off, n in blocks.key_groups.values():
        _, content = StateSerializer().loads(data[off:off + n])
        for name, entries in content.items():
            stored.setdefault(name, {}).update({k: val for k, val in entries})
    assert set(stored["v"]) == set(stored["l"]) == set(stored["m"]) == set(range(16, 20))
    assert set(stored["plain"]) == set(range(20))
    assert stored["v"][17] == (17, 17)
    assert stored["l"][19] == [(19, 19), ("late", 19)]
    assert stored["m"][18] == {"k": (18, 18)}
    assert len(keys(b, "v")) == 20  # the live state is untouched by a snapshot


def test_snapshot_cleanup_can_be_turned_off():
    clock = Clock()
    b, states = setup()
    v = states.get_state(ValueStateDescriptor("v", ttl=ttl(clock, cleanup_full_snapshot=False)))
    b.current_key = 1
    v.update(1)
    clock.now = 100
    _, blocks = write(b)
    assert blocks.key_groups


def test_incremental_cleanup_on_access_visits_every_key():
    clock = Clock()
    b, states = setup()
    cfg = ttl(clock, cleanup_incrementally=IncrementalCleanup(5))
    v = states.get_state(ValueStateDescriptor("v", ttl=cfg))
    m = states.get_state(MapStateDescriptor("m", ttl=cfg))
    for k in range(100):
        b.current_key = k
        v.update(k)
        m.put(k, k)
    clock.now = 50
    b.current_key = "hot"
    # 5 keys per access (checked every ACCESS_BATCH accesses): the round the
    # filling began, then a whole round of the 101 keys, in 48 accesses
    for _ in range(48):
        v.update(1)
        assert b.current_key == "hot"  # the cleanup leaves the current key alone
    assert keys(b, "v") == {"hot"}
    assert len(keys(b, "m")) == 100  # another state: its own round, on its own accesses
    for _ in range(48):
        m.get(0)
    assert keys(b, "m") == set()


def test_incremental_cleanup_for_every_record():
    clock = Clock()
    b, states = setup()
    lst = states.get_state(ListStateDescriptor(
        "l", ttl=ttl(clock, cleanup_incrementally=IncrementalCleanup(2, True))))
    other = states.get_state(ListStateDescriptor(
        "o", ttl=ttl(clock, cleanup_incrementally=IncrementalCleanup(2))))
    assert states.per_record
    for k in range(10):
        b.current_key = k
        clock.now = k
        lst.add(k)
        other.add(k)
    clock.now = 15  # keys 0..5 expired
    b.current_key = "x"
    states.records_processed(5)  # 10 keys checked
    assert keys(b, "l") == set(range(6, 10))
    assert len(keys(b, "o")) == 10  # no per-record cleanup for this one
    assert b.current_key == "x"


def test_no_incremental_cleanup_when_none():
    clock = Clock()
    b, states = setup()
    v = states.get_state(ValueStateDescriptor("v", ttl=ttl(clock)))
    for k in range(10):
        b.current_key = k
        v.update(k)
    clock.now = 100
    b.current_key = "x"
    for _ in range(20):
        v.value()
    assert len(keys(b, "v")) == 10
    assert not states.per_record


# ------------------------------------------------------------------ restore


def test_stored_form_survives_restore_and_rescale():
    """Written by one task at parallelism 1, restored into two tasks owning
    half the key groups each: timestamps come along, so expiry goes on."""
    clock = Clock()
    b, states = setup()
    v = states.get_state(ValueStateDescriptor("v", ttl=ttl(clock)))
    lst = states.get_state(ListStateDescriptor("l", ttl=ttl(clock)))
    for k in range(40):
        b.current_key = k
        clock.now = k % 2 * 5  # even keys at 0, odd keys at 5
        v.update(("val", k))
        lst.add(k)
    clock.now = 7
    data, blocks = write(b)
    halves = [setup(key_group_range(i, 2, M)) for i in range(2)]
    for hb, _ in halves:
        restore_into(hb, data, blocks)
    clock.now = 12  # even keys expired, odd alive
    seen = {}
    for hb, hs in halves:
        hv = hs.get_state(ValueStateDescriptor("v", ttl=ttl(clock)))
        hl = hs.get_state(ListStateDescriptor("l", ttl=ttl(clock)))
        for k in hb.state_keys("v"):
            hb.current_key = k
            seen[k] = (hv.value(), hl.get())
    assert sorted(seen) == list(range(40))
    assert all(seen[k] == ((None, []) if k % 2 == 0 else (("val", k), [k])) for k in seen)


@pytest.mark.parametrize("register_first", [True, False])
def test_turning_ttl_on_or_off_for_a_state_is_refused(register_first):
    clock = Clock()
    plain_b, plain = setup()
    plain.get_state(ValueStateDescriptor("seen"))
    plain_b.current_key = 1
    plain.get_state(ValueStateDescriptor("seen")).update(1)
    data, blocks = write(plain_b)
    b, states = setup()
    with pytest.raises(StateTypeError) as e:
        if register_first:  # in open(), before the restore
            states.get_state(ValueStateDescriptor("seen", ttl=ttl(clock)))
            restore_into(b, data, blocks)
        else:
            restore_into(b, data, blocks)
            states.get_state(ValueStateDescriptor("seen", ttl=ttl(clock)))
    msg = str(e.value)
    assert "'seen'" in msg and "without TTL" in msg and "turned on" in msg
    assert "new state name" in msg

    ttl_b, ttl_states = setup()
    ttl_b.current_key = 1
    ttl_states.get_state(ListStateDescriptor("l", ttl=ttl(clock))).add(1)
    data, blocks = write(ttl_b)
    b, states = setup()
    restore_into(b, data, blocks)
    with pytest.raises(StateTypeError, match="'l' was stored with TTL.*turned off"):
        states.get_state(ListStateDescriptor("l"))
    # a changed duration is fine
    b.current_key = 1
    assert states.get_state(ListStateDescriptor("l", ttl=ttl(clock, 99))).get() == [1]


def test_a_crafted_stored_form_is_named():
    clock = Clock()
    b, states = setup()
    plain = b.get_state(ValueStateDescriptor("v", ttl=ttl(clock)))  # the raw stored form
    b.current_key = 1
    plain.update("not a pair")
    with pytest.raises(CheckpointCorruptError, match="TTL state 'v'"):
        states.get_state(ValueStateDescriptor("v", ttl=ttl(clock))).value()


def test_expiry_filter_keeps_the_object_when_nothing_expired():
    from lockgate.state.ttl_config import expiry_filter

    lst, m, pair = [(1, 5), (2, 9)], {"a": (1, 5), "b": (2, 9)}, (1, 9)
    assert expiry_filter("list", 10, 14)(lst) is lst
    assert expiry_filter("list", 10, 15)(lst) == [(2, 9)] and lst == [(1, 5), (2, 9)]
    assert expiry_filter("list", 10, 19)(lst) is None
    assert expiry_filter("map", 10, 14)(m) is m
    assert expiry_filter("map", 10, 15)(m) == {"b": (2, 9)} and len(m) == 2
    assert expiry_filter("value", 10, 18)(pair) is pair
    assert expiry_filter("value", 10, 19)(pair) is None
    assert expiry_filter("value", 10, 19)("crafted") == "crafted"  # judged by a read
