"""``PostgresCdcSource``: a consistent snapshot of PostgreSQL tables, then
their changes from logical replication (``pgoutput``), replayable from the
log position in Lockgate's checkpoint (docs/connectors/postgres-cdc.md).

The snapshot is read in primary-key chunks without locks (the watermark
algorithm of DBLog / Flink CDC: :mod:`lockgate.connectors.postgres_cdc_plan`);
the log is read with ``pg_logical_slot_peek_binary_changes`` over an
ordinary connection (psycopg 3), and the slot advances with
``pg_replication_slot_advance`` only when a checkpoint completes.

State (UNION): one entry ``{"cdc": 1, ...}`` that the task numbered 0
takes, whatever the parallelism: the reader of the snapshot and the stream.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.pgoutput import (
    Relation,
    decode_transactions,
    format_lsn,
    parse_lsn,
    parse_value,
)
from lockgate.connectors.postgres_cdc_plan import (
    Snapshot,
    after_position,
    check_position,
    emit_change,
    merge_chunk,
    skip,
    slot_target,
)
from lockgate.connectors.postgres_common import connect, import_psycopg, redact_dsn
from lockgate.errors import CheckpointCorruptError, ConfigurationError, LockgateError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresCdcSource", "ChangeEvent"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_KEY_TYPES = {"smallint", "integer", "bigint", "text", "character varying", "uuid"}
_TEXT_KEYS = {"text", "character varying"}


class ChangeEvent(NamedTuple):
    """One change: ``op`` is ``read`` (a snapshot row), ``insert``, ``update``,
    ``delete`` or ``truncate``; ``table`` is ``schema.name``; ``before`` /
    ``after`` the row (``before`` of an update only with ``REPLICA IDENTITY
    FULL`` or a changed key); ``lsn`` the commit LSN (a read: its chunk's high
    watermark); ``commit_ms`` the commit time in ms since the Unix epoch (a
    read: when its chunk was read), usable as event time."""

    op: str
    table: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    lsn: int
    commit_ms: int

    @property
    def row(self) -> dict[str, Any] | None:
        """The row as it is after the change (``before`` for a delete)."""
        return self.after if self.after is not None else self.before


def _qualified(table: str) -> tuple[str, str]:
    parts = table.split(".")
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise ConfigurationError(f"PostgresCdcSource: table {table!r} is not 'name' or "
                                 "'schema.name' (plain identifiers)")
    return parts[0], parts[1]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresCdcSource(Source[ChangeEvent]):
    """Snapshot + change stream of PostgreSQL tables, exactly once.

    Args:
        dsn: the server (``wal_level=logical``); the user needs REPLICATION
            (or superuser) and SELECT on the tables.
        tables: ``name`` or ``schema.name`` of each table; each needs a
            primary key of integer, text, varchar or uuid columns.
        slot: the logical replication slot (``pgoutput``), created at the
            first start if missing. One job per slot.
        publication: the publication, created ``FOR TABLE`` the tables if missing.
        snapshot: read the tables' rows first (else only the changes from now on).
        chunk_rows: rows per snapshot chunk.
        peek_changes: changes decoded per read of the log (at least).
        stop_message: a bounded source: it ends after reading a logical
            decoding message with this prefix from the log, written with
            ``SELECT pg_logical_emit_message(true, '<prefix>', '')`` (a
            drain point the database chooses); ``None``: read forever.
    """

    replayable = True
    bounded = False
    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, dsn: str, tables: Sequence[str] | str, *, slot: str,
                 publication: str | None = None, snapshot: bool = True,
                 chunk_rows: int = 4096, peek_changes: int = 4096,
                 stop_message: str | None = None) -> None:
        names = [tables] if isinstance(tables, str) else list(tables)
        if not names:
            raise ConfigurationError("PostgresCdcSource: name at least one table")
        self.tables = [".".join(_qualified(t)) for t in names]
        if len(set(self.tables)) != len(self.tables):
            raise ConfigurationError(f"PostgresCdcSource: a table is named twice in {names}")
        for what, name in (("slot", slot), ("publication", publication or slot)):
            if not re.fullmatch(r"[a-z0-9_]{1,63}", name):
                raise ConfigurationError(
                    f"PostgresCdcSource: {what} {name!r} must be lower-case letters, digits "
                    "and '_' (at most 63)")
        if chunk_rows < 1 or peek_changes < 1:
            raise ConfigurationError("PostgresCdcSource: chunk_rows and peek_changes must be >= 1")
        self.dsn = dsn
        self.slot = slot
        self.publication = publication or slot
        self.snapshot = snapshot
        self.chunk_rows = chunk_rows
        self.peek_changes = peek_changes
        self.stop_message = stop_message
        self.bounded = stop_message is not None
        self.start_lsn = 0
        """The slot's confirmed position when the job was prepared (fresh start)."""

    def __repr__(self) -> str:
        return f"PostgresCdcSource({redact_dsn(self.dsn)!r}, {self.tables!r}, slot={self.slot!r})"

    def validate(self) -> None:
        """In the driver: the server has ``wal_level=logical``, the tables
        exist with supported primary keys."""
        with connect(self.dsn, autocommit=True, application_name="lockgate-cdc") as conn:
            level = conn.execute("SHOW wal_level").fetchone()
            if not level or level[0] != "logical":
                raise ConfigurationError(
                    f"PostgresCdcSource: the server at {redact_dsn(self.dsn)!r} has wal_level="
                    f"{level[0] if level else '?'}; logical decoding needs wal_level=logical: "
                    "set it in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and "
                    "restart the server")
            for table in self.tables:
                table_key(conn, table)

    def prepare(self, job_dir: str, uid: str) -> None:
        """Once per job, in the driver: create the publication and the slot
        if missing; note the slot's position (where a fresh start reads from)."""
        with connect(self.dsn, autocommit=True, application_name="lockgate-cdc") as conn:
            if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                                (self.publication,)).fetchone():
                conn.execute(f"CREATE PUBLICATION {_q(self.publication)} FOR TABLE "
                             + ", ".join(".".join(_q(p) for p in _qualified(t))
                                         for t in self.tables))
            row = conn.execute("SELECT plugin, confirmed_flush_lsn::text FROM "
                               "pg_replication_slots WHERE slot_name = %s",
                               (self.slot,)).fetchone()
            if row is None:
                row = conn.execute("SELECT 'pgoutput', lsn::text FROM "
                                   "pg_create_logical_replication_slot(%s, 'pgoutput')",
                                   (self.slot,)).fetchone()
            assert row is not None
            if row[0] != "pgoutput":
                raise ConfigurationError(
                    f"PostgresCdcSource: slot {self.slot!r} uses plugin {row[0]!r}, not "
                    f"'pgoutput': drop it (SELECT pg_drop_replication_slot('{self.slot}')) "
                    "or name another slot")
            self.start_lsn = parse_lsn(row[1])

    def initial_state(self) -> dict[str, Any]:
        return {"cdc": 1, "slot": self.slot, "pos": [self.start_lsn, 0, 0],
                "table": 0 if self.snapshot else len(self.tables), "lower": None,
                "chunks": {t: [] if self.snapshot else [[None, 0]] for t in self.tables},
                "pending": [], "ended": False, "max": None}

    def create_reader(self, info: TaskInfo) -> PostgresCdcReader:
        return PostgresCdcReader(self, info)


def table_key(conn: psycopg.Connection[Any], table: str) -> tuple[list[str], list[str]]:
    """The table's primary key columns and their types; a ConfigurationError
    if it has none or one of a type the chunks cannot order."""
    schema, name = _qualified(table)
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
        "WHERE i.indisprimary AND n.nspname = %s AND c.relname = %s ORDER BY k.ord",
        (schema, name)).fetchall()
    if not rows:
        exists = conn.execute("SELECT to_regclass(%s)", (f"{_q(schema)}.{_q(name)}",)).fetchone()
        if not exists or exists[0] is None:
            raise ConfigurationError(f"PostgresCdcSource: table {table!r} does not exist")
        raise ConfigurationError(f"PostgresCdcSource: table {table!r} has no primary key; "
                                 "the snapshot chunks and the change events need one: add it")
    bad = [f"{c} {t}" for c, t in rows if t.split("(")[0] not in _KEY_TYPES]
    if bad:
        raise ConfigurationError(
            f"PostgresCdcSource: primary key column(s) {bad} of {table!r} have a type the "
            f"snapshot cannot cut into chunks; supported: {sorted(_KEY_TYPES)}")
    return [c for c, _ in rows], [t.split("(")[0] for _, t in rows]


def _check_state(entry: Any, source: PostgresCdcSource) -> dict[str, Any]:
    ok = (isinstance(entry, dict) and entry.get("cdc") == 1
          and isinstance(entry.get("chunks"), dict) and isinstance(entry.get("pending"), list)
          and type(entry.get("table")) is int and 0 <= entry["table"] <= len(source.tables))
    if not ok:
        raise CheckpointCorruptError(
            f"PostgreSQL CDC source: restored state entry {entry!r:.100} is not this source's: "
            "restore with the source that wrote the checkpoint")
    if entry.get("slot") != source.slot:
        raise ConfigurationError(
            f"PostgresCdcSource: the checkpoint read slot {entry.get('slot')!r:.70}, this "
            f"source names {source.slot!r}: restore with the same slot, or start fresh")
    if entry.get("tables", source.tables) != source.tables and entry["table"] < len(source.tables):
        raise ConfigurationError("PostgresCdcSource: the tables changed in the middle of the "
                                 "snapshot: restore with the same tables, or start fresh")
    entry["pos"] = check_position(entry.get("pos"))
    for field in ("lower", "max"):
        if entry.get(field) is not None and not isinstance(entry[field], list):
            raise CheckpointCorruptError(
                f"PostgreSQL CDC source: restored {field} key {entry[field]!r:.60} is damaged")
    for table, chunks in entry["chunks"].items():
        if not isinstance(table, str) or not isinstance(chunks, list) or not all(
                isinstance(c, list) and len(c) == 2 and type(c[1]) is int
                and (c[0] is None or isinstance(c[0], list)) for c in chunks):
            raise CheckpointCorruptError(
                f"PostgreSQL CDC source: restored chunks of {table!r:.60} are damaged")
    return dict(entry)


class PostgresCdcReader(SourceReader[ChangeEvent]):
    """The task numbered 0 reads the snapshot chunks, then the stream; the
    other tasks have nothing to read (downstream operators scale out)."""

    def __init__(self, source: PostgresCdcSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.state: dict[str, Any] | None = None
        self.conn: psycopg.Connection[Any] | None = None
        self.relations: dict[int, Relation] = {}
        self.buffer: deque[tuple[ChangeEvent | None, list[int]]] = deque()
        self._decoded = 0
        """Rows the last read of the log returned (the next decodes past them)."""
        self.targets: dict[int, int] = {}
        self.advanced = 0
        self._stopped = False

    # ------------------------------------------------------------ lifecycle
    def restore(self, state: list[Any] | None) -> None:
        entries = [e for e in (state or []) if isinstance(e, dict) and e.get("cdc")]
        if state is not None and len(entries) > 1:
            raise CheckpointCorruptError("PostgreSQL CDC source: the checkpoint holds "
                                         f"{len(entries)} positions, one expected")
        if self.info.task_index != 0:
            return
        if state is None or not entries:
            self.state = self.source.initial_state()
        else:
            self.state = _check_state(dict(entries[0]), self.source)
        self.state["tables"] = self.source.tables
        self.conn = connect(self.source.dsn, autocommit=True,
                            application_name=f"lockgate-cdc-{self.info.uid}")
        self._check_slot()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _check_slot(self) -> None:
        """The slot exists and has not moved past the restored position."""
        assert self.conn is not None and self.state is not None
        row = self.conn.execute("SELECT confirmed_flush_lsn::text, plugin FROM "
                                "pg_replication_slots WHERE slot_name = %s",
                                (self.source.slot,)).fetchone()
        if row is None:
            raise LockgateError(
                f"PostgresCdcSource: replication slot {self.source.slot!r} does not exist (it "
                "was dropped): the changes since the checkpoint are lost to it; start the job "
                "fresh (not from a checkpoint or savepoint): it creates the slot and takes a "
                "new snapshot")
        confirmed = parse_lsn(row[0])
        self.advanced = confirmed
        need = slot_target(self.state["pos"])
        if confirmed > need:
            raise LockgateError(
                f"PostgresCdcSource: slot {self.source.slot!r} has advanced to {row[0]}, past "
                f"the position this checkpoint reads from ({format_lsn(need)}): the server no "
                "longer has those changes (an older savepoint, or another job reads this "
                "slot). Restore the latest checkpoint, or start fresh with a new slot")

    # --------------------------------------------------------------- reading
    def poll(self, max_records: int) -> list[ChangeEvent] | None:
        state = self.state
        if state is None:  # not the reading task
            return None if self.source.bounded else []
        if state["pending"]:
            return self._take_pending(max_records)
        if state["table"] < len(self.source.tables):
            self._read_chunk()
            return self._take_pending(max_records)
        if not self.buffer:
            if state.get("ended"):
                return None
            self._fetch()
        out: list[ChangeEvent] = []
        while self.buffer and len(out) < max_records:
            event, pos = self.buffer.popleft()
            state["pos"] = pos
            if event is not None:
                out.append(event)
        if self._stopped and not self.buffer:
            state["ended"] = True  # kept in the checkpoint: a restore ends too
        return out

    def _take_pending(self, n: int) -> list[ChangeEvent]:
        assert self.state is not None
        pending = self.state["pending"]
        take, self.state["pending"] = pending[:n], pending[n:]
        return [ChangeEvent("read", t, None, row, high, ms) for t, row, high, ms in take]

    def _peek(self, upto_lsn: int | None, changes: int | None) -> list[bytes]:
        """Rows of the slot from its confirmed position (not consuming them)."""
        assert self.conn is not None
        pg = import_psycopg()
        deadline = time.monotonic() + 60
        while True:
            try:
                cur = self.conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
                    "'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
                    (self.source.slot, None if upto_lsn is None else format_lsn(upto_lsn),
                     changes, self.source.publication))
                return [r[0] for r in cur.fetchall()]
            except pg.errors.ObjectInUse:
                # the slot is still held by the backend of a task that died
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except pg.errors.UndefinedObject as e:
                raise LockgateError(
                    f"PostgresCdcSource: {str(e).strip()}: the slot was dropped; start the "
                    "job fresh (it creates the slot and takes a new snapshot)") from e
            except pg.Error as e:
                if "has already been removed" in str(e):
                    raise LockgateError(
                        f"PostgresCdcSource: {str(e).strip()}: the server no longer has the "
                        "log from the slot's position; start the job fresh with a new slot "
                        "(and keep max_slot_wal_keep_size large enough)") from e
                raise

    def _fetch(self) -> None:
        """Decode the log after the position into the buffer (events the
        snapshot already holds come as None: they only move the position)."""
        assert self.state is not None
        state = self.state
        n = self._decoded + max(self.source.peek_changes, self._decoded)  # geometric growth
        while True:
            rows = self._peek(None, n)
            self._decoded = len(rows)
            final, _index, end = state["pos"]
            txns = decode_transactions(rows, self.relations, (final, bool(end)))
            for txn in txns:
                first = skip(state["pos"], txn)
                for i in range(first, len(txn.changes)):
                    change = txn.changes[i]
                    pos = after_position(txn, i + 1)
                    if (change.op == "message" and change.after
                            and change.after["prefix"] == self.source.stop_message):
                        self.buffer.append((None, pos))
                        self._stopped = True
                        return
                    emitted = emit_change(change, txn.final_lsn, state["chunks"])
                    if not emitted:
                        self.buffer.append((None, pos))
                    for op, before, after in emitted:
                        self.buffer.append((ChangeEvent(op, txn.changes[i].table, before, after,
                                                        txn.final_lsn, txn.commit_ms), pos))
            if self.buffer or len(rows) < n:
                if not self.buffer:
                    time.sleep(0.02)  # nothing new: do not spin on the server
                return
            n *= 2  # everything decoded was read already: decode further

    def _read_chunk(self) -> None:
        """Read the next snapshot chunk (rows merged up to its high
        watermark) into ``pending``; move on to the next chunk or table."""
        assert self.conn is not None and self.state is not None
        state = self.state
        table = self.source.tables[state["table"]]
        schema, name = _qualified(table)
        key, key_types = table_key(self.conn, table)
        lower = None if state["lower"] is None else tuple(state["lower"])
        cols = self.conn.execute(
            "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f"{_q(schema)}.{_q(name)}",)).fetchall()
        order = ", ".join("t." + _q(k) + (' COLLATE "C"' if t in _TEXT_KEYS else "")
                          for k, t in zip(key, key_types, strict=True))
        where = ""
        params: list[Any] = []
        if lower is not None:
            where = (f"WHERE ({order}) > ("
                     + ", ".join(f"%s::{t}" + (' COLLATE "C"' if t in _TEXT_KEYS else "")
                                 for t in key_types) + ")")
            params = [str(v) for v in lower]
        # The last chunk: past the largest key the table had when its
        # snapshot began, no LIMIT (rows appended since then, all at once),
        # so that a snapshot ends even while writers append faster than it reads.
        last = (lower is not None and state.get("max") is not None
                and lower >= tuple(state["max"]))
        limit = "" if last else f" LIMIT {self.source.chunk_rows}"
        select = (f"SELECT {', '.join(_q(c) + '::text' for c, _ in cols)} FROM "
                  f"{_q(schema)}.{_q(name)} AS t {where} ORDER BY {order}{limit}")
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            snap_row = self.conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            got = self.conn.execute(select, params).fetchall()
            if lower is None:  # the table's first chunk: note its largest key
                top = self.conn.execute(
                    f"SELECT {', '.join('t.' + _q(k) + '::text' for k in key)} FROM "
                    f"{_q(schema)}.{_q(name)} AS t ORDER BY "
                    + ", ".join(o + " DESC" for o in order.split(", ")) + " LIMIT 1").fetchone()
                types = {c: t for c, t in cols}
                state["max"] = (None if top is None else
                                [parse_value(types[k], v) for k, v in zip(key, top, strict=True)])
        assert snap_row is not None
        snapshot = Snapshot.parse(snap_row[0])
        with self.conn.transaction():
            # the high watermark: a log record after the SELECT, committed
            # with a flush, so the slot can decode everything before it
            self.conn.execute("SET LOCAL synchronous_commit = on")
            high_row = self.conn.execute(
                "SELECT pg_logical_emit_message(true, 'lockgate-cdc', 'w')::text, "
                "(extract(epoch from clock_timestamp()) * 1000)::bigint").fetchone()
        assert high_row is not None
        high, now_ms = parse_lsn(high_row[0]), int(high_row[1])
        rows = {}
        for values in got:
            row = {c: parse_value(t, v) for (c, t), v in zip(cols, values, strict=True)}
            rows[tuple(row[k] for k in key)] = row
        upper = max(rows) if not last and len(got) >= self.source.chunk_rows else None
        txns = decode_transactions(self._peek(high, None), self.relations)
        merged = merge_chunk(rows, txns, snapshot, high, table, key, lower, upper)
        state["pending"] = [[table, merged[k], high, now_ms] for k in sorted(merged)]
        state["chunks"].setdefault(table, []).append([None if upper is None else list(upper),
                                                      high])
        if upper is None:
            state["table"] += 1
            state["lower"] = state["max"] = None
        else:
            state["lower"] = list(upper)

    # ------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if self.state is None:
            return []
        self.targets[checkpoint_id] = slot_target(self.state["pos"])
        return [{**self.state, "pending": list(self.state["pending"])}]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [c for c in self.targets if c <= checkpoint_id]
        if not done or self.conn is None:
            return
        target = max(self.targets[c] for c in done)
        for c in done:
            del self.targets[c]
        if target <= self.advanced:
            return
        pg = import_psycopg()
        try:
            self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                              (self.source.slot, format_lsn(target)))
        except pg.errors.ObjectInUse:
            return  # held for a moment by a backend of a task that died: next time
        self.advanced = target
        self._decoded = 0  # the slot starts later now: fewer rows before the position
