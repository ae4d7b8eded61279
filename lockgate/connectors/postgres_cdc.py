"""``PostgresCdcSource``: a consistent snapshot of PostgreSQL tables, then
their changes from logical replication (``pgoutput``), replayable from the
log position in Lockgate's checkpoint (docs/connectors/postgres-cdc.md).

The snapshot is cut into primary-key chunks in the driver; the chunks are
splits spread over the source's tasks, each read without locks as of its
own high watermark (the watermark algorithm of DBLog / Flink CDC:
:mod:`lockgate.connectors.postgres_cdc_plan`); the stream (one reader per
slot) is task 0's and starts once every chunk is done
(:mod:`lockgate.connectors.cdc_splits`: the state entries, how a restore at
any parallelism deals them out, the hand-over). The log is read with
``pg_logical_slot_peek_binary_changes`` over an ordinary connection
(psycopg 3), and the slot advances with ``pg_replication_slot_advance``
only when a checkpoint completes.
"""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.cdc import ChangeEvent, take_buffered, take_chunk
from lockgate.connectors.cdc_splits import (
    ANNOUNCE_PREFIX,
    Share,
    announcement,
    check_restored,
    chunk_done,
    deal,
    initial_entries,
    read_announcement,
    state_entries,
    stream_watermarks,
)
from lockgate.connectors.pgoutput import (
    Relation,
    decode_message,
    decode_transactions,
    format_lsn,
    native,
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
from lockgate.errors import ConfigurationError, LockgateError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresCdcSource", "ChangeEvent"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_KEY_TYPES = {"smallint", "integer", "bigint", "text", "character varying", "uuid"}
_TEXT_KEYS = {"text", "character varying"}
_WATCH_S = 0.5
"""At least this long between two reads of the log for announced chunks."""
_SLOT_BUSY_S = 300.0
"""How long a read of the log waits for the slot another backend holds."""
_WHAT = "PostgreSQL CDC source"
_NEVER = 1 << 64
"""Above every log position."""


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
        chunk_rows: rows per snapshot chunk (as the table is when the job starts).
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
        self.boundaries: dict[str, list[list[Any]]] | None = None
        """Each table's chunk boundaries when the job was prepared (fresh start)."""
        self.run_id = ""
        """This run of the job (announcements of other runs are not its own)."""

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
        if missing; note the slot's position (where a fresh start reads
        from) and cut the tables into chunks."""
        self.run_id = uuid.uuid4().hex
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
            if self.snapshot:
                self.boundaries = {t: chunk_boundaries(conn, t, self.chunk_rows)
                                   for t in self.tables}

    def initial_entries(self) -> list[dict[str, Any]]:
        """The state of a fresh start (:func:`~lockgate.connectors.cdc_splits.initial_entries`)."""
        if self.snapshot and self.boundaries is None:
            raise LockgateError("PostgresCdcSource: the source was not prepared (its chunks "
                                "are cut in the driver before the job starts)")
        return initial_entries(self.tables, self.boundaries if self.snapshot else None,
                               [self.start_lsn, 0, 0], slot=self.slot)

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


def text_loaders(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn`` read a text-format column as the stream decodes one
    (:func:`~lockgate.connectors.pgoutput.parse_value`): integer, float and
    boolean types as Python values (psycopg's own loaders), every other type
    as its text form, so that a snapshot row equals the stream's."""
    from psycopg.pq import Format

    text = conn.adapters.get_loader(0, Format.TEXT)  # psycopg's loader of unknown types
    for info in conn.adapters.types:
        for oid in (info.oid, info.array_oid):
            if oid and not native(oid):
                conn.adapters.register_loader(oid, text)  # type: ignore[arg-type]


def _columns(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, int]]:
    """The table's columns and their type oids, in order."""
    schema, name = _qualified(table)
    return [(c, t) for c, t in conn.execute(
        "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (f"{_q(schema)}.{_q(name)}",)).fetchall()]


_DOMAIN_COLUMNS = (
    "SELECT a.attname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
    "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
    "AND t.typtype = 'd'")
"""The table's columns whose type is a domain: the log names the domain's
type (its value: the text form), a SELECT the base type (an integer, ...)."""


def _raw_text(cur: Any, rows: list[Any], at: list[int]) -> list[Any]:
    """``rows`` (of ``cur``'s text-format result) with the columns ``at`` as
    the server wrote them (its output text)."""
    result = cur.pgresult
    out = []
    for r, values in enumerate(rows):
        values = list(values)
        for i in at:
            raw = result.get_value(r, i)
            values[i] = None if raw is None else bytes(raw).decode()
        out.append(tuple(values))
    return out


def _key_order(key: list[str], key_types: list[str], prefix: str = "t.") -> str:
    """The key columns as the chunks order them (text in byte order, as
    Python compares the keys)."""
    return ", ".join(prefix + _q(k) + (' COLLATE "C"' if t in _TEXT_KEYS else "")
                     for k, t in zip(key, key_types, strict=True))


def chunk_boundaries(conn: psycopg.Connection[Any], table: str, chunk_rows: int
                     ) -> list[list[Any]]:
    """The keys that cut ``table`` into chunks of ``chunk_rows`` rows as it
    is now: every ``chunk_rows``-th key in key order (one scan of the key)."""
    schema, name = _qualified(table)
    key, key_types = table_key(conn, table)
    types = dict(_columns(conn, table))
    rows = conn.execute(
        f"SELECT {', '.join('s.' + _q(k) + '::text' for k in key)} FROM (SELECT "
        f"{', '.join('t.' + _q(k) for k in key)}, row_number() OVER (ORDER BY "
        f"{_key_order(key, key_types)}) AS lockgate_chunk_row_ FROM {_q(schema)}.{_q(name)} "
        "AS t) AS s WHERE s.lockgate_chunk_row_ %% %s = 0 ORDER BY s.lockgate_chunk_row_",
        (chunk_rows,)).fetchall()
    return [[parse_value(types[k], v) for k, v in zip(key, r, strict=True)] for r in rows]


class PostgresCdcReader(SourceReader[ChangeEvent]):
    """One task's share: its snapshot chunks, in chunk order; on task 0 also
    the stream, once every chunk is done (``stream["hw"]`` set)."""

    def __init__(self, source: PostgresCdcSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.stream: dict[str, Any] | None = None
        """The stream entry (task 0)."""
        self.todo: deque[dict[str, Any]] = deque()
        """This task's chunks with work left (unread or emitting), in order."""
        self.done: list[dict[str, Any]] = []
        """This task's chunks read and emitted."""
        self.layout: dict[int, dict[str, Any]] = {}
        """The stream's owner before the stream starts: every chunk by number."""
        self.known: dict[int, int] = {}
        """... and the high watermarks of those done in a completed checkpoint."""
        self.announced: set[int] = set()
        self.done_at: dict[int, list[dict[str, Any]]] = {}
        """Per checkpoint: this task's done chunks its snapshot holds, not announced yet."""
        self.conn: psycopg.Connection[Any] | None = None
        self.keys: dict[str, tuple[list[str], list[str]]] = {}
        """Each table's primary key (columns, types), read at its first chunk."""
        self.relations: dict[int, Relation] = {}
        self.buffer: deque[tuple[ChangeEvent | None, list[int]]] = deque()
        self._decoded = 0
        """Rows the last read of the log returned (the next decodes past them)."""
        self.targets: dict[int, int] = {}
        self.advanced = 0
        self._stopped = False
        self._watched = 0.0
        self._watch_s = _WATCH_S

    # ------------------------------------------------------------ lifecycle
    def restore(self, state: list[Any] | None) -> None:
        stream, chunks = check_restored(state, self.source.initial_entries, self.source.tables,
                                        _WHAT, check_position)
        if stream.get("slot") != self.source.slot:
            raise ConfigurationError(
                f"PostgresCdcSource: the checkpoint read slot {stream.get('slot')!r:.70}, this "
                f"source names {self.source.slot!r}: restore with the same slot, or start fresh")
        share: Share = deal(stream, chunks, self.info.task_index, self.info.parallelism)
        self.stream, self.layout = share.stream, share.layout
        self.todo, self.done = share.todo(), share.done()
        self.announced = {c["id"] for c in self.done}  # done in a completed checkpoint
        self.known = {n: c["hw"] for n, c in self.layout.items() if chunk_done(c)}
        if self.stream is None and not share.chunks:
            return  # nothing to read: no connection
        self.conn = connect(self.source.dsn, autocommit=True,
                            application_name=f"lockgate-cdc-{self.info.uid}")
        text_loaders(self.conn)
        if self.stream is not None:
            self._check_slot()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _check_slot(self) -> None:
        """The slot exists and has not moved past the restored position."""
        assert self.conn is not None and self.stream is not None
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
        need = slot_target(self.stream["pos"])
        if confirmed > need:
            raise LockgateError(
                f"PostgresCdcSource: slot {self.source.slot!r} has advanced to {row[0]}, past "
                f"the position this checkpoint reads from ({format_lsn(need)}): the server no "
                "longer has those changes (an older savepoint, or another job reads this "
                "slot). Restore the latest checkpoint, or start fresh with a new slot")

    # --------------------------------------------------------------- reading
    def poll(self, max_records: int) -> list[ChangeEvent] | None:
        if self.todo:
            return take_chunk(self.todo, self.done, max_records, self._read_chunk)
        stream = self.stream
        if stream is None:  # chunks only: ended once they are announced
            if self.source.bounded and all(c["id"] in self.announced for c in self.done):
                return None
            return []
        if stream["hw"] is None and not self._start_stream():
            return []
        if not self.buffer:
            if stream.get("ended"):
                return None
            self._fetch()
        return take_buffered(self.buffer, stream, max_records, self._stopped)

    def _start_stream(self) -> bool:
        """Start the stream if every chunk is done in a completed checkpoint
        (this task's own: done); read the log for the announcements of the
        others' (at most every ``_WATCH_S`` seconds, longer when a read takes
        long)."""
        assert self.stream is not None
        for c in self.done:
            self.known[c["id"]] = c["hw"]
        if len(self.known) < len(self.layout):
            now = time.monotonic()
            if now - self._watched < self._watch_s:
                return False
            self._read_announcements()
            took = time.monotonic() - now
            self._watched = time.monotonic()
            self._watch_s = max(_WATCH_S, 4 * took)
            if len(self.known) < len(self.layout):
                return False
        # From the position of the job's start (every change before the
        # lowest high watermark is a chunk's, but a stop message there is not)
        self.stream["hw"] = stream_watermarks(self.layout, self.known)
        self.layout, self.known = {}, {}
        log.info("%s %s: every snapshot chunk is done; the stream starts at %s", _WHAT,
                 self.info.uid, format_lsn(slot_target(self.stream["pos"])))
        return True

    def _read_announcements(self) -> None:
        assert self.conn is not None
        for data in self._peek(None, None, messages_only=True):
            message = decode_message(data)
            if message is not None and message[0] == ANNOUNCE_PREFIX:
                self.known.update(read_announcement(message[1], self.source.run_id,
                                                    self.info.attempt, self.layout))

    def _peek(self, upto_lsn: int | None, changes: int | None, *,
              messages_only: bool = False) -> list[bytes]:
        """Rows of the slot from its confirmed position (not consuming them);
        ``messages_only``: its logical decoding messages only."""
        assert self.conn is not None
        pg = import_psycopg()
        deadline = time.monotonic() + _SLOT_BUSY_S
        where = " WHERE get_byte(data, 0) = 77" if messages_only else ""  # 'M'
        while True:
            try:
                cur = self.conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
                    "'proto_version', '1', 'publication_names', %s, 'messages', 'true')"
                    + where,
                    (self.source.slot, None if upto_lsn is None else format_lsn(upto_lsn),
                     changes, self.source.publication), binary=True)  # bytea as it is
                return [r[0] for r in cur.fetchall()]
            except pg.errors.ObjectInUse:
                # the slot is held by another task's read of it, or still by
                # the backend of a task that died
                if time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.05))
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
        assert self.stream is not None
        stream = self.stream
        stop = self.source.stop_message
        # a change committed at or after the highest watermark of its table
        # is the stream's whatever its key: no lookup
        tops = {t: max(c[1] for c in cs) for t, cs in stream["hw"].items() if cs}
        n = self._decoded + max(self.source.peek_changes, self._decoded)  # geometric growth
        buffer = self.buffer
        while True:
            rows = self._peek(None, n)
            self._decoded = len(rows)
            final, _index, end = stream["pos"]
            txns = decode_transactions(rows, self.relations, (final, bool(end)))
            for txn in txns:
                first = skip(stream["pos"], txn)
                lsn, ms, count = txn.final_lsn, txn.commit_ms, len(txn.changes)
                for i in range(first, count):
                    change = txn.changes[i]
                    pos = after_position(txn, i + 1)
                    if change.op == "message":
                        buffer.append((None, pos))
                        if change.after and change.after["prefix"] == stop:
                            self._stopped = True
                            return
                        continue
                    if lsn >= tops.get(change.table, _NEVER):
                        buffer.append((ChangeEvent(change.op, change.table, change.before,
                                                   change.after, lsn, ms), pos))
                        continue
                    emitted = emit_change(change, lsn, stream["hw"])
                    if not emitted:
                        buffer.append((None, pos))
                    for op, before, after in emitted:
                        buffer.append((ChangeEvent(op, change.table, before, after, lsn, ms),
                                       pos))
            if buffer or len(rows) < n:
                if not buffer:
                    time.sleep(0.02)  # nothing new: do not spin on the server
                return
            n *= 2  # everything decoded was read already: decode further

    def _read_chunk(self, chunk: dict[str, Any]) -> None:
        """Read ``chunk`` as of a high watermark: its rows (merged up to the
        high watermark) become its ``rows``. One round trip reads the rows
        and writes the high watermark, one more reads the log up to it."""
        assert self.conn is not None
        conn = self.conn
        table = chunk["table"]
        schema, name = _qualified(table)
        key, key_types = self._table_key(table)
        order = _key_order(key, key_types)
        bound = ", ".join(f"%s::{t}" + (' COLLATE "C"' if t in _TEXT_KEYS else "")
                          for t in key_types)
        lower, upper = chunk["lower"], chunk["upper"]
        conds, params = [], []
        if lower is not None:
            conds.append(f"({order}) > ({bound})")
            params += [str(v) for v in lower]
        if upper is not None:
            conds.append(f"({order}) <= ({bound})")
            params += [str(v) for v in upper]
        select = (f"SELECT * FROM {_q(schema)}.{_q(name)} AS t"
                  + (" WHERE " + " AND ".join(conds) if conds else "") + f" ORDER BY {order}")
        # In order on the server, sent at once: the rows in a snapshot, then
        # the high watermark, a log record after the SELECT committed with a
        # flush (the slot can decode everything before it).
        with conn.pipeline():
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            snap_cur = conn.execute("SELECT pg_current_snapshot()::text")
            domains_cur = conn.execute(_DOMAIN_COLUMNS, (f"{_q(schema)}.{_q(name)}",))
            rows_cur = conn.execute(select, params)
            conn.execute("COMMIT")
            conn.execute("BEGIN")
            conn.execute("SET LOCAL synchronous_commit = on")
            high_cur = conn.execute(
                "SELECT pg_logical_emit_message(true, 'lockgate-cdc', 'w')::text, "
                "(extract(epoch from clock_timestamp()) * 1000)::bigint")
            conn.execute("COMMIT")
        snap_row, high_row = snap_cur.fetchone(), high_cur.fetchone()
        got = rows_cur.fetchall()
        assert snap_row is not None and high_row is not None and rows_cur.description
        snapshot = Snapshot.parse(snap_row[0])
        high, now_ms = parse_lsn(high_row[0]), int(high_row[1])
        columns = [d.name for d in rows_cur.description]
        domains = {r[0] for r in domains_cur.fetchall()}
        if domains:  # as the log has them: their text (a SELECT names the base type)
            got = _raw_text(rows_cur, got, [i for i, c in enumerate(columns) if c in domains])
        at = [columns.index(k) for k in key]
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        if len(at) == 1:
            i = at[0]
            for values in got:
                rows[(values[i],)] = dict(zip(columns, values, strict=True))
        else:
            for values in got:
                rows[tuple(values[i] for i in at)] = dict(zip(columns, values, strict=True))
        # only what the SELECT did not see can change the chunk
        txns = decode_transactions(self._peek(high, None), self.relations,
                                   wanted=lambda xid, lsn: lsn < high and not snapshot.sees(xid))
        merged = merge_chunk(rows, txns, snapshot, high, table, key,
                             None if lower is None else tuple(lower),
                             None if upper is None else tuple(upper))
        chunk["rows"] = [merged[k] for k in sorted(merged)]
        chunk["hw"], chunk["ms"] = high, now_ms

    def _table_key(self, table: str) -> tuple[list[str], list[str]]:
        """:func:`table_key`, read once per table."""
        assert self.conn is not None
        found = self.keys.get(table)
        if found is None:
            found = self.keys[table] = table_key(self.conn, table)
        return found

    # ------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        out: list[Any] = state_entries(self.stream, self.todo, self.done)
        if self.stream is not None and self.stream["hw"] is not None:
            self.targets[checkpoint_id] = slot_target(self.stream["pos"])
        fresh = [c for c in self.done if c["id"] not in self.announced]
        if fresh and self.stream is None:
            self.done_at[checkpoint_id] = fresh
        return out

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._announce(checkpoint_id)
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

    def _announce(self, checkpoint_id: int) -> None:
        """Tell the stream's owner, through the log, which of this task's
        chunks are done in a completed checkpoint."""
        ready = [c for k in sorted(self.done_at) if k <= checkpoint_id
                 for c in self.done_at.pop(k) if c["id"] not in self.announced]
        if not ready or self.conn is None:
            return
        ready = list({c["id"]: c for c in ready}.values())
        with self.conn.transaction():
            self.conn.execute("SET LOCAL synchronous_commit = on")
            self.conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                              (ANNOUNCE_PREFIX, announcement(self.source.run_id,
                                                             self.info.attempt, ready)))
        self.announced.update(c["id"] for c in ready)
