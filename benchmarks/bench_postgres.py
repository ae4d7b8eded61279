"""Rows/s into PostgreSQL: the two-phase-commit sink vs the upsert sink vs a
plain COPY of the same rows, side by side.

    python benchmarks/bench_postgres.py [--n 500000] [--parallelism 2] [--keys 0]
                                        [--interval 1.0] [--dsn URL]

The rows are ``(id, k, v) = (x, x % 1000, 2x)`` for ``x`` in ``1..N``, into a
fresh table ``(id bigint PRIMARY KEY, k int, v bigint)`` per run:

- ``plain COPY``: one ``COPY ... FROM STDIN`` of the rows from this process,
  no Lockgate (the ceiling);
- ``PostgresSink (2PC)``: a Lockgate job ``SequenceSource -> map -> sink``,
  COPY per batch into one transaction per task and checkpoint, PREPARE at the
  snapshot, COMMIT PREPARED at completion;
- ``PostgresUpsertSink copy`` / ``values``: the same job into the upsert sink
  (COPY into a temporary table + one INSERT ... SELECT ... ON CONFLICT, or
  executemany of INSERT ... ON CONFLICT); with ``--keys K`` the ids repeat
  (``x % K``): updates instead of inserts;
- ``Lockgate, no sink``: the same job writing nowhere (the engine's share).

Rows/s is N over the wall time (a job's: start to finish, its final
checkpoint and commit included), local launcher. Without ``--dsn`` (or
``LOCKGATE_BENCH_POSTGRES``) the benchmark starts a throwaway cluster with
prepared transactions (initdb as the ``postgres`` user when run as root; fsync
off, as in the tests: the numbers are the sinks' own cost, not the disk's).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import (
    PostgresSink,
    PostgresUpsertSink,
    SequenceSource,
    Sink,
    SinkWriter,
)
from tests.connectors.postgres_server import execute, query, throwaway_cluster


class Discard(Sink[Any]):
    """Writes nowhere."""

    def create_writer(self, info: Any) -> SinkWriter[Any]:
        return _Nothing()


class _Nothing(SinkWriter[Any]):
    def restore(self, state: list[Any]) -> None: ...
    def write_batch(self, batch: list[Any]) -> None: ...
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []


def fresh_table(dsn: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    execute(dsn, f"CREATE TABLE {name} (id bigint PRIMARY KEY, k int, v bigint)")
    return name


def plain_copy(dsn: str, n: int, keys: int) -> float:
    import psycopg

    table = fresh_table(dsn)
    started = time.perf_counter()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        rows: dict[int, tuple] = {}
        for x in range(1, n + 1):  # the last row per id, as the upsert sink keeps
            i = x % keys if keys else x
            rows[i] = (i, x % 1000, 2 * x)
        with cur.copy(f"COPY {table} (id, k, v) FROM STDIN") as copy:
            for row in rows.values():
                copy.write_row(row)
    elapsed = time.perf_counter() - started
    execute(dsn, f"DROP TABLE {table}")
    return elapsed


def job(dsn: str, n: int, keys: int, parallelism: int, interval: float, kind: str,
        storage: str) -> float:
    table = fresh_table(dsn)
    sink: Sink[Any]
    if kind == "2pc":
        sink = PostgresSink(dsn, table, ["id", "k", "v"])
    elif kind == "none":
        sink = Discard()
    else:
        sink = PostgresUpsertSink(dsn, table, ["id"], ["id", "k", "v"], method=kind,
                                  exactly_once=True)
    p = Pipeline(f"bench-pg-{kind}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
    (p.source(SequenceSource(1, n), uid="numbers")
       .map(lambda x: (x % keys if keys else x, x % 1000, 2 * x), uid="rows")
       .sink(sink, uid="out"))
    started = time.perf_counter()
    result = p.run(launcher="local")
    elapsed = time.perf_counter() - started
    assert result.records_in == n, result
    if kind != "none":
        (count,), = query(dsn, f"SELECT count(*) FROM {table}")
        expected = min(keys, n) if keys else n
        assert count == expected, (kind, count, expected)
    execute(dsn, f"DROP TABLE {table}")
    return elapsed


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with throwaway_cluster(max_prepared=64) as url:
        yield url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=0, help="ids repeat mod K (0: all distinct)")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--dsn", default=os.environ.get("LOCKGATE_BENCH_POSTGRES"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-pg-")
    rows = []
    try:
        with server(args.dsn) as dsn:
            if args.keys:  # the 2PC sink appends: its table must not refuse repeated ids
                runs = ["copy", "values", "none"]
            else:
                runs = ["2pc", "copy", "values", "none"]
            rows.append(("plain COPY (no Lockgate)", plain_copy(dsn, args.n, args.keys)))
            names = {"2pc": "PostgresSink (2PC)", "copy": "PostgresUpsertSink copy",
                     "values": "PostgresUpsertSink values", "none": "Lockgate, no sink"}
            for kind in runs:
                storage = os.path.join(tmp, kind)
                rows.append((names[kind], job(dsn, args.n, args.keys, args.parallelism,
                                              args.interval, kind, storage)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{args.n:,} rows, parallelism {args.parallelism}, checkpoint every "
          f"{args.interval} s, ids {'mod ' + str(args.keys) if args.keys else 'distinct'}")
    print(f"{'run':<28} {'seconds':>8} {'rows/s':>12}")
    for name, seconds in rows:
        print(f"{name:<28} {seconds:>8.2f} {args.n / seconds:>12,.0f}")


if __name__ == "__main__":
    main()
