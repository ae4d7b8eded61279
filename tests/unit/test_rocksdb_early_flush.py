"""The RocksDB backend's early flush (lockgate/state/rocksdb/flush.py): when
it is due, that it moves no write across the checkpoint (everything before the
barrier is in it, nothing after), and that it can be turned off."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import pytest

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.runtime.keyed_state import restore_keyed, write_keyed
from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.rocksdb.flush import MIN_LEAD, POLL, EarlyFlush
from lockgate.state.serde import StateSerializer

pytest.importorskip("rocksdict")

M = 16
V = ValueStateDescriptor("v", default=0)
KEYS = [*range(12_000), *(f"k{i}" for i in range(2_000)), *((i, "t") for i in range(1_000))]
"""Enough keys that one round of updates fills more than the smallest
memtable an early flush takes (rocksdb_flush.MIN_MEMTABLE)."""


class Out:
    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def write(self, data: bytes) -> int:
        return self.buf.write(data)

    def tell(self) -> int:
        return self.buf.tell()


def rocks(tmp: Path, name: str, early_flush: bool = True):
    config = RocksDBStateBackend(local_dir=str(tmp / name), memory_mb=32,
                                 early_flush=early_flush, changelog=False)
    return create_keyed_backend(config, M, range(M), StateSerializer(),
                                BackendScope("job", "op", 0, 0, str(tmp / "job")))


def bump(b, keys) -> None:
    v = b.get_state(V)
    for k in keys:
        b.current_key = k
        v.update(v.value() + 1)


def level0(b) -> int:
    return int(b.db.property_int_value("rocksdb.num-files-at-level0") or 0)


def wait_for_level0(b, n: int) -> None:
    deadline = time.monotonic() + 10
    while level0(b) < n:
        assert time.monotonic() < deadline, f"no flush: {level0(b)} level-0 files"
        time.sleep(0.01)


def contents(b) -> dict:
    return dict(b.raw("v").items())


def learn_period(b, gap: float = 0.4) -> float:
    """Two snapshots ``gap`` apart: returns when the early flush is due."""
    b.snapshot()
    time.sleep(gap)
    # the time before the snapshot: the period counts from its start, and on a
    # loaded machine the snapshot itself can take longer than the lead
    now = time.monotonic()
    b.snapshot()
    wait = b.prepare_snapshot(now)
    assert 0 < wait < 10 * gap  # the period: the gap and the first snapshot's own time
    return now + wait


def test_the_early_flush_is_due_a_lead_before_the_expected_snapshot():
    e = EarlyFlush()
    e.snapshot_taken(10.0)
    assert e.due == math.inf  # one snapshot and no checkpoint interval: no period yet
    seeded = EarlyFlush()
    seeded.expect(3.0, 5.0)  # the task starts: the first checkpoint about 3 s later
    assert seeded.due == pytest.approx(8.0 - 0.45)  # 15% of the interval
    seeded.snapshot_taken(10.0)
    assert seeded.due == pytest.approx(13.0 - 0.45)
    e.snapshot_taken(12.0)
    assert e.due == pytest.approx(14.0 - 0.3)
    e.snapshot_taken(14.0)
    e.snapshot_taken(19.0)  # one late checkpoint does not move the median much
    assert e.due == pytest.approx(19.0 + 2.0 - 0.3)
    # then the lead follows what early flushes take: 1.5 times the median
    e.started(20.7)
    assert e.due == math.inf and e.running == 20.7
    e.finished(20.9)
    assert e.running is None
    e.snapshot_taken(21.0)
    assert e.due == pytest.approx(23.0 - 0.3)
    for took in (0.5, 0.6):  # a loaded machine: longer flushes, a longer lead
        e.started(0.0)
        e.finished(took)
    assert e.lead(2.0) == pytest.approx(0.75)
    assert e.lead(1.0) == 0.5  # at most half the period
    fast = EarlyFlush()
    fast.started(0.0)
    fast.finished(0.01)
    assert fast.lead(2.0) == pytest.approx(0.3)  # fast flushes: 15% of the period
    assert fast.lead(0.4) == MIN_LEAD
    fast.started(None)  # skipped: nothing to watch
    assert fast.running is None


def test_an_early_flush_moves_no_write_across_the_checkpoint(tmp_path):
    b = rocks(tmp_path, "a")
    bump(b, KEYS)
    due = learn_period(b)
    before = level0(b)
    bump(b, KEYS)  # every key twice now, in the memtable
    time.sleep(max(0.0, due - time.monotonic()))
    assert b.prepare_snapshot(time.monotonic()) == POLL  # started: watched until done
    wait_for_level0(b, before + 1)  # flushed in the background
    assert b.prepare_snapshot(time.monotonic()) == math.inf  # seen done; once per period
    assert b._early.running is None and b._early._took
    # after the early flush, before the barrier: updates of keys already
    # flushed, and deletions
    bump(b, KEYS[::3])
    v = b.get_state(V)
    for k in KEYS[1::7]:
        b.current_key = k
        v.clear()
    expected = contents(b)
    assert expected[0] == 3 and expected["k1"] == 2 and 1 not in expected
    out = Out()
    blocks, state = write_keyed(b.snapshot(), out, 3, savepoint=False)
    assert state is not None
    bump(b, KEYS)  # after the barrier: in no checkpoint
    assert contents(b)[0] == 4
    b.close()

    restored = rocks(tmp_path, "b")
    handle = StateHandle("op-0.state", len(out.buf.getvalue()), 0, 0, {}, blocks.states,
                         None, state)
    meta = OperatorMetadata(1, OperatorStateMode.SPLIT, [handle])
    restore_keyed(restored, meta, 0, 1, M, str(tmp_path / "job" / "chk-3"),
                  lambda h: out.buf.getvalue())
    restored.get_state(V)
    assert contents(restored) == expected
    restored.close()


def test_no_early_flush_when_turned_off(tmp_path):
    b = rocks(tmp_path, "a", early_flush=False)
    bump(b, KEYS)
    due = learn_period(b)
    before = level0(b)
    bump(b, KEYS)
    time.sleep(max(0.0, due - time.monotonic()))
    assert b.prepare_snapshot(time.monotonic()) == math.inf
    time.sleep(0.3)
    assert level0(b) == before
    assert int(b.db.property_int_value("rocksdb.num-entries-active-mem-table") or 0) > 0
    b.close()
