"""Rows/s read by ``MySqlCdcSource``, snapshot and stream, against a plain
``SELECT`` of the same table and a plain read of the same binlog.

    python benchmarks/bench_mysql_cdc.py [--n 200000] [--chunk 4096] [--interval 1.0]
                                         [--dsn mysql://...] [--record]

The table is ``(id bigint PRIMARY KEY, k int, name varchar(40))`` with N rows.

- ``plain SELECT``: one ``SELECT *`` with PyMySQL (rows fetched into Python),
  no Lockgate: the ceiling of the snapshot;
- ``CDC snapshot``: a Lockgate job ``MySqlCdcSource -> no sink`` that reads
  the N rows in chunks (each in a consistent snapshot) and ends at a row of
  the stop table inserted right after the job's start position was taken;
- ``plain binlog``: mysql-replication reading the row events of N inserts
  (1000 per transaction), decoded into Python rows (as the source needs
  them), no Lockgate: the ceiling of the stream;
- ``CDC stream``: the job with ``snapshot=False`` reading those N inserts as
  change events (positioned, checkpointed every ``--interval`` seconds).

Rows/s is N over the wall time (a job's: start to finish, start-up and final
checkpoint included), local launcher, parallelism 1. Without ``--dsn`` (or
``LOCKGATE_BENCH_MYSQL_BINLOG``) it starts a throwaway MariaDB server with
the binlog in row format (durability off, as in the tests). ``--record``
appends one JSON line per run to benchmarks/results/mysql_cdc.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_cdc import Discard
from benchmarks.record import record
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import MySqlCdcSource
from tests.connectors.mysql_server import connect, execute, query, throwaway_mariadb


def fill(dsn: str, table: str, n: int) -> None:
    """Rows ``1..n`` of ``(id, k, name)``, in transactions of 1000."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for lo in range(1, n + 1, 1000):
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                                [(i, i % 1000, f"name {i}")
                                 for i in range(lo, min(n, lo + 999) + 1)])
    finally:
        conn.close()


def plain_select(dsn: str, table: str) -> float:
    started = time.perf_counter()
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            rows = cur.fetchall()
    finally:
        conn.close()
    assert len(rows) > 0
    return time.perf_counter() - started


def plain_binlog(dsn: str, table: str, file: str, offset: int, n: int) -> float:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    url = urlsplit(dsn)
    db, name = table.split(".")
    started = time.perf_counter()
    stream = BinLogStreamReader(
        {"host": url.hostname, "port": url.port, "user": url.username or "root",
         "password": url.password or ""}, server_id=99_001, blocking=False,
        resume_stream=True, log_file=file, log_pos=offset, only_events=[WriteRowsEvent],
        only_schemas=[db], only_tables=[name], enable_logging=False)
    rows = sum(len(ev.rows) for ev in stream)
    stream.close()
    assert rows >= n, (rows, n)
    return time.perf_counter() - started


def cdc_job(source: MySqlCdcSource, n: int, interval: float, storage: str) -> float:
    p = Pipeline(f"bench-mysql-cdc-{'snapshot' if source.snapshot else 'stream'}",
                 parallelism=1, checkpoint=CheckpointConfig(interval=interval, storage=storage))
    p.source(source, uid="cdc").sink(Discard(), uid="out")
    started = time.perf_counter()
    result = p.run(launcher="local", progress=False)
    elapsed = time.perf_counter() - started
    assert result.records_in == n, (result.records_in, n)
    return elapsed


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with throwaway_mariadb() as url:
        yield url


def runs_on(dsn: str, n: int, chunk: int, interval: float, tmp: str) -> list[tuple[str, float]]:
    runs: list[tuple[str, float]] = []
    tag = uuid.uuid4().hex[:8]
    table, stop = f"bench.cdc_{tag}", f"bench.stop_{tag}"
    execute(dsn, "CREATE DATABASE IF NOT EXISTS bench",
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, k int, name varchar(40))",
            f"CREATE TABLE {stop} (x int)")
    fill(dsn, table, n)
    runs.append(("plain SELECT", plain_select(dsn, table)))
    snap = MySqlCdcSource(dsn, [table], server_id=99_002, chunk_rows=chunk, stop_table=stop)
    snap.prepare("", "cdc")
    execute(dsn, f"INSERT INTO {stop} VALUES (1)")
    runs.append(("CDC snapshot", cdc_job(snap, n, interval, os.path.join(tmp, "s"))))
    execute(dsn, f"TRUNCATE {table}")
    stream = MySqlCdcSource(dsn, [table], server_id=99_003, snapshot=False, stop_table=stop)
    stream.prepare("", "cdc")  # the position before the inserts: the job keeps it
    file, offset = query(dsn, "SHOW MASTER STATUS")[0][:2]
    fill(dsn, table, n)
    execute(dsn, f"INSERT INTO {stop} VALUES (2)")
    runs.append(("plain binlog", plain_binlog(dsn, table, str(file), int(offset), n)))
    runs.append(("CDC stream", cdc_job(stream, n, interval, os.path.join(tmp, "t"))))
    execute(dsn, f"DROP TABLE {table}", f"DROP TABLE {stop}")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--dsn", default=os.environ.get("LOCKGATE_BENCH_MYSQL_BINLOG"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    n, tmp = args.n, tempfile.mkdtemp(prefix="bench-mysql-cdc-")
    try:
        with server(args.dsn) as dsn:
            version = query(dsn, "SELECT VERSION()")[0][0]
            runs = runs_on(dsn, n, args.chunk, args.interval, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n:,} rows, chunks of {args.chunk}, checkpoint every {args.interval} s, {version}")
    print(f"{'run':<16} {'seconds':>8} {'rows/s':>12}")
    for name, seconds in runs:
        print(f"{name:<16} {seconds:>8.2f} {n / seconds:>12,.0f}")
    if args.record:
        record("mysql_cdc", [{"server": version, "rows": n, "chunk_rows": args.chunk,
                              "interval_s": args.interval, "run": name,
                              "seconds": round(seconds, 3), "rows_per_s": round(n / seconds)}
                             for name, seconds in runs])


if __name__ == "__main__":
    main()
