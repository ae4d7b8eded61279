"""``PostgresSink``: exactly-once rows in a PostgreSQL table by two-phase commit.

One transaction per task and checkpoint (docs/connectors/postgres.md)::

    first record after a checkpoint   BEGIN (implicitly), then rows by COPY
                                      (or the user's INSERT, executemany) per batch
    snapshot of checkpoint n          PREPARE TRANSACTION
                                      'lockgate:<job>:<uid>:<task>:<attempt>:<n>'
                                      (durable, invisible to every reader; the
                                      handle {gid, xid} is the sink's state)
    checkpoint n complete             COMMIT PREPARED '<gid>' (idempotent)
    restore                           COMMIT PREPARED what the checkpoint names,
                                      ROLLBACK PREPARED every other prepared
                                      transaction of this sink uid and task

A gid no longer prepared was committed or rolled back: the handle's xid tells
which (``pg_xact_status``): committed is done, rolled back is lost output
(an error, never silently skipped). The names and the recovery plan are
:mod:`lockgate.connectors.postgres_plan`'s (pure); the client library is
imported only when a sink is used (:mod:`lockgate.connectors.postgres_common`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.postgres_common import Target, connect, import_psycopg, redact_dsn
from lockgate.connectors.postgres_plan import (
    GID_PREFIX,
    PgTxnHandle,
    check_handle,
    make_gid,
    parse_gid,
    plan_postgres_recovery,
)
from lockgate.connectors.twophase import Precommitted, TwoPhaseCommitSinkWriter
from lockgate.errors import ConfigurationError, OutputLostError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresSink", "PostgresSinkWriter", "check_two_phase_commit", "prepared_of"]

log = logging.getLogger(__name__)


def check_two_phase_commit(conn: psycopg.Connection[Any], dsn: str) -> None:
    """Refuse a server that cannot prepare transactions, naming the setting
    and the fix."""
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    if row is None or int(row[0]) <= 0:
        raise ConfigurationError(
            f"PostgreSQL at {redact_dsn(dsn)!r} has max_prepared_transactions = "
            f"{row[0] if row else '?'}, so it cannot prepare the transactions of the "
            "exactly-once PostgresSink: set max_prepared_transactions in postgresql.conf to at "
            "least twice the sink's parallelism (e.g. 64; ALTER SYSTEM SET "
            "max_prepared_transactions = 64) and restart the server, or use "
            "PostgresUpsertSink (idempotent, needs no prepared transactions)")


def prepared_of(conn: psycopg.Connection[Any], uid: str | None = None) -> list[str]:
    """The gids of Lockgate's prepared transactions in ``conn``'s database
    (of sink ``uid`` only, if given)."""
    rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                        "AND starts_with(gid, %s)", (GID_PREFIX,)).fetchall()
    gids = [str(r[0]) for r in rows]
    if uid is None:
        return sorted(gids)
    return sorted(g for g in gids if (p := parse_gid(g)) is not None and p.uid == uid)


@dataclass
class PgTxn:
    """The open transaction of a task: the rows written so far."""

    rows: int = 0


class PostgresSinkWriter(TwoPhaseCommitSinkWriter[PgTxn, PgTxnHandle]):
    """One task's transactions. Two connections: ``data`` holds the open
    transaction and prepares it; ``control`` (autocommit) commits and rolls
    back prepared ones, which cannot be done inside a transaction block."""

    def __init__(self, info: TaskInfo, sink: PostgresSink) -> None:
        super().__init__(info)
        self.sink = sink
        self.target = Target(sink.table, sink.columns)
        self._data: psycopg.Connection[Any] | None = None
        self._control: psycopg.Connection[Any] | None = None
        self._checkpoint_id = 0
        self._copy: Any = None

    # ---------------------------------------------------------- connections

    def _name(self) -> str:
        return f"lockgate-{self.info.uid}-{self.info.task_index}"

    def data(self) -> psycopg.Connection[Any]:
        if self._data is None:
            self._data = connect(self.sink.dsn, autocommit=False, application_name=self._name())
            if self.sink.statement is None:
                self.target.resolve(self._data)
                self._data.rollback()
                from psycopg import sql

                self._copy = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    self.target.table_sql(), self.target.columns_sql())
        return self._data

    def control(self) -> psycopg.Connection[Any]:
        if self._control is None:
            self._control = connect(self.sink.dsn, autocommit=True,
                                    application_name=self._name() + "-2pc")
        return self._control

    # ---------------------------------------------------------- 2PC hooks

    def decode_handle(self, entry: dict[str, Any]) -> PgTxnHandle:
        """A restored handle, checked: one of this sink's prepared transactions."""
        return check_handle(entry, self.info.uid)

    def recover(self, handles: list[Precommitted[PgTxnHandle]]) -> None:
        """Step 1. Plan from the prepared transactions of the database and
                the restored handles (all checked first).
        Step 2. Commit this task's handles, in checkpoint order (idempotent).
        Step 3. Roll back the prepared transactions no handle names."""
        # Step 1. Plan.
        info = self.info
        plan = plan_postgres_recovery(prepared_of(self.control(), info.uid), handles, info.uid,
                                      info.task_index, info.parallelism)
        # Step 2. Commit.
        for handle in plan.to_commit:
            self.commit(handle)
        # Step 3. Roll back.
        for gid in plan.to_roll_back:
            log.info("PostgreSQL sink %s: rolling back %s (not in the restored checkpoint)",
                     info.uid, gid)
            self._finish_prepared("ROLLBACK", gid)

    def begin_transaction(self) -> PgTxn:
        """Nothing to send: the first statement begins the transaction."""
        self.data()
        return PgTxn()

    def write(self, txn: PgTxn, batch: list[Any]) -> None:
        """Send ``batch`` now: COPY into the table, or the user's statement
        (executemany)."""
        conn = self.data()
        with conn.cursor() as cur:
            if self.sink.statement is not None:
                cur.executemany(self.sink.statement, batch)
            else:
                with cur.copy(self._copy) as copy:
                    for row in self.target.rows(batch):
                        copy.write_row(row)
        txn.rows += len(batch)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """As the base's, with the checkpoint id known to ``pre_commit`` (it
        names the prepared transaction)."""
        self._checkpoint_id = checkpoint_id
        return super().snapshot_state(checkpoint_id)

    def pre_commit(self, txn: PgTxn) -> PgTxnHandle:
        """``PREPARE TRANSACTION``: durable, invisible, not holding the
        connection; the handle names it and its xid."""
        from psycopg import sql

        info = self.info
        gid = make_gid(info.job_id, info.uid, info.task_index, info.attempt, self._checkpoint_id)
        conn = self.data()
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        conn.commit()  # the server ended the transaction; psycopg forgets it too
        return PgTxnHandle(gid, int(row[0]), txn.rows)

    def commit(self, entry: Precommitted[PgTxnHandle]) -> None:
        """``COMMIT PREPARED``; a gid no longer prepared must have committed
        (its xid's status), else its output was lost: raise."""
        gid, xid = entry.handle.gid, entry.handle.xid
        if self._finish_prepared("COMMIT", gid):
            return
        status = self._xact_status(gid, xid)
        if status == "committed":
            return
        if status is None:
            log.warning("PostgreSQL sink %s: %s is no longer prepared and too old for the "
                        "server to say whether it committed; taken as committed",
                        self.info.uid, gid)
            return
        raise OutputLostError(
            f"PostgreSQL sink {self.info.uid!r}: the prepared transaction {gid!r} of a "
            f"completed checkpoint was {status.replace('in progress', 'not committed')} by "
            "someone else (ROLLBACK PREPARED outside Lockgate, or another running job with "
            "the same sink uid on this database): its rows are lost. Restore the rows, or "
            "restart the job without this checkpoint's state")

    def abort(self, txn: PgTxn) -> None:
        """Roll back the open transaction."""
        if self._data is not None and not self._data.closed:
            self._data.rollback()

    # ------------------------------------------------------------ helpers

    def _finish_prepared(self, verb: str, gid: str) -> bool:
        """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` ``gid``; False if no
        such transaction is prepared (any more)."""
        from psycopg import errors, sql

        try:
            self.control().execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))
        except errors.UndefinedObject:
            return False
        return True

    def _xact_status(self, gid: str, xid: int) -> str | None:
        pg = import_psycopg()
        try:
            row = self.control().execute("SELECT pg_xact_status(%s::text::xid8)",
                                         (str(xid),)).fetchone()
        except pg.Error as e:  # e.g. "in the future": another server's xid
            raise OutputLostError(
                f"PostgreSQL sink {self.info.uid!r}: the prepared transaction {gid!r} of a "
                f"completed checkpoint is not on the server at {redact_dsn(self.sink.dsn)!r} "
                f"({str(e).strip()}): was the sink pointed at another database? Give it the "
                "database it wrote to, or restart the job without this checkpoint's state"
            ) from e
        return None if row is None or row[0] is None else str(row[0])

    def close(self) -> None:
        """Roll back the open transaction (its rows are replayed); prepared
        ones stay: a checkpoint names them, and the next restore of this sink
        (a restart, a resumed or a new job with this uid) commits or rolls
        them back."""
        pg = import_psycopg()
        try:
            super().close()
        except pg.Error as e:
            log.warning("PostgreSQL sink %s: rolling back at close failed: %s", self.info.uid, e)
        for conn in (self._data, self._control):
            if conn is not None:
                conn.close()
        self._data = self._control = None


class PostgresSink(Sink[Any]):
    """Exactly-once rows in a PostgreSQL table, committed when a checkpoint
    completes (two-phase commit: the server needs ``max_prepared_transactions``
    > 0).

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``).
        table: ``"table"`` or ``"schema.table"``; it must exist.
        columns: the columns a record fills: a dict record by name, a tuple in
            this order; ``None``: every column of the table.
        statement: instead of ``table``/``columns``, an INSERT (or any
            statement) with ``%s`` or ``%(name)s`` placeholders, run with
            each record as its parameters (``executemany``; COPY is faster).
    """

    exactly_once = True

    def __init__(self, dsn: str, table: str | None = None,
                 columns: Sequence[str] | None = None, *, statement: str | None = None) -> None:
        if (table is None) == (statement is None):
            raise ConfigurationError("PostgresSink: give either table (and columns) or statement")
        self.dsn = dsn
        self.table = table or ""
        self.columns = tuple(columns) if columns is not None else None
        self.statement = statement
        if table is not None:
            Target(table, columns)  # checks the names now

    def validate(self) -> None:
        """In the driver: the server is reachable, prepares transactions, and
        has the table and columns."""
        conn = connect(self.dsn, autocommit=True, application_name="lockgate-validate")
        try:
            check_two_phase_commit(conn, self.dsn)
            if self.statement is None:
                Target(self.table, self.columns).resolve(conn)
        finally:
            conn.close()

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        return PostgresSinkWriter(info, self)

    def __repr__(self) -> str:
        what = self.table if self.statement is None else "statement"
        return f"PostgresSink({redact_dsn(self.dsn)!r}, {what!r})"
