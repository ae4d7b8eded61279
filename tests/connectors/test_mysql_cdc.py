"""``MySqlCdcSource`` against a real MariaDB server with the binlog on (a
throwaway server, or ``LOCKGATE_TEST_MYSQL_BINLOG``): the snapshot in chunks
and the binlog stream while a writer inserts, updates and deletes, read by
GTID and by file and offset, with both ways of a consistent snapshot;
restores (also in the middle of a transaction) and rescales from the
reader's state; column types alike in the snapshot and the stream; a
column added; the errors that name a fix (a purged binlog, the server's
settings); the job under SIGKILLs (random moments, after a snapshot chunk,
after a checkpoint completed) on both launchers, and rescaled through
savepoints in the snapshot and in the stream.

The table is ``(id bigint primary key, v int, name varchar)``: ``v`` counts
the updates of a row, so the change events of a row must carry each of its
versions exactly once (a double application or a lost change shows as a
repeated or missing version), and applying them gives the table row for row.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
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
from lockgate.connectors.mysql_cdc import MySqlCdcSource
from lockgate.errors import ConfigurationError, LockgateError
from tests.connectors import cdc_checks
from tests.connectors.cdc_checks import Stopper, await_stream, info, read, rescale_job, stream_entry
from tests.connectors.mysql_server import connect, execute, query
from tests.fault.checks import drive

JOB = Path(__file__).parent / "cdc_job.py"
SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
DB = "lgtest"
MODES = {"gtid+snapshot_status": dict(gtid=True, snapshot_method="snapshot_status"),
         "file+lock_tables": dict(gtid=False, snapshot_method="lock_tables")}
_ids = iter(range(7000, 2**31))


def server_id() -> int:
    """A replica id of this test's own (a second reader with the same id
    would make the server drop the first)."""
    return next(_ids) + os.getpid() % 1000 * 1000


@pytest.fixture
def names(mysql_binlog) -> Iterator[tuple[str, str]]:
    """A table ``(id, v, name)`` and a stop table of this test's own
    (``database.name``); both dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    table, stop = f"{DB}.cdc_{tag}", f"{DB}.stop_{tag}"
    execute(mysql_binlog, f"CREATE DATABASE IF NOT EXISTS {DB}",
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL, name varchar(40)) "
            "ENGINE=InnoDB", f"CREATE TABLE {stop} (x int) ENGINE=InnoDB")
    yield table, stop
    execute(mysql_binlog, f"DROP TABLE IF EXISTS {table}", f"DROP TABLE IF EXISTS {stop}")


def fill(dsn: str, table: str, n: int) -> None:
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for lo in range(1, n + 1, 2000):
                cur.executemany(f"INSERT INTO {table} VALUES (%s, 0, %s)",
                                [(i, f"row {i}") for i in range(lo, min(n, lo + 1999) + 1)])
    finally:
        conn.close()


class Writer(cdc_checks.Writer):
    """The writer on MariaDB; it ends with a row in the stop table. At most
    200 transactions a second: mysql-replication decodes in Python, and the
    reader must keep up on a loaded machine for the job to end soon after
    the writer."""

    def __init__(self, dsn: str, table: str, stop: str, next_id: int, seed: int) -> None:
        super().__init__(table, next_id, seed, rate=200)
        self.dsn, self.stop_table = dsn, stop

    def connect(self) -> Any:
        return contextlib.closing(connect(self.dsn))

    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[None]:
        conn.begin()
        yield
        conn.commit()

    def execute(self, conn: Any, sql: str, params: tuple = ()) -> None:
        with conn.cursor() as cur:
            cur.execute(sql, params)

    def finish(self, conn: Any) -> None:
        self.execute(conn, f"INSERT INTO {self.stop_table} VALUES (1)")


def check(events: list[tuple], dsn: str, table: str) -> None:
    cdc_checks.check(events, query(dsn, f"SELECT id, v, name FROM {table}"))


@pytest.mark.parametrize("mode", MODES)
def test_snapshot_and_stream_under_a_writer_restored_and_rescaled(mysql_binlog, names, mode):
    """Chunks read while a writer runs, the reader's state restored (after a
    failure, and at other parallelisms) in the middle of the snapshot and of
    the stream, also in the middle of transactions (polls of 3 records):
    every version of every row once, the result equal to the table."""
    dsn = mysql_binlog
    table, stop = names
    fill(dsn, table, 2000)
    source = MySqlCdcSource(dsn, [table], server_id=server_id(), chunk_rows=300,
                            stop_table=stop, **MODES[mode])
    source.validate()
    source.prepare("", "cdc")
    with Writer(dsn, table, stop, 2001, seed=3).running() as writer:
        events, state, _ = read(source, None, 1, rounds=5, final_checkpoint=False)
        assert stream_entry(state)["hw"] is None, "the snapshot ended too early"
        more, state, _ = read(source, state, 3, rounds=40, attempt=1)  # rescaled to 3
        events += more
        assert any(e[0] == "read" for e in more) and any(e[0] != "read" for e in more)
        assert {e[4] for e in events} == {0}, "only task 0 reads"
        inside = 0
        for i in range(12):  # in the stream: restored often, in the middle of transactions
            more, state, _ = read(source, state, 1 + i % 3, rounds=4, attempt=2 + i,
                                  final_checkpoint=i % 2 == 0, batch=3)
            events += more
            inside += bool(stream_entry(state)["pos"][2])
        assert inside, "never restored in the middle of a transaction"
    more, state, ended = read(source, state, 1, attempt=20)
    events += more
    assert ended
    assert writer.ops > 20
    check(events, dsn, table)


def test_column_types_alike_in_snapshot_and_stream_and_a_column_added(mysql_binlog, names):
    """A row of many column types reads the same from the snapshot and from
    the binlog; a column added while the job runs is carried; the commit
    time is a time of the server."""
    dsn = mysql_binlog
    _table, stop = names
    table = f"{DB}.types_{uuid.uuid4().hex[:8]}"
    execute(dsn, f"""CREATE TABLE {table} (id int unsigned PRIMARY KEY, ti tinyint,
        bi bigint unsigned, fl double, de decimal(30,10), da date, dt datetime(6),
        ts timestamp(3) NULL, tm time, yr year, ch char(5), vc varchar(20), tx text,
        bl blob, bn binary(4), vb varbinary(8), en enum('x','y'), st set('p','q','r'),
        bt bit(10), js json, u uuid, ip inet6, bo boolean) DEFAULT CHARSET=utf8mb4""")
    values = ("%s, -128, 18446744073709551615, 2.25, 12345678901234567890.0123456789, "
              "'2024-02-29', '2024-02-29 23:59:59.123456', '2024-03-01 00:00:01.5', "
              "'-12:34:56', 2024, 'ab', 'Zé ✓', 'long text', x'00ff', x'0100', x'0203', "
              "'y', 'p,r', b'1000000001', '{\"k\": [1, 2.5]}', "
              "'f81d4fae-7dec-11d0-a765-00a0c91e6b00', '::1', true")
    try:
        execute(dsn, f"INSERT INTO {table} VALUES ({values % 1})")
        source = MySqlCdcSource(dsn, table, server_id=server_id(), stop_table=stop)
        source.validate()
        source.prepare("", "cdc")
        reader = source.create_reader(info(0, 1))
        reader.restore(None)
        got = reader.poll(50) or []
        execute(dsn, f"INSERT INTO {table} VALUES ({values % 2})",
                f"ALTER TABLE {table} ADD COLUMN note varchar(10)",
                f"UPDATE {table} SET note = 'added' WHERE id = 2",
                f"INSERT INTO {stop} VALUES (1)")
        while (batch := reader.poll(50)) is not None:
            got += batch
        reader.close()
    finally:
        execute(dsn, f"DROP TABLE IF EXISTS {table}")
    read_row = next(e.after for e in got if e.op == "read")
    insert = next(e.after for e in got if e.op == "insert")
    assert read_row == {**insert, "id": 1}
    assert read_row == {
        "id": 1, "ti": -128, "bi": 18446744073709551615, "fl": 2.25,
        "de": decimal.Decimal("12345678901234567890.0123456789"), "da": dt.date(2024, 2, 29),
        "dt": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "ts": dt.datetime(2024, 3, 1, 0, 0, 1, 500000),
        "tm": -dt.timedelta(hours=12, minutes=34, seconds=56), "yr": 2024, "ch": "ab",
        "vc": "Zé ✓", "tx": "long text", "bl": b"\x00\xff", "bn": b"\x01\x00\x00\x00",
        "vb": b"\x02\x03", "en": "y", "st": {"p", "r"}, "bt": 513, "js": '{"k": [1, 2.5]}',
        "u": "f81d4fae-7dec-11d0-a765-00a0c91e6b00", "ip": "::1", "bo": 1}
    update = next(e for e in got if e.op == "update")
    assert update.before is not None and "note" in update.before
    assert update.after == {**insert, "note": "added"}
    now_ms = query(dsn, "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")[0][0]
    assert all(now_ms - 120_000 < e.commit_ms <= now_ms for e in got)
    assert [e.op for e in got] == ["read", "insert", "update"]
    assert got[0].lsn < got[1].lsn < got[2].lsn


@pytest.mark.parametrize("gtid", [True, False], ids=["gtid", "file"])
def test_a_purged_binlog_fails_with_the_fix(mysql_binlog, names, gtid):
    """A checkpoint whose binlog the server purged: the restore fails with
    an error naming the cause and the fix."""
    dsn = mysql_binlog
    table, stop = names
    fill(dsn, table, 5)
    source = MySqlCdcSource(dsn, table, server_id=server_id(), gtid=gtid)
    source.prepare("", "cdc")
    execute(dsn, f"INSERT INTO {table} VALUES (6, 0, 'x')")
    _, state, _ = read(source, None, 1, rounds=3)
    assert stream_entry(state)["hw"] is not None
    execute(dsn, "FLUSH BINARY LOGS", f"INSERT INTO {table} VALUES (7, 0, 'y')",
            "FLUSH BINARY LOGS")
    newest = query(dsn, "SHOW MASTER STATUS")[0][0]
    deadline = time.monotonic() + 30
    while stream_entry(state)["pos"][0] in [r[0] for r in query(dsn, "SHOW BINARY LOGS")]:
        # a file is kept while a reader that just left still holds it, or
        # until InnoDB has made its transactions durable
        assert time.monotonic() < deadline, query(dsn, "SHOW PROCESSLIST")
        execute(dsn, f"PURGE BINARY LOGS TO '{newest}'")
        time.sleep(0.2)
    with pytest.raises(LockgateError, match="no longer has the binlog.*Start the job fresh"):
        read(source, state, 1, rounds=1)


def test_settings_are_checked_at_start(mysql_dsn, mysql_binlog, names):
    """What the server and the tables lack is named with its fix."""
    table, _stop = names
    log_bin = query(mysql_dsn, "SELECT @@log_bin")[0][0]
    if not log_bin:
        with pytest.raises(ConfigurationError, match="log_bin=OFF"):
            MySqlCdcSource(mysql_dsn, "mysql.user", server_id=99).validate()
    dsn = mysql_binlog
    execute(dsn, "SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        with pytest.raises(ConfigurationError, match="SET GLOBAL binlog_row_metadata = 'FULL'"):
            MySqlCdcSource(dsn, table, server_id=99).validate()
    finally:
        execute(dsn, "SET GLOBAL binlog_row_metadata = 'FULL'")
    own = query(dsn, "SELECT @@server_id")[0][0]
    with pytest.raises(ConfigurationError, match="the server's own id"):
        MySqlCdcSource(dsn, table, server_id=own).validate()
    bad = {"nokey": "(a int) ENGINE=InnoDB", "myisam": "(a int PRIMARY KEY) ENGINE=MyISAM",
           "cikey": "(a varchar(10) PRIMARY KEY) ENGINE=InnoDB COLLATE utf8mb4_general_ci"}
    for suffix, spec in bad.items():
        execute(dsn, f"CREATE TABLE {table}_{suffix} {spec}")
    try:
        for suffix, message in (("nokey", "no primary key"), ("myisam", "ENGINE=InnoDB"),
                                ("cikey", "binary collation")):
            with pytest.raises(ConfigurationError, match=message):
                MySqlCdcSource(dsn, f"{table}_{suffix}", server_id=99).validate()
    finally:
        execute(dsn, *(f"DROP TABLE {table}_{s}" for s in bad))
    with pytest.raises(ConfigurationError, match="does not exist"):
        MySqlCdcSource(dsn, f"{DB}.no_such_table", server_id=99).validate()
    user = f"lg_{uuid.uuid4().hex[:8]}"
    execute(dsn, f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
            f"GRANT SELECT ON {DB}.* TO '{user}'@'%'")
    try:
        url = dsn.replace("root@", f"{user}:pw@")
        with pytest.raises(ConfigurationError, match="GRANT BINLOG MONITOR"):
            MySqlCdcSource(url, table, server_id=99).validate()
        execute(dsn, f"GRANT BINLOG MONITOR ON *.* TO '{user}'@'%'")
        with pytest.raises(LockgateError, match="GRANT REPLICATION SLAVE"):
            MySqlCdcSource(url, table, server_id=99).validate()
    finally:
        execute(dsn, f"DROP USER '{user}'@'%'")
    with pytest.raises(ConfigurationError, match="database.name"):
        MySqlCdcSource(dsn, "no_database", server_id=99)
    with pytest.raises(ConfigurationError, match="server_id"):
        MySqlCdcSource(dsn, table, server_id=0)


def test_cdc_job_under_kills(tmp_path, mysql_binlog, names, launcher):
    """The job reads the snapshot and the stream while the writer runs;
    SIGKILLs after a snapshot chunk, after a checkpoint completed
    (``commit``), and at random moments: the committed events are exactly
    once and equal the table."""
    dsn = mysql_binlog
    table, stop = names
    n, chunk, p = (20_000 if SOAK else 3000), 500, 2
    fill(dsn, table, n)
    out = tmp_path / "out"
    faults = [{"point": "commit", "task": 0, "attempt": 1, "count": 3}]
    kills = 3 if SOAK else 1
    cmd = [sys.executable, str(JOB), "--dsn", dsn, "--table", table, "--stop-table", stop,
           "--server-id", str(server_id()), "--out", str(out),
           "--storage", str(tmp_path / "chk"), "--parallelism", str(p), "--chunk", str(chunk),
           "--rate", "4000", "--faults", json.dumps(faults),
           "--kill-marker", str(tmp_path / "killed-after-chunk"), "--launcher", launcher]
    with Writer(dsn, table, stop, n + 1, seed=7).running() as writer:
        # the writer goes on until the random kill landed and the job recovered
        # from it, and the job has committed a few hundred changes of the stream
        stopper = Stopper(writer, after=25 if SOAK else 12, out=out, changes=300)
        result, done = drive(cmd, kills=kills, tasks=p, seed=5, kill_delays=(0.3, 1.5),
                             timeout=400, watcher=stopper)
    assert writer.ops > 20
    assert done == kills and result["status"] == "finished", result
    assert result["restarts"] >= 2, result["failures"]
    assert (tmp_path / "killed-after-chunk").exists()
    events = CollectSink(str(out)).results()
    assert sum(1 for e in events if e[0] == "read") >= n // 2
    assert sum(1 for e in events if e[0] != "read") >= 20
    assert {e[4] for e in events} == {0}, "only task 0 reads"
    check([tuple(e) for e in events], dsn, table)


def _rescale_job(dsn: str, table: str, stop: str, sid: int, p: int, tmp: Path,
                 rate: float = 1500) -> Any:
    source = MySqlCdcSource(dsn, [table], server_id=sid, chunk_rows=500, stop_table=stop)
    return rescale_job("mysql-cdc-rescale", source, p, tmp, rate)


def test_cdc_job_rescaled_through_savepoints_in_the_snapshot_and_in_the_stream(
        tmp_path, mysql_binlog, names):
    """Stopped with a savepoint in the middle of the snapshot at 2 tasks,
    resumed at 3 and stopped again in the stream phase, resumed at 1 to the
    end, while the writer runs: every version of every row once, equal to
    the table."""
    from tests.fixtures import operator_state, start_and_await

    dsn = mysql_binlog
    table, stop = names
    n, sid = 6000, server_id()
    fill(dsn, table, n)

    def stream_of(savepoint: str) -> dict:
        return stream_entry([e for task in operator_state(savepoint, "cdc") for e in task
                             if e.get("cdc")])

    with Writer(dsn, table, stop, n + 1, seed=9).running():
        client = start_and_await(_rescale_job(dsn, table, stop, sid, 2, tmp_path, rate=500),
                                 launcher="local", until=lambda pr: pr.records_read >= 600,
                                 timeout=240, what="the first hop read too little")
        first = client.stop(str(tmp_path / "savepoints"))
        assert first.status == "stopped", first
        assert stream_of(first.savepoint)["hw"] is None, "not stopped in the snapshot"
        client = start_and_await(_rescale_job(dsn, table, stop, sid, 3, tmp_path),
                                 launcher="local", from_savepoint=first.savepoint)
        await_stream(tmp_path / "out", 3)  # committed: the stream runs
        second = client.stop(str(tmp_path / "savepoints"))
        assert second.status == "stopped", second
        assert stream_of(second.savepoint)["hw"] is not None, "not stopped in the stream"
    client = _rescale_job(dsn, table, stop, sid, 1, tmp_path).start(
        launcher="local", from_savepoint=second.savepoint)
    result = client.result(timeout=240)
    assert result.status == "finished", result
    events = [tuple(e) for e in CollectSink(str(tmp_path / "out")).results()]
    assert {e[5] for e in events if e[0] == "read"} >= {2, 3}, "the snapshot spans two hops"
    check(events, dsn, table)
