"""Snapshot chunks as splits of a CDC source (pure): the entries of a fresh
start, how a restore deals them out at any parallelism, the checks of
restored entries, the upgrade of the single-reader format, the stream's
watermarks and the announcements of committed chunks."""

from __future__ import annotations

import random

import pytest

from lockgate.connectors.cdc import take_chunk
from lockgate.connectors.cdc_splits import (
    announcement,
    check_entries,
    check_restored,
    chunk_done,
    deal,
    initial_entries,
    read_announcement,
    state_entries,
    stream_watermarks,
    upgrade_v1,
)
from lockgate.errors import CheckpointCorruptError, ConfigurationError

TABLES = ["public.a", "public.b"]


def fresh() -> list[dict]:
    return initial_entries(TABLES, {"public.a": [[10], [20]], "public.b": []}, [5, 0, 0],
                           slot="s")


def pos(value: object) -> list[int]:
    if not isinstance(value, list):
        raise CheckpointCorruptError("bad position")
    return value


def test_a_fresh_start_cuts_each_table_at_its_boundaries():
    stream, *chunks = fresh()
    assert stream == {"cdc": 2, "role": "stream", "slot": "s", "pos": [5, 0, 0], "hw": None,
                      "ended": False}
    assert [(c["id"], c["table"], c["lower"], c["upper"]) for c in chunks] == [
        (0, "public.a", None, [10]), (1, "public.a", [10], [20]), (2, "public.a", [20], None),
        (3, "public.b", None, None)]
    assert not any(chunk_done(c) for c in chunks)
    # no snapshot: the stream alone, every change emitted
    [only] = initial_entries(TABLES, None, [5, 0, 0])
    assert only["hw"] == {"public.a": [[None, 0]], "public.b": [[None, 0]]}


def test_every_chunk_goes_to_exactly_one_task_at_any_parallelism():
    rng = random.Random(4)
    for trial in range(200):
        bounds = sorted(rng.sample(range(1000), rng.randint(0, 12)))
        stream, *chunks = initial_entries(["t"], {"t": [[b] for b in bounds]}, [1, 0, 0])
        for c in chunks:  # some read (emitting or done), some not
            if rng.random() < 0.5:
                c["hw"] = rng.randint(2, 99)
                c["rows"] = [{"id": 1}] if rng.random() < 0.3 else []
        stream, chunks = check_entries([stream, *chunks], ["t"], "x", pos)
        p = rng.randint(1, 5)
        shares = [deal(stream, chunks, i, p) for i in range(p)]
        got = sorted(c["id"] for s in shares for c in s.chunks)
        assert got == list(range(len(chunks))), trial
        work = [sum(not chunk_done(c) for c in s.chunks) for s in shares]
        assert max(work) - min(work) <= 1, (trial, work)  # the work is spread evenly
        assert shares[0].stream is stream and all(s.stream is None for s in shares[1:])
        assert set(shares[0].layout) == set(got) and all(not s.layout for s in shares[1:])


def test_a_fresh_start_deals_chunks_by_number():
    stream, chunks = check_entries(fresh(), TABLES, "x", pos)
    assert [[c["id"] for c in deal(stream, chunks, i, 3).chunks] for i in range(3)] == [
        [0, 3], [1], [2]]


def test_once_the_stream_started_the_chunks_are_dropped():
    stream, *chunks = fresh()
    stream["hw"] = {"public.a": [[None, 7]], "public.b": [[None, 8]]}
    stream, restored = check_entries([stream, *chunks], TABLES, "x", pos)
    assert [deal(stream, restored, i, 2).chunks for i in range(2)] == [[], []]
    # a table named only later is not read (nor its chunks needed)
    check_entries([stream], [*TABLES, "public.c"], "x", pos)


def test_restored_entries_are_checked():
    entries = fresh()

    def bad(change, error=CheckpointCorruptError, match=""):
        copy = [dict(e) for e in entries]
        change(copy)
        with pytest.raises(error, match=match):
            check_entries(copy, TABLES, "the source", pos)

    bad(lambda es: es.pop(0), match="0 stream positions")
    bad(lambda es: es.append(dict(es[0])), match="2 stream positions")
    bad(lambda es: es.pop(2), match="do not cover")                      # a gap
    bad(lambda es: es[2].update(id=0), match="a chunk twice")
    bad(lambda es: es[2].update(lower=["10"]), match="do not cover")     # lower != upper before
    bad(lambda es: es[2].update(upper=[5]) or es[3].update(lower=[5]),
        match="do not cover")                                            # out of order
    bad(lambda es: es[1].update(rows=[{"id": 1}]), match="damaged")      # rows, never read
    bad(lambda es: es[1].update(hw=-1), match="damaged")
    bad(lambda es: es[1].update(rows="x", hw=3), match="damaged")
    bad(lambda es: es[0].update(pos="x"), match="bad position")
    bad(lambda es: es[0].update(hw={"public.a": [[[1], 3]]}), match="watermarks")
    bad(lambda es: es[4].update(table="public.c"), ConfigurationError, "tables changed")
    bad(lambda es: es[2].update(upper=["x"]) or es[3].update(lower=["x"]),
        match="do not cover")                                            # str vs int keys
    stream, chunks = check_entries(entries + [{"other": 1}, "junk"], TABLES, "x", pos)
    assert len(chunks) == 4


def test_the_stream_filters_with_every_chunks_watermark():
    stream, chunks = check_entries(fresh(), TABLES, "x", pos)
    layout = {c["id"]: c for c in chunks}
    marks = stream_watermarks(layout, {0: 40, 1: 30, 2: 50, 3: 45})
    assert marks == {"public.a": [[[10], 40], [[20], 30], [None, 50]],
                     "public.b": [[None, 45]]}


def test_announcements_count_only_for_their_run_and_attempt():
    layout = {0: {}, 1: {}, 2: {}}
    text = announcement("run1", 3, [{"id": 0, "hw": 40}, {"id": 2, "hw": 50}])
    assert read_announcement(text, "run1", 3, layout) == {0: 40, 2: 50}
    assert read_announcement(text, "run1", 4, layout) == {}   # an earlier attempt's
    assert read_announcement(text, "run2", 3, layout) == {}   # another run's
    assert read_announcement("not json", "run1", 3, layout) == {}
    assert read_announcement('{"run": "run1", "attempt": 3, "chunks": [[0, -1], [9, 4], '
                             '[1, "x"], 5, [2, 7]]}', "run1", 3, layout) == {2: 7}


def test_a_single_reader_checkpoint_is_upgraded():
    v1 = {"cdc": 1, "slot": "s", "tables": TABLES, "pos": [5, 0, 0], "table": 0,
          "lower": [20], "max": [30], "ended": False,
          "chunks": {"public.a": [[[10], 40], [[20], 41]]},
          "pending": [["public.a", {"id": 19}, 41, 1234]]}
    stream, chunks = check_entries([v1], TABLES, "x", pos)
    assert stream["hw"] is None and stream["slot"] == "s" and stream["pos"] == [5, 0, 0]
    assert [(c["table"], c["lower"], c["upper"], c["hw"], c["rows"]) for c in chunks] == [
        ("public.a", None, [10], 40, []), ("public.a", [10], [20], 41, [{"id": 19}]),
        ("public.a", [20], None, None, []), ("public.b", None, None, None, [])]
    assert chunks[1]["ms"] == 1234
    # in the stream: the watermarks as they were
    done = {**v1, "table": 2, "chunks": {"public.a": [[None, 40]], "public.b": [[None, 9]]},
            "pending": []}
    stream, chunks = check_entries([done], TABLES, "x", pos)
    assert stream["hw"] == done["chunks"] and chunks == []
    with pytest.raises(CheckpointCorruptError):
        upgrade_v1({"cdc": 1, "tables": TABLES, "table": "x", "chunks": {}})


def test_a_reader_takes_its_chunks_rows_and_snapshots_copies():
    """A fresh start (no entries of the source in the state) checks the
    initial entries; a chunk is read once, its rows taken a poll at a time,
    done once empty; the state holds copies the reader goes on changing."""
    stream, chunks = check_restored([{"other": 1}], fresh, TABLES, "test", pos)
    share = deal(stream, chunks, 0, 1)
    todo, done = share.todo(), share.done()
    assert [c["id"] for c in todo] == [0, 1, 2, 3] and done == []
    reads = []

    def read(chunk: dict) -> None:
        reads.append(chunk["id"])
        chunk["rows"], chunk["hw"], chunk["ms"] = [{"k": 1}, {"k": 2}, {"k": 3}], 9, 7

    first = take_chunk(todo, done, 2, read)
    assert [(e.op, e.table, e.after, e.lsn, e.commit_ms) for e in first] == [
        ("read", "public.a", {"k": 1}, 9, 7), ("read", "public.a", {"k": 2}, 9, 7)]
    state = state_entries(share.stream, todo, done)
    assert state[1]["rows"] == [{"k": 3}] and done == []
    state[0]["pos"].append(1)
    state[1]["rows"][0]["k"] = 0
    assert share.stream is not None and share.stream["pos"] == [5, 0, 0]
    assert [e.after for e in take_chunk(todo, done, 2, read)] == [{"k": 3}]
    assert reads == [0] and [c["id"] for c in done] == [0] and chunk_done(done[0])
