"""``PostgresUpsertSink``: idempotent writes into a PostgreSQL table by key
(``INSERT ... ON CONFLICT (key) DO UPDATE``), at least once per checkpoint.

Rows are buffered per key (the last record of a key wins) and written in one
transaction when the buffer is full and at every snapshot, before the
barrier moves on: once a checkpoint completes, everything before it is
committed in the table. After a failure the sources replay from the last
checkpoint, and the replayed records write their keys again. When the value
written for a key is a function of the input up to that record (a running
aggregate keyed by the sink's key), the replay writes the same values and
the table ends exactly as without the failure: ``exactly_once=True`` says so
(docs/connectors/postgres.md, "When idempotent writes are exactly-once").

Two ways to write a buffer (``method``): ``"copy"`` (the default: COPY into a
temporary table, then one ``INSERT ... SELECT ... ON CONFLICT``, ordered by
key so that two tasks lock rows in one order and never deadlock) or
``"values"`` (``executemany`` of the INSERT, pipelined, rows ordered by key);
``benchmarks/bench_postgres.py`` measures both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.postgres_common import Target, connect, redact_dsn
from lockgate.errors import ConfigurationError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["PostgresUpsertSink", "PostgresUpsertWriter"]

log = logging.getLogger(__name__)

METHODS = ("copy", "values")


class PostgresUpsertWriter(SinkWriter[Any]):
    """One task's upserts: a buffer of the last row per key, flushed in one
    transaction when full and at every snapshot."""

    def __init__(self, info: TaskInfo, sink: PostgresUpsertSink) -> None:
        self.info = info
        self.sink = sink
        self.target = Target(sink.table, sink.columns)
        self._conn: psycopg.Connection[Any] | None = None
        self._buffer: dict[Any, Sequence[Any]] = {}
        self._key_at: list[int] = []
        self._statements: dict[str, sql.Composed] = {}

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = connect(self.sink.dsn, autocommit=False,
                                 application_name=f"lockgate-{self.info.uid}-"
                                                  f"{self.info.task_index}")
            self.target.resolve(self._conn)
            self._prepare_statements()
            if self.sink.method == "copy":  # one per session, emptied at every commit
                self._conn.execute(self._statements["temp"])
            self._conn.commit()
        return self._conn

    def _prepare_statements(self) -> None:
        from psycopg import sql

        columns = self.target.known_columns
        keys = self.sink.key_columns
        self._key_at = [columns.index(k) for k in keys]
        updates = [c for c in columns if c not in keys]
        action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in updates)) if updates else sql.SQL("DO NOTHING"))
        table, cols = self.target.table_sql(), self.target.columns_sql()
        conflict = self.target.columns_sql(keys)
        temp = sql.Identifier(f"lockgate_upsert_{self.info.task_index}")
        self._statements = {
            "values": sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
                table, cols, sql.SQL(", ").join(sql.Placeholder() * len(columns)), conflict,
                action),
            "temp": sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DELETE ROWS AS SELECT {} "
                            "FROM {} WITH NO DATA").format(temp, cols, table),
            "copy": sql.SQL("COPY {} ({}) FROM STDIN").format(temp, cols),
            "merge": sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY {} "
                             "ON CONFLICT ({}) {}").format(table, cols, cols, temp, conflict,
                                                           conflict, action),
        }

    # ------------------------------------------------------- SinkWriter API

    def restore(self, state: list[Any]) -> None:
        """Nothing to recover: the replayed records write their keys again."""
        self._connection()

    def write_batch(self, batch: list[Any]) -> None:
        """Buffer the rows, the last per key; flush when the buffer is full."""
        if not batch:
            return
        self._connection()
        key_at = self._key_at
        buffer = self._buffer
        if len(key_at) == 1:
            (at,) = key_at
            for row in self.target.rows(batch):
                buffer[row[at]] = row
        else:
            for row in self.target.rows(batch):
                buffer[tuple(row[i] for i in key_at)] = row
        if len(buffer) >= self.sink.batch_rows:
            self.flush()

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Commit everything written before the barrier; no state."""
        self.flush()
        return []

    def finish(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the buffer in one transaction and commit it.

        Step 1. Take the buffered rows (one per key).
        Step 2. ``copy``: COPY them into the session's temporary table, then
                one INSERT ... SELECT ... ORDER BY key ON CONFLICT into the
                table; ``values``: the INSERT ... ON CONFLICT per row,
                pipelined, rows sorted by key where the keys compare.
        Step 3. Commit.
        """
        # Step 1. Rows.
        if not self._buffer:
            return
        rows = list(self._buffer.values())
        self._buffer = {}
        conn = self._connection()
        st = self._statements
        with conn.cursor() as cur:
            # Step 2. Write.
            if self.sink.method == "copy":
                with cur.copy(st["copy"]) as copy:
                    for row in rows:
                        copy.write_row(row)
                cur.execute(st["merge"])
            else:
                try:
                    rows.sort(key=lambda r: [r[i] for i in self._key_at])
                except TypeError:
                    pass  # keys that do not compare: no order (a deadlock is retried)
                cur.executemany(st["values"], rows)
        # Step 3. Commit.
        conn.commit()

    def close(self) -> None:
        """Drop the buffer (replayed after a failure) and the connection."""
        self._buffer = {}
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresUpsertSink(Sink[Any]):
    """Rows upserted by key into a PostgreSQL table, committed at every
    checkpoint (at least once; exactly once for deterministic keyed updates).

    Args:
        dsn: a libpq connection string or URL.
        table: ``"table"`` or ``"schema.table"``; it must exist, with a unique
            index or primary key on ``key_columns``.
        key_columns: the conflict target: the columns that identify a row.
        columns: the columns a record fills (a dict by name, a tuple in this
            order); ``None``: every column of the table.
        method: ``"copy"`` (COPY + one INSERT ... SELECT) or ``"values"``
            (executemany of INSERT ... VALUES).
        batch_rows: flush when this many keys are buffered (and at every
            checkpoint).
        exactly_once: declare that the value written for a key is a function
            of the input up to that record, keyed by the sink's key (e.g. a
            running aggregate): replays then rewrite the same values and the
            job's guarantee is exactly-once. Leave False otherwise.
    """

    def __init__(self, dsn: str, table: str, key_columns: Sequence[str],
                 columns: Sequence[str] | None = None, *, method: str = "copy",
                 batch_rows: int = 10_000, exactly_once: bool = False) -> None:
        if method not in METHODS:
            raise ConfigurationError(
                f"PostgresUpsertSink: method {method!r} is not one of {METHODS}")
        if not key_columns:
            raise ConfigurationError("PostgresUpsertSink: give the key_columns rows conflict on")
        if columns is not None and any(k not in columns for k in key_columns):
            raise ConfigurationError(
                f"PostgresUpsertSink: key columns {list(key_columns)} must be among the "
                f"columns {list(columns)}")
        if batch_rows < 1:
            raise ConfigurationError(f"PostgresUpsertSink: batch_rows must be >= 1, "
                                     f"got {batch_rows}")
        Target(table, columns)
        self.dsn = dsn
        self.table = table
        self.columns = tuple(columns) if columns is not None else None
        self.key_columns = tuple(key_columns)
        self.method = method
        self.batch_rows = batch_rows
        self.exactly_once = exactly_once

    def validate(self) -> None:
        """In the driver: the server is reachable, the table and columns exist
        and a unique index covers exactly the key columns."""
        conn = connect(self.dsn, autocommit=True, application_name="lockgate-validate")
        try:
            target = Target(self.table, self.columns)
            target.resolve(conn)
            missing = [k for k in self.key_columns if k not in target.known_columns]
            if missing:
                raise ConfigurationError(
                    f"PostgresUpsertSink: key column(s) {missing} are not among the columns "
                    f"{list(target.known_columns)} of {self.table!r}")
            qualified = ".".join('"' + p.replace('"', '""') + '"' for p in target.parts)
            unique = conn.execute(
                "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
                "GROUP BY i.indexrelid", (qualified,)).fetchall()
            if sorted(self.key_columns) not in [sorted(r[0]) for r in unique]:
                raise ConfigurationError(
                    f"PostgresUpsertSink: {self.table!r} has no unique index or primary key on "
                    f"exactly {list(self.key_columns)}, which ON CONFLICT needs: "
                    f"ALTER TABLE {self.table} ADD PRIMARY KEY ({', '.join(self.key_columns)})")
        finally:
            conn.close()

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        return PostgresUpsertWriter(info, self)

    def __repr__(self) -> str:
        return (f"PostgresUpsertSink({redact_dsn(self.dsn)!r}, {self.table!r}, "
                f"key={list(self.key_columns)})")
