"""SequenceSource splits dealt out again on a restore at any parallelism:
every task has work, and every number is read exactly once."""

from __future__ import annotations

import itertools

import pytest

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.sequence import SequenceSource
from lockgate.errors import LockgateError


def readers(source, parallelism, state=None):
    out = []
    for i in range(parallelism):
        r = source.create_reader(TaskInfo("j", "numbers", i, parallelism, 128, 0))
        r.restore(state)
        out.append(r)
    return out


def read(reader, polls, batch=7):
    got = []
    for _ in range(polls):
        b = reader.poll(batch)
        if b is None:
            break
        got += b
    return got


def union(rs):
    return [e for r in rs for e in r.snapshot_state(1)]


@pytest.mark.parametrize("end", [None, 1000])
def test_a_chain_of_rescales_reads_every_number_once(end):
    src = SequenceSource(1, end)
    seen: list[int] = []
    rs = readers(src, 2)
    for p in (1, 3, 4, 2, 5):
        for r in rs:
            seen += read(r, 5)
        rs = readers(src, p, union(rs))
        assert all(r.splits for r in rs) or end is not None, "a task got no split"
    for r in rs:
        seen += read(r, 1000 if end else 5)
    assert len(seen) == len(set(seen)), "a number was read twice"
    if end is not None:
        assert sorted(seen) == list(range(1, end + 1))
    else:
        # unbounded: every number is either read or ahead in exactly one split
        left = [s for r in rs for s in r.splits]
        for x in range(1, max(seen) + 100):
            ahead = sum(x >= s["next"] and (x - s["next"]) % s["step"] == 0 for s in left)
            assert (x in seen) + ahead == 1, x


def test_scaled_down_unbounded_reads_every_split():
    src = SequenceSource(1)
    two = readers(src, 2)
    for r in two:
        read(r, 1)
    (one,) = readers(src, 1, union(two))
    got = read(one, 4, batch=10)
    assert {x % 2 for x in got} == {0, 1}, "only the first split was read"


def test_scaled_up_every_task_reads():
    src = SequenceSource(1)
    two = readers(src, 2)
    for r in two:
        read(r, 1)
    three = readers(src, 3, union(two))
    assert all(read(r, 1) for r in three)
    nums = [x for r in three for x in read(r, 3)]
    assert len(nums) == len(set(nums))


def test_same_parallelism_keeps_each_tasks_own_splits():
    src = SequenceSource(1, 100)
    rs = readers(src, 3)
    for r in rs:
        read(r, 1)
    again = readers(src, 3, union(rs))
    assert [r.splits for r in again] == [r.splits for r in rs]


def test_a_checkpoint_without_owners_keeps_the_entries_given():
    src = SequenceSource(1, 100)
    (r,) = readers(src, 1, [{"split": 1, "next": 60, "end": 100, "step": 1}])
    assert read(r, 100, batch=100) == list(range(60, 101))


@pytest.mark.parametrize("entry", [
    {"split": 0, "next": "1", "end": None, "step": 1, "owner": 0, "of": 1},
    {"split": 0, "next": 1, "end": None, "step": 0, "owner": 0, "of": 1},
    "split 0",
])
def test_a_corrupt_entry_is_refused_by_name(entry):
    with pytest.raises(LockgateError, match="sequence source: restored state entry"):
        readers(SequenceSource(1), 1, [entry])


def test_pieces_cover_a_bounded_split_exactly():
    from lockgate.connectors.sequence import _pieces
    for count, n in itertools.product(range(0, 9), range(1, 5)):
        s = {"next": 10, "end": 10 + 3 * (count - 1), "step": 3}
        nums = [x for p in _pieces(s, n) for x in range(p["next"], p["end"] + 1, p["step"])]
        assert nums == list(range(10, 10 + 3 * count, 3))
