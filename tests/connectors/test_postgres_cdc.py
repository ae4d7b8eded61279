"""``PostgresCdcSource`` against a real server with ``wal_level=logical`` (a
throwaway cluster, or ``LOCKGATE_TEST_POSTGRES_LOGICAL``): the snapshot in
chunks and the stream while a writer inserts, updates and deletes; restores
and rescales from the reader's state; the errors that name a fix; and the
job under SIGKILLs (random moments, after a snapshot chunk, after a
checkpoint completed but before the slot advanced) on both launchers.

The table is ``(id bigint primary key, v int, name text)``: ``v`` counts the
updates of a row, so the change events of a row must carry each of its
versions exactly once (a double application or a lost change shows as a
repeated or missing version), and applying them gives the table row for row.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.connectors import CollectSink
from lockgate.connectors.postgres_cdc import PostgresCdcSource
from lockgate.errors import ConfigurationError, LockgateError
from tests.connectors import cdc_checks
from tests.connectors.cdc_checks import Stopper, await_stream, info, read, rescale_job, stream_entry
from tests.connectors.postgres_server import execute, query
from tests.fault.checks import drive

JOB = Path(__file__).parent / "cdc_job.py"
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
STOP = "lockgate-test-stop"


@pytest.fixture
def names(postgres_logical) -> Iterator[tuple[str, str]]:
    """A table (filled with ``id 1..N``, version 0) and a slot name of this
    test's own; both dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    table, slot = f"cdc_{tag}", f"lg_{tag}"
    execute(postgres_logical, f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL, "
                              "name text)")
    yield table, slot
    execute(postgres_logical,
            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{slot}'",
            f"DROP PUBLICATION IF EXISTS {slot}", f"DROP TABLE IF EXISTS {table}")


def fill(dsn: str, table: str, n: int) -> None:
    execute(dsn, f"INSERT INTO {table} SELECT i, 0, 'row ' || i FROM generate_series(1, {n}) i")


class Writer(cdc_checks.Writer):
    """The writer on PostgreSQL; it ends with the stop message."""

    def __init__(self, dsn: str, table: str, next_id: int, seed: int) -> None:
        super().__init__(table, next_id, seed)
        self.dsn = dsn

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def transaction(self, conn: Any) -> Any:
        return conn.transaction()

    def execute(self, conn: Any, sql: str, params: tuple = ()) -> None:
        conn.execute(sql, params)

    def finish(self, conn: Any) -> None:
        conn.execute(f"SELECT pg_logical_emit_message(true, '{STOP}', '')")


def check(events: list[tuple], dsn: str, table: str) -> None:
    cdc_checks.check(events, query(dsn, f"SELECT id, v, name FROM {table}"))


def test_snapshot_and_stream_under_a_writer_spread_restored_and_rescaled(postgres_logical,
                                                                          names):
    """Chunks spread over the tasks and read while a writer runs; the state
    restored after a failure at a lower parallelism in the middle of the
    snapshot, at a higher one to the stream, and rescaled in the stream:
    every version of every row once, the result equal to the table."""
    dsn = postgres_logical
    table, slot = names
    fill(dsn, table, 3000)
    source = PostgresCdcSource(dsn, [table], slot=slot, chunk_rows=150, stop_message=STOP)
    source.validate()
    source.prepare("", "cdc")

    def tasks_read(events: list[tuple]) -> set[int]:
        return {task for op, *_, task in events if op == "read"}

    with Writer(dsn, table, 3001, seed=3).running() as writer:
        # p=3, in the snapshot; a failure loses what came after the last checkpoint
        events, state, _ = read(source, None, 3, rounds=5, final_checkpoint=False)
        assert tasks_read(events) == {0, 1, 2}
        # the next attempt restores it at p=2, still in the snapshot
        more, state, _ = read(source, state, 2, rounds=4, attempt=1)
        events += more
        assert tasks_read(more) == {0, 1}
        assert stream_entry(state)["hw"] is None, "the snapshot ended too early"
        assert sum(e["hw"] is None for e in state if e.get("role") == "chunk") >= 3
        # another run (the driver prepares anew) from that state at p=3, to the stream
        source.prepare("", "cdc")
        more, state, _ = read(source, state, 3, rounds=20, to_stream=True)
        events += more
        assert tasks_read(more) == {0, 1, 2}
        assert stream_entry(state)["hw"] is not None, "the stream did not start"
        assert any(op != "read" for op, *_ in more)
        # in the stream, rescaled to 2
        more, state, _ = read(source, state, 2, rounds=30, attempt=1)
        events += more
        assert [e for e in state if e.get("role") == "chunk"] == []
    more, state, ended = read(source, state, 1, attempt=2)
    events += more
    assert ended
    assert writer.ops > 20
    check(events, dsn, table)


def test_the_stream_waits_for_every_chunk_in_a_completed_checkpoint(postgres_logical, names):
    """Task 1 takes its part of a checkpoint, then reads its chunk; task 0,
    done with its own, must not start the stream before the chunk is in a
    completed checkpoint: restored from that checkpoint, the chunk is read
    again, and its rows come once."""
    dsn = postgres_logical
    table, slot = names
    fill(dsn, table, 200)
    source = PostgresCdcSource(dsn, [table], slot=slot, chunk_rows=100, stop_message=STOP)
    source.prepare("", "cdc")  # chunks: ids 1-100 (task 0), 101-200 (task 1), above (task 0)
    execute(dsn, f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
    t0, t1 = (source.create_reader(info(i, 2)) for i in range(2))
    t0.restore(None)
    t1.restore(None)
    ids: list[int] = []

    def drain(reader: Any) -> None:
        while batch := reader.poll(100):
            ids.extend(e.after["id"] for e in batch)

    drain(t0)
    state = t1.snapshot_state(1)   # task 1's part of checkpoint 1, its chunk unread
    drain(t1)                      # ... then it reads its chunk
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # task 0 waits (and looks for announcements)
        assert t0.poll(100) == [], "the stream started before task 1's chunk was committed"
        time.sleep(0.05)
    state += t0.snapshot_state(1)  # task 0's part, after task 1 read its chunk
    committed = [i for i in ids if i <= 100]  # what came before each task's barrier
    for reader in (t0, t1):
        reader.notify_checkpoint_complete(1)
        reader.close()
    assert stream_entry(state)["hw"] is None
    more, _, ended = read(source, state, 2, attempt=1)
    assert ended
    assert sorted(committed + [rid for op, rid, *_ in more if op == "read"]) == list(
        range(1, 201))


def test_a_column_added_is_carried(postgres_logical, names):
    dsn = postgres_logical
    table, slot = names
    fill(dsn, table, 10)
    source = PostgresCdcSource(dsn, table, slot=slot, stop_message=STOP)
    source.prepare("", "cdc")
    reader = source.create_reader(info(0, 1))
    reader.restore(None)
    got = reader.poll(50) or []
    execute(dsn, f"ALTER TABLE {table} ADD COLUMN note text",
            f"INSERT INTO {table} VALUES (11, 0, 'x', 'added')",
            f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
    while (batch := reader.poll(50)) is not None:
        got += batch
    reader.close()
    assert [e.after for e in got if e.op == "read"][0] == {"id": 1, "v": 0, "name": "row 1"}
    inserts = [e for e in got if e.op == "insert"]
    assert [e.after for e in inserts] == [{"id": 11, "v": 0, "name": "x", "note": "added"}]
    assert all(e.commit_ms > 1_600_000_000_000 for e in got)


TYPES = ("a smallint, b integer, c bigint, d real, e double precision, f boolean, "
         "g numeric(12, 4), h varchar(20), i char(4), j date, k timestamptz, l uuid, "
         "m jsonb, n bytea, o integer[], p text[], q interval, r inet, s oid, "
         "t lg_posint, u lg_flag")
VALUES = ("-7, 123456, 9007199254740993, 0.1, 1.0000000000000002, true, 3.1416, 'dü', "
          "'ab', '2024-02-29', '2024-02-29 12:34:56.789+01', "
          "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"x\": [1, 2.5]}', '\\x00ff10', "
          "'{1,NULL,3}', '{\"a b\",c}', '1 day 02:03:04', '10.1.2.3/32', 4242, 5, true")


def test_a_snapshot_row_equals_the_stream_row_of_the_same_values(postgres_logical):
    """Every type comes out of the snapshot (a SELECT) as out of the stream
    (pgoutput's text): integers, floats and booleans as Python values, the
    others (domains too) as PostgreSQL's text form; NULLs as None."""
    dsn = postgres_logical
    tag = uuid.uuid4().hex[:10]
    table, slot = f"cdc_types_{tag}", f"lg_{tag}"
    execute(dsn, "DO $$ BEGIN CREATE DOMAIN lg_posint AS integer CHECK (VALUE > 0); "
                 "CREATE DOMAIN lg_flag AS boolean; EXCEPTION WHEN duplicate_object THEN "
                 "NULL; END $$",
            f"CREATE TABLE {table} (id int PRIMARY KEY, {TYPES})",
            f"INSERT INTO {table} VALUES (1, {VALUES}), (2, {', '.join(['NULL'] * 21)})")
    try:
        source = PostgresCdcSource(dsn, table, slot=slot, stop_message=STOP)
        source.prepare("", "cdc")
        reader = source.create_reader(info(0, 1))
        reader.restore(None)
        got = reader.poll(50) or []
        execute(dsn, f"INSERT INTO {table} VALUES (3, {VALUES}), "
                     f"(4, {', '.join(['NULL'] * 21)})",
                f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
        while (batch := reader.poll(50)) is not None:
            got += batch
        reader.close()
    finally:
        execute(dsn, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     f"WHERE slot_name = '{slot}'",
                f"DROP PUBLICATION IF EXISTS {slot}", f"DROP TABLE IF EXISTS {table}")
    rows = {e.after["id"]: (e.op, {k: v for k, v in e.after.items() if k != "id"})
            for e in got if e.after is not None}
    assert [rows[i][0] for i in (1, 2, 3, 4)] == ["read", "read", "insert", "insert"]
    assert rows[1][1] == rows[3][1] and rows[2][1] == rows[4][1]
    row = rows[1][1]
    assert (row["a"], row["b"], row["c"], row["f"], row["s"]) == (-7, 123456,
                                                                   9007199254740993, True, 4242)
    assert row["d"] == 0.1 and row["e"] == 1.0000000000000002  # float4 read as its text
    assert (row["g"], row["h"], row["i"], row["j"]) == ("3.1416", "dü", "ab  ", "2024-02-29")
    assert (row["l"], row["n"], row["o"]) == ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                                              "\\x00ff10", "{1,NULL,3}")
    assert all(isinstance(row[k], str) for k in "kmpqr")
    assert (row["t"], row["u"]) == ("5", "t")  # domains: their text, as the log names them
    assert set(rows[2][1].values()) == {None}


def test_a_dropped_slot_and_a_lost_position_fail_with_the_fix(postgres_logical, names):
    dsn = postgres_logical
    table, slot = names
    fill(dsn, table, 5)
    source = PostgresCdcSource(dsn, table, slot=slot)
    source.prepare("", "cdc")
    _, state, _ = read(source, None, 1, rounds=3)
    execute(dsn, f"INSERT INTO {table} VALUES (6, 0, 'x')", "SELECT pg_switch_wal()")
    # the slot moves past the checkpoint's position (another reader of it)
    execute(dsn, f"SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())")
    with pytest.raises(LockgateError, match="past the position .* Restore the latest"):
        read(source, state, 1, rounds=1)
    execute(dsn, f"SELECT pg_drop_replication_slot('{slot}')")
    with pytest.raises(LockgateError, match="was dropped.*start the job fresh"):
        read(source, state, 1, rounds=1)


def test_settings_are_checked_at_start(postgres_dsn, postgres_logical, names):
    table, _slot = names
    wal = query(postgres_dsn, "SHOW wal_level")[0][0]
    if wal != "logical":
        with pytest.raises(ConfigurationError, match="wal_level=logical"):
            PostgresCdcSource(postgres_dsn, "t", slot="s").validate()
    execute(postgres_logical, f"CREATE TABLE {table}_nokey (a int)")
    try:
        with pytest.raises(ConfigurationError, match="no primary key"):
            PostgresCdcSource(postgres_logical, f"{table}_nokey", slot="s").validate()
    finally:
        execute(postgres_logical, f"DROP TABLE {table}_nokey")
    with pytest.raises(ConfigurationError, match="does not exist"):
        PostgresCdcSource(postgres_logical, "no_such_table", slot="s").validate()
    with pytest.raises(ConfigurationError, match="lower-case"):
        PostgresCdcSource(postgres_logical, table, slot="Bad-Slot")


def test_cdc_job_under_kills(tmp_path, postgres_logical, names, launcher):
    """The job reads the snapshot (its chunks spread over both tasks) and the
    stream while the writer runs; SIGKILLs after a snapshot chunk, after a
    checkpoint completed and before a task announced its chunks done or
    before the slot advanced (``commit``), and at random moments: the
    committed events are exactly once and equal the table."""
    dsn = postgres_logical
    table, slot = names
    n, chunk, p = (20_000 if SOAK else 3000), 500, 2
    fill(dsn, table, n)
    out = tmp_path / "out"
    faults = [{"point": "commit", "task": 1, "attempt": 1, "count": 2},
              {"point": "commit", "task": 0, "attempt": 2, "count": 4}]
    kills = 3 if SOAK else 1
    cmd = [sys.executable, str(JOB), "--dsn", dsn, "--table", table, "--slot", slot,
           "--out", str(out), "--storage", str(tmp_path / "chk"), "--parallelism", str(p),
           "--chunk", str(chunk), "--rate", "4000", "--faults", json.dumps(faults),
           "--kill-marker", str(tmp_path / "killed-after-chunk"), "--launcher", launcher]
    # the slot first (the job finds it): it holds every change of the writer
    PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")
    with Writer(dsn, table, n + 1, seed=7).running() as writer:
        # the writer goes on until the random kill landed and the job recovered
        # from it, and the job has committed changes of the stream
        stopper = Stopper(writer, after=25 if SOAK else 12, out=out, changes=20)
        result, done = drive(cmd, kills=kills, tasks=p, seed=5, kill_delays=(0.5, 2.0),
                             timeout=400, watcher=stopper)
    assert done == kills and result["status"] == "finished", result
    assert result["restarts"] >= 2, result["failures"]
    assert (tmp_path / "killed-after-chunk").exists()
    events = CollectSink(str(out)).results()
    assert sum(1 for e in events if e[0] == "read") >= n // 2
    assert sum(1 for e in events if e[0] != "read") >= 20
    assert {e[4] for e in events if e[0] == "read"} == {0, 1}
    check([tuple(e) for e in events], dsn, table)


def test_cdc_job_spreads_the_snapshot_chunks_over_its_tasks(tmp_path, postgres_logical, names):
    """At parallelism 3 every task reads snapshot chunks (at 2: the tests
    under kills), then task 0 the stream: every version of every row once,
    equal to the table."""
    dsn = postgres_logical
    table, slot = names
    n, chunk, p = 3000, 300, 3
    fill(dsn, table, n)
    out = tmp_path / "out"
    cmd = [sys.executable, str(JOB), "--dsn", dsn, "--table", table, "--slot", slot,
           "--out", str(out), "--storage", str(tmp_path / "chk"), "--parallelism", str(p),
           "--chunk", str(chunk), "--rate", "3000", "--launcher", "local"]
    PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")
    with Writer(dsn, table, n + 1, seed=11).running() as writer:
        stopper = Stopper(writer, after=3, out=out, changes=20)
        result, _ = drive(cmd, kills=0, tasks=p, seed=0, kill_delays=(1, 1), timeout=300,
                          watcher=stopper)
    assert result["status"] == "finished" and result["restarts"] == 0, result
    events = CollectSink(str(out)).results()
    reads: dict[int, list[int]] = {}
    for op, rid, _v, _name, task in events:
        if op == "read":
            reads.setdefault(task, []).append(rid)
    assert sorted(reads) == list(range(p)), sorted(reads)
    assert all(len(ids) >= chunk // 2 for ids in reads.values()), {
        task: len(ids) for task, ids in reads.items()}
    assert sum(1 for e in events if e[0] != "read") >= 20
    check([tuple(e) for e in events], dsn, table)


def _rescale_job(dsn: str, table: str, slot: str, p: int, tmp: Path, rate: float = 1500
                 ) -> Any:
    source = PostgresCdcSource(dsn, [table], slot=slot, chunk_rows=500, stop_message=STOP)
    return rescale_job("cdc-rescale", source, p, tmp, rate)


def test_cdc_job_rescaled_through_savepoints_in_the_snapshot_and_in_the_stream(
        tmp_path, postgres_logical, names):
    """Stopped with a savepoint in the middle of the snapshot at 2 tasks,
    resumed at 3 (the chunks left dealt over the three) and stopped again in
    the stream phase, resumed at 2 to the end, while the writer runs: every
    version of every row once, equal to the table."""
    from tests.fixtures import operator_state, start_and_await

    dsn = postgres_logical
    table, slot = names
    n = 6000
    fill(dsn, table, n)
    PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")

    def entries(savepoint: str) -> tuple[dict, list[dict]]:
        found = [e for task in operator_state(savepoint, "cdc") for e in task if e.get("cdc")]
        return stream_entry(found), [e for e in found if e["role"] == "chunk"]

    with Writer(dsn, table, n + 1, seed=9).running():
        # slowly (a chunk a second a task): stopped with most chunks still to read
        client = start_and_await(_rescale_job(dsn, table, slot, 2, tmp_path, rate=500),
                                 launcher="local", until=lambda pr: pr.records_read >= 600,
                                 timeout=240, what="the first hop read too little")
        first = client.stop(str(tmp_path / "savepoints"))
        assert first.status == "stopped", first
        stream, chunks = entries(first.savepoint)
        assert stream["hw"] is None, "not stopped in the snapshot"
        left = sum(c["hw"] is None for c in chunks)
        assert left >= 3, f"{left} of {len(chunks)} chunks left to read: too few to spread"
        client = start_and_await(_rescale_job(dsn, table, slot, 3, tmp_path), launcher="local",
                                 from_savepoint=first.savepoint)
        await_stream(tmp_path / "out", 3)  # committed: the stream runs
        second = client.stop(str(tmp_path / "savepoints"))
        assert second.status == "stopped", second
        stream, _ = entries(second.savepoint)
        assert stream["hw"] is not None, ("not stopped in the stream", stream["pos"])
    client = _rescale_job(dsn, table, slot, 2, tmp_path).start(
        launcher="local", from_savepoint=second.savepoint)
    result = client.result(timeout=240)
    assert result.status == "finished", result
    events = [tuple(e) for e in CollectSink(str(tmp_path / "out")).results()]
    assert {e[4] for e in events if e[0] == "read" and e[5] == 3} == {0, 1, 2}
    check(events, dsn, table)
