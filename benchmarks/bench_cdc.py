"""Rows/s read by ``PostgresCdcSource``, snapshot and stream, against a plain
``SELECT`` / ``COPY`` of the same table and a plain read of the same log.

    python benchmarks/bench_cdc.py [--n 200000] [--chunk 4096] [--interval 1.0]
                                   [--parallelism 1] [--repeat 3] [--dsn URL] [--record]

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
snapshot's chunks spread over the tasks; the stream is one task's). A job
also reports its *steady* rate (between 10 % and 90 % of the rows reaching
the sink: start-up and the end left out) and the CPU seconds of its
processes (driver, fork server, tasks; not the server's). ``--repeat``
rounds, the plain reads first in even rounds and last in odd ones (the
machine may be shared); the summary gives medians. An unmeasured job runs
first (the driver's fork server starts with it). Without ``--dsn`` (or
``LOCKGATE_BENCH_POSTGRES_LOGICAL``) it starts a throwaway cluster with
``wal_level=logical`` (fsync off, as in the tests). ``--record`` appends one
JSON line per run to benchmarks/results/cdc.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.nexmark.measure import JobUsage, source_progress, steady
from benchmarks.record import record
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import PostgresCdcSource, Sink, SinkWriter
from tests.connectors.postgres_server import execute, throwaway_cluster

STOP = "bench-cdc-stop"


class Discard(Sink[Any]):
    """Keeps nothing; each task writes ``[[wall clock, rows so far], ...]``
    (one mark per batch) to ``<folder>/source-<task>.json`` at the end."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def create_writer(self, info: Any) -> SinkWriter[Any]:
        return _Nothing(self.folder, info.task_index)


class _Nothing(SinkWriter[Any]):
    def __init__(self, folder: str, task: int) -> None:
        self.path = Path(folder) / f"source-{task}.json"
        self.marks: list[tuple[float, int]] = [(time.time(), 0)]
        self.count = 0

    def restore(self, state: list[Any]) -> None: ...

    def write_batch(self, batch: list[Any]) -> None:
        self.count += len(batch)
        self.marks.append((time.time(), self.count))

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def finish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.marks))


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


def plain_peek(dsn: str, slot: str, publication: str, n: int) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)", (slot, publication)).fetchall()
    assert len(rows) >= n, (len(rows), n)
    return time.perf_counter() - started


def cdc_job(dsn: str, table: str, slot: str, n: int, snapshot: bool, chunk: int,
            interval: float, storage: str, parallelism: int) -> dict[str, Any]:
    source = PostgresCdcSource(dsn, [table], slot=slot, snapshot=snapshot, chunk_rows=chunk,
                               stop_message=STOP)
    p = Pipeline(f"bench-cdc-{'snapshot' if snapshot else 'stream'}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
    marks = os.path.join(storage, "marks")
    p.source(source, uid="cdc").sink(Discard(marks), uid="out")
    usage = JobUsage()
    usage.start()
    started = time.perf_counter()
    result = p.run(launcher="local", progress=False)
    elapsed = time.perf_counter() - started
    cpu = usage.finish(settle=2.0)["cpu_s"]
    assert result.records_in == n, (result.records_in, n)
    rate = steady(source_progress(marks), usage.timeline, n, 0.1, 0.9)
    return {"seconds": elapsed, "cpu_s": cpu,
            "steady_rows_per_s": rate["steady_events_per_s"]}


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with throwaway_cluster(settings="-c wal_level=logical") as url:
        yield url


def round_of(dsn: str, n: int, args: argparse.Namespace, tmp: str, first: bool
             ) -> list[tuple[str, dict[str, Any]]]:
    """One round: the plain reads and the jobs of a fresh table (plain reads
    first if ``first``, else last)."""
    tag = uuid.uuid4().hex[:8]
    table, slot = f"bench_cdc_{tag}", f"bench_cdc_{tag}"
    fill(dsn, table, n)
    runs: list[tuple[str, dict[str, Any]]] = []

    def plain(name: str, fn: Any, *a: Any) -> None:
        begin = os.times()
        seconds = fn(*a)
        end = os.times()
        runs.append((name, {"seconds": seconds, "cpu_s": end.user + end.system
                            - begin.user - begin.system}))

    def job(name: str, snapshot: bool) -> None:
        runs.append((name, cdc_job(dsn, table, slot, n, snapshot, args.chunk, args.interval,
                                   os.path.join(tmp, f"{tag}-{name[4:]}"), args.parallelism)))

    snap = PostgresCdcSource(dsn, [table], slot=slot)
    snap.prepare("", "cdc")
    execute(dsn, f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
    if first:
        plain("plain SELECT", plain_select, dsn, table)
        plain("plain COPY", plain_copy, dsn, table)
    job("CDC snapshot", True)
    if not first:
        plain("plain SELECT", plain_select, dsn, table)
        plain("plain COPY", plain_copy, dsn, table)
    execute(dsn, f"SELECT pg_drop_replication_slot('{slot}')",
            f"DROP PUBLICATION {slot}", f"TRUNCATE {table}")
    PostgresCdcSource(dsn, [table], slot=slot).prepare("", "cdc")
    # the plain read's own slot at the same place (the job advances its own)
    execute(dsn, f"SELECT pg_create_logical_replication_slot('{slot}_p', 'pgoutput')")
    for lo in range(1, n + 1, 1000):
        execute(dsn, f"INSERT INTO {table} SELECT i, i % 1000, 'name ' || i FROM "
                     f"generate_series({lo}, {min(n, lo + 999)}) i")
    # committed with a flush: the log up to here is decodable
    execute(dsn, "SET synchronous_commit = on",
            f"SELECT pg_logical_emit_message(true, '{STOP}', '')")
    if first:
        plain("plain peek", plain_peek, dsn, f"{slot}_p", slot, n)
    job("CDC stream", False)
    if not first:
        plain("plain peek", plain_peek, dsn, f"{slot}_p", slot, n)
    execute(dsn, f"SELECT pg_drop_replication_slot('{slot}')",
            f"SELECT pg_drop_replication_slot('{slot}_p')",
            f"DROP PUBLICATION {slot}", f"DROP TABLE {table}")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dsn", default=os.environ.get("LOCKGATE_BENCH_POSTGRES_LOGICAL"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    n, tmp = args.n, tempfile.mkdtemp(prefix="bench-cdc-")
    runs: list[tuple[int, str, dict[str, Any], list[float]]] = []
    try:
        with server(args.dsn) as dsn:
            round_of(dsn, 5000, args, tmp, True)  # unmeasured: the fork server starts
            for r in range(args.repeat):
                load = os.getloadavg()[0]
                got = round_of(dsn, n, args, tmp, r % 2 == 0)
                loads = [round(load, 1), round(os.getloadavg()[0], 1)]
                for name, figures in got:
                    runs.append((r, name, figures, loads))
                    steady_rate = figures.get("steady_rows_per_s")
                    print(f"round {r} {name:<13} {n / figures['seconds']:>10,.0f} rows/s "
                          f"steady {steady_rate or 0:>10,.0f} cpu {figures['cpu_s']:5.1f} s "
                          f"load {loads}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n:,} rows, chunks of {args.chunk}, checkpoint every {args.interval} s, "
          f"parallelism {args.parallelism}; medians of {args.repeat} rounds")
    print(f"{'run':<14} {'seconds':>8} {'rows/s':>10} {'steady':>10} {'rows/CPU s':>11}")
    for name in dict.fromkeys(name for _, name, _, _ in runs):
        mine = [f for _, nm, f, _ in runs if nm == name]
        seconds = statistics.median(f["seconds"] for f in mine)
        st = [f["steady_rows_per_s"] for f in mine if f.get("steady_rows_per_s")]
        cpu = statistics.median(f["cpu_s"] for f in mine)
        print(f"{name:<14} {seconds:>8.2f} {n / seconds:>10,.0f} "
              f"{statistics.median(st) if st else 0:>10,.0f} {n / cpu if cpu else 0:>11,.0f}")
    if args.record:
        record("cdc", [{"load": loads, "rows": n, "chunk_rows": args.chunk,
                        "interval_s": args.interval, "parallelism": args.parallelism,
                        "round": r, "run": name, "seconds": round(figures["seconds"], 3),
                        "rows_per_s": round(n / figures["seconds"]),
                        "steady_rows_per_s": (None if figures.get("steady_rows_per_s") is None
                                              else round(figures["steady_rows_per_s"])),
                        "cpu_s": round(figures["cpu_s"], 2)}
                       for r, name, figures, loads in runs])


if __name__ == "__main__":
    main()
