"""Rows/s read by ``PostgresCdcSource``, snapshot and stream, against a plain
``SELECT`` / ``COPY`` of the same table and a plain read of the same log.

    python benchmarks/bench_cdc.py [--n 200000] [--chunk 4096] [--interval 1.0]
                                   [--parallelism 1] [--dsn URL] [--record]

The table is ``(id bigint PRIMARY KEY, k int, name text)`` with N rows.

- ``plain SELECT`` / ``plain COPY``: one ``SELECT *`` (rows fetched into
  Python) / one ``COPY ... TO STDOUT`` of the table from this process, no
  Lockgate: the ceiling of the snapshot;
- ``CDC snapshot``: a Lockgate job ``PostgresCdcSource -> no sink`` that
  reads the N rows in chunks (watermarks, merge) and ends at a stop message
  written right after the slot was made;
- ``plain peek``: one ``pg_logical_slot_peek_binary_changes`` of N inserts
  (1000 per transaction) fetched into Python, no decoding, no Lockgate: the
  ceiling of the stream;
- ``CDC stream``: the job with ``snapshot=False`` reading those N inserts
  as change events (decoded, positioned, checkpointed every ``--interval``
  seconds, the slot advanced at each completed checkpoint).

Rows/s is N over the wall time (a job's: start to finish, start-up and final
checkpoint included), local launcher, parallelism ``--parallelism`` (the
snapshot's chunks spread over the tasks; the stream is one task's). Without ``--dsn`` (or
``LOCKGATE_BENCH_POSTGRES_LOGICAL``) it starts a throwaway cluster with
``wal_level=logical`` (fsync off, as in the tests). ``--record`` appends one
JSON line per run to benchmarks/results/cdc.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import PostgresCdcSource, Sink, SinkWriter
from tests.connectors.postgres_server import execute, throwaway_cluster

STOP = "bench-cdc-stop"
RESULTS = Path(__file__).parent / "results" / "cdc.jsonl"


class Discard(Sink[Any]):
    def create_writer(self, info: Any) -> SinkWriter[Any]:
        return _Nothing()


class _Nothing(SinkWriter[Any]):
    def restore(self, state: list[Any]) -> None: ...
    def write_batch(self, batch: list[Any]) -> None: ...
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []


def fill(dsn: str, table: str, n: int) -> None:
    execute(dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, k int, name text)",
            f"INSERT INTO {table} SELECT i, i % 1000, 'name ' || i FROM generate_series(1, {n}) i")


def plain_select(dsn: str, table: str) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()
    assert rows
    return time.perf_counter() - started


def plain_copy(dsn: str, table: str) -> float:
    import psycopg

    started = time.perf_counter()
    size = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY {table} TO STDOUT") as copy:
            for block in copy:
                size += len(block)
    assert size
    return time.perf_counter() - started


def plain_peek(dsn: str, slot: str, n: int) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)", (slot, slot)).fetchall()
    assert len(rows) >= n, (len(rows), n)
    return time.perf_counter() - started


def cdc_job(dsn: str, table: str, slot: str, n: int, snapshot: bool, chunk: int,
            interval: float, storage: str, parallelism: int) -> float:
    source = PostgresCdcSource(dsn, [table], slot=slot, snapshot=snapshot, chunk_rows=chunk,
                               stop_message=STOP)
    p = Pipeline(f"bench-cdc-{'snapshot' if snapshot else 'stream'}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
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
    with throwaway_cluster(settings="-c wal_level=logical") as url:
        yield url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--dsn", default=os.environ.get("LOCKGATE_BENCH_POSTGRES_LOGICAL"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    n, tmp = args.n, tempfile.mkdtemp(prefix="bench-cdc-")
    runs: list[tuple[str, float]] = []
    tag = uuid.uuid4().hex[:8]
    try:
        with server(args.dsn) as dsn:
            table, slot = f"bench_cdc_{tag}", f"bench_cdc_{tag}"
            fill(dsn, table, n)
            runs.append(("plain SELECT", plain_select(dsn, table)))
            runs.append(("plain COPY", plain_copy(dsn, table)))
            snap = PostgresCdcSource(dsn, [table], slot=slot)
            snap.prepare("", "cdc")
            execute(dsn, f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
            runs.append(("CDC snapshot", cdc_job(dsn, table, slot, n, True, args.chunk,
                                                 args.interval, os.path.join(tmp, "s"),
                                                 args.parallelism)))
            execute(dsn, f"SELECT pg_drop_replication_slot('{slot}')",
                    f"DROP PUBLICATION {slot}", f"TRUNCATE {table}")
            PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")
            for lo in range(1, n + 1, 1000):
                execute(dsn, f"INSERT INTO {table} SELECT i, i % 1000, 'name ' || i FROM "
                             f"generate_series({lo}, {min(n, lo + 999)}) i")
            # committed with a flush: the log up to here is decodable
            execute(dsn, "SET synchronous_commit = on",
                    f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
            runs.append(("plain peek", plain_peek(dsn, slot, n)))
            runs.append(("CDC stream", cdc_job(dsn, table, slot, n, False, args.chunk,
                                               args.interval, os.path.join(tmp, "t"),
                                               args.parallelism)))
            execute(dsn, f"SELECT pg_drop_replication_slot('{slot}')",
                    f"DROP PUBLICATION {slot}", f"DROP TABLE {table}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n:,} rows, chunks of {args.chunk}, checkpoint every {args.interval} s, "
          f"parallelism {args.parallelism}")
    print(f"{'run':<16} {'seconds':>8} {'rows/s':>12}")
    for name, seconds in runs:
        print(f"{name:<16} {seconds:>8.2f} {n / seconds:>12,.0f}")
    if args.record:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent).stdout.strip() or None
        except OSError:
            commit = None
        load = os.getloadavg()[0]
        with RESULTS.open("a") as f:
            for name, seconds in runs:
                f.write(json.dumps({
                    "date": datetime.date.today().isoformat(), "commit": commit,
                    "machine": "2-core, 24 GiB (python-svc)", "load": round(load, 1),
                    "rows": n, "chunk_rows": args.chunk, "interval_s": args.interval,
                    "parallelism": args.parallelism,
                    "run": name, "seconds": round(seconds, 3),
                    "rows_per_s": round(n / seconds)}) + "\n")


if __name__ == "__main__":
    main()
