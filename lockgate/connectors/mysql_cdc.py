"""``MySqlCdcSource``: a consistent snapshot of MariaDB / MySQL tables, then
their changes from the binary log (row format), replayable from the binlog
position in Lockgate's checkpoint (docs/connectors/mysql-cdc.md).

The snapshot is read in primary-key chunks, each in a transaction ``WITH
CONSISTENT SNAPSHOT`` whose binlog position is exact: MariaDB's (and Percona
Server's) ``binlog_snapshot_file`` / ``binlog_snapshot_position``, or, where
the server has none (MySQL), the position read while a second session holds
``LOCK TABLES ... READ`` on the table for the moment the snapshot begins.
That position is the chunk's high watermark (:mod:`lockgate.connectors.cdc`).
The binlog is read with mysql-replication (``pymysqlreplication``), the
snapshot with PyMySQL; positions are binlog file + offset and, where the
server has GTIDs, its GTID state (:mod:`lockgate.connectors.mysql_cdc_plan`).

State (UNION): the entries of :mod:`lockgate.connectors.cdc_splits` (the
stream and one per chunk), all of them the task numbered 0's, whatever the
parallelism: the reader of the snapshot and the stream.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote, urlsplit

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.cdc import Change, ChangeEvent, emit_change, take_buffered, take_chunk
from lockgate.connectors.cdc_splits import (
    check_restored,
    deal,
    initial_entries,
    state_entries,
    stream_watermarks,
)
from lockgate.connectors.mysql_cdc_plan import (
    boundaries_select,
    check_position,
    chunk_select,
    column_kind,
    coordinate,
    key_type_ok,
    next_gtid_state,
    quote,
    snapshot_values,
    stream_values,
    truncated_table,
)
from lockgate.errors import ConfigurationError, LockgateError
from lockgate.redact import redact

__all__ = ["MySqlCdcSource"]

log = logging.getLogger(__name__)

INSTALL = "pip install 'lockgate[cdc]'"
_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")
_METHODS = ("auto", "snapshot_status", "lock_tables")
_WHAT = "MySQL CDC source"
_PURGED = ("could not find first log file", "purged", "not in the master's binlog",
           "could not find gtid state", "could not open log file", "too old")


def import_pymysql() -> Any:
    """The ``pymysql`` module, or a ConfigurationError naming the extra."""
    try:
        import pymysql
    except ImportError as e:
        raise ConfigurationError(f"MySqlCdcSource needs PyMySQL ({e}): {INSTALL}") from e
    return pymysql


def import_replication() -> Any:
    try:
        import pymysqlreplication
    except ImportError as e:
        raise ConfigurationError(
            f"MySqlCdcSource needs mysql-replication ({e}): {INSTALL}") from e
    return pymysqlreplication


def _code(error: BaseException) -> int | None:
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class MySqlCdcSource(Source[ChangeEvent]):
    """Snapshot + binlog stream of MariaDB / MySQL tables, exactly once.

    Args:
        dsn: ``mysql://user:password@host:port[/database]`` (or ``mariadb://``);
            or give ``host``, ``port``, ``user``, ``password``. The server needs
            ``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL`` and
            ``binlog_row_metadata=FULL``; the user ``REPLICATION SLAVE``,
            ``REPLICATION CLIENT`` (MariaDB: ``BINLOG MONITOR``) and ``SELECT``
            on the tables (and ``LOCK TABLES`` with ``snapshot_method="lock_tables"``).
        tables: ``database.name`` of each table (``name`` alone: in the DSN's
            database); each an InnoDB table with a primary key of integer,
            decimal, date, datetime, binary or binary-collated string columns.
        server_id: the replica id the binlog is read under: unique among the
            server's replicas and binlog readers; one job per id.
        snapshot: read the tables' rows first (else only the changes from now on).
        chunk_rows: rows per snapshot chunk.
        stop_table: a bounded source: it ends at the first row inserted into
            this table (``database.name``) that it reads from the binlog (a
            drain point the database chooses); ``None``: read forever.
        gtid: resume by GTID state (``None``: where the server has GTIDs:
            MariaDB, MySQL with ``gtid_mode=ON``) or by binlog file and offset.
        snapshot_method: ``auto`` (``snapshot_status`` where the server has
            ``binlog_snapshot_position``, else ``lock_tables``).
        heartbeat_s: how often an idle server sends a heartbeat: the longest
            a poll waits when nothing changes.
    """

    replayable = True
    bounded = False
    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, dsn: str | None = None, tables: Sequence[str] | str = (), *,
                 server_id: int, host: str | None = None, port: int | None = None,
                 user: str | None = None, password: str | None = None,
                 snapshot: bool = True, chunk_rows: int = 4096, stop_table: str | None = None,
                 gtid: bool | None = None, snapshot_method: str = "auto",
                 heartbeat_s: float = 0.1) -> None:
        url = urlsplit(dsn) if dsn else None
        if url is not None and url.scheme not in ("mysql", "mariadb"):
            raise ConfigurationError(f"MySqlCdcSource: {redact(dsn or '')!r} is not a "
                                     "mysql://user:password@host:port[/database] URL")
        database = (url.path.strip("/") if url else "") or None
        self.host = host or (url.hostname if url else None) or "127.0.0.1"
        self.port = int(port or (url.port if url else None) or 3306)
        self.user = user or (unquote(url.username) if url and url.username else "root")
        self.password = password if password is not None else (
            unquote(url.password) if url and url.password else "")
        names = [tables] if isinstance(tables, str) else list(tables)
        if not names:
            raise ConfigurationError("MySqlCdcSource: name at least one table")
        self.tables = [self._qualify(t, database) for t in names]
        if len(set(self.tables)) != len(self.tables):
            raise ConfigurationError(f"MySqlCdcSource: a table is named twice in {names}")
        self.stop_table = None if stop_table is None else self._qualify(stop_table, database)
        if type(server_id) is not int or not 1 <= server_id < 2**32:
            raise ConfigurationError(f"MySqlCdcSource: server_id {server_id!r} must be an "
                                     "integer from 1 to 4294967295, unique among the "
                                     "server's replicas")
        if chunk_rows < 1:
            raise ConfigurationError("MySqlCdcSource: chunk_rows must be >= 1")
        if snapshot_method not in _METHODS:
            raise ConfigurationError(f"MySqlCdcSource: snapshot_method {snapshot_method!r} "
                                     f"is not one of {_METHODS}")
        if not 0.001 <= heartbeat_s <= 60:
            raise ConfigurationError("MySqlCdcSource: heartbeat_s must be from 0.001 to 60")
        self.server_id = server_id
        self.snapshot = snapshot
        self.chunk_rows = chunk_rows
        self.gtid = gtid
        self.snapshot_method = snapshot_method
        self.heartbeat_s = heartbeat_s
        self.bounded = stop_table is not None
        self.start: list[Any] | None = None
        """The binlog position when the job was prepared (fresh start)."""
        self.flavor = ""
        """``mariadb`` or ``mysql``, found when the job is prepared."""
        self.use_gtid = False
        self.method = ""
        self.boundaries: dict[str, list[list[Any]]] | None = None
        """Each table's chunk boundaries, cut when the job is prepared."""

    @staticmethod
    def _qualify(table: str, database: str | None) -> str:
        parts = table.split(".")
        if len(parts) == 1 and database:
            parts = [database, parts[0]]
        if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
            raise ConfigurationError(
                f"MySqlCdcSource: table {table!r} is not 'database.name' (or 'name' with a "
                "database in the DSN) of plain identifiers")
        return ".".join(parts)

    def __repr__(self) -> str:
        return (f"MySqlCdcSource('mysql://{self.user}@{self.host}:{self.port}', "
                f"{self.tables!r}, server_id={self.server_id})")

    def connect(self, **extra: Any) -> Any:
        """A PyMySQL connection (autocommit, utf8mb4, UTC); a
        ConfigurationError naming the server if it cannot be made."""
        pymysql = import_pymysql()
        try:
            conn = pymysql.connect(host=self.host, port=self.port, user=self.user,
                                   password=self.password, charset="utf8mb4", autocommit=True,
                                   connect_timeout=10, **extra)
            with conn.cursor() as cur:
                cur.execute("SET SESSION time_zone = '+00:00'")
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        except pymysql.Error as e:
            raise ConfigurationError(
                f"MySqlCdcSource: cannot connect to {self.user}@{self.host}:{self.port}: "
                f"{e}") from e
        return conn

    def settings(self) -> dict[str, Any]:
        """Connection settings of mysql-replication."""
        return {"host": self.host, "port": self.port, "user": self.user,
                "password": self.password, "charset": "utf8mb4", "connect_timeout": 10}

    # ---------------------------------------------------------------- driver
    def validate(self) -> None:
        """In the driver: the server's binlog settings, the user's
        privileges, the tables (exist, InnoDB, a supported primary key)."""
        conn = self.connect()
        try:
            self._check_server(conn)
            for table in self.tables:
                TableInfo.read(conn, table)
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"SELECT 1 FROM {_qualified(table)} LIMIT 0")
                except import_pymysql().Error as e:
                    raise ConfigurationError(
                        f"MySqlCdcSource: cannot read {table!r} ({e}): GRANT SELECT ON "
                        f"{_qualified(table)} TO '{self.user}'") from e
            if self._method(conn) == "lock_tables":
                try:
                    with conn.cursor() as cur:
                        cur.execute("LOCK TABLES " + ", ".join(
                            f"{_qualified(t)} READ" for t in self.tables))
                        cur.execute("UNLOCK TABLES")
                except import_pymysql().Error as e:
                    raise ConfigurationError(
                        f"MySqlCdcSource: the server has no binlog_snapshot_position, so each "
                        f"snapshot chunk begins under LOCK TABLES ... READ, which {self.user!r} "
                        f"may not take ({e}): GRANT LOCK TABLES, or snapshot=False") from e
        finally:
            conn.close()
        probe_stream(self, None)

    def _check_server(self, conn: Any) -> dict[str, str]:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', "
                        "'binlog_format', 'binlog_row_image', 'binlog_row_metadata', "
                        "'server_id', 'gtid_mode')")
            vars_ = {str(k).lower(): str(v) for k, v in cur.fetchall()}
        self.flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
        where = f"the server at {self.host}:{self.port} ({version})"
        fix_cfg = "in the server's configuration ([mysqld] section) and restart it"
        if vars_.get("log_bin", "OFF").upper() not in ("ON", "1"):
            raise ConfigurationError(
                f"MySqlCdcSource: {where} has log_bin=OFF: change data capture reads the "
                f"binary log: set log_bin (and server_id) {fix_cfg}")
        for name, want in (("binlog_format", "ROW"), ("binlog_row_image", "FULL")):
            have = vars_.get(name, "?").upper()
            if have != want:
                raise ConfigurationError(
                    f"MySqlCdcSource: {where} has {name}={have}; the change events need "
                    f"{name}={want}: SET GLOBAL {name} = '{want}' (and {name}={want} {fix_cfg}; "
                    "sessions opened before keep the old value)")
        meta = vars_.get("binlog_row_metadata")
        if meta is None:
            raise ConfigurationError(
                f"MySqlCdcSource: {where} has no binlog_row_metadata: the binlog does not name "
                "the columns; MariaDB 10.5 or MySQL 8.0.14 and later are needed")
        if meta.upper() != "FULL":
            raise ConfigurationError(
                f"MySqlCdcSource: {where} has binlog_row_metadata={meta}; the change events "
                "need the column names in the binlog: SET GLOBAL binlog_row_metadata = 'FULL' "
                f"(and binlog_row_metadata=FULL {fix_cfg})")
        if vars_.get("server_id") == str(self.server_id):
            raise ConfigurationError(
                f"MySqlCdcSource: server_id={self.server_id} is the server's own id: choose "
                "another, unique among its replicas")
        pymysql = import_pymysql()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
        except pymysql.Error as e:
            raise ConfigurationError(
                f"MySqlCdcSource: {self.user!r} may not read the binlog position ({e}): GRANT "
                + ("BINLOG MONITOR" if self.flavor == "mariadb" else "REPLICATION CLIENT")
                + f" ON *.* TO '{self.user}'") from e
        if not row:
            raise ConfigurationError(f"MySqlCdcSource: {where} reports no binlog position "
                                     "(SHOW MASTER STATUS is empty): is log_bin on?")
        return vars_

    def _method(self, conn: Any) -> str:
        if self.snapshot_method != "auto":
            return self.snapshot_method
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_position'")
            return "snapshot_status" if cur.fetchone() else "lock_tables"

    def prepare(self, job_dir: str, uid: str) -> None:
        """Once per job, in the driver: the binlog position (and GTID state)
        a fresh start reads the stream from. A source prepared before keeps
        the position it noted first (prepare it yourself before writers you
        want the job to see, as the slot of the PostgreSQL source does)."""
        conn = self.connect()
        try:
            vars_ = self._check_server(conn)
            self.method = self._method(conn)
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
                file, offset = str(row[0]), int(row[1])
                state = ""
                if self.flavor == "mariadb":
                    cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
                    state = str(cur.fetchone()[0] or "")
                elif vars_.get("gtid_mode", "OFF").upper() == "ON" and len(row) > 4:
                    state = str(row[4] or "").replace("\n", "")
        finally:
            conn.close()
        has_gtids = self.flavor == "mariadb" or vars_.get("gtid_mode", "OFF").upper() == "ON"
        self.use_gtid = has_gtids if self.gtid is None else bool(self.gtid)
        if self.use_gtid and not has_gtids:
            raise ConfigurationError("MySqlCdcSource: gtid=True, but the server has no GTIDs "
                                     "(gtid_mode=OFF): set gtid_mode=ON, or gtid=None")
        if self.start is None:
            self.start = check_position([file, offset, 0, state, ""])
        if self.snapshot and self.boundaries is None:
            conn = self.connect()
            try:
                self.boundaries = {t: chunk_boundaries(conn, t, self.chunk_rows)
                                   for t in self.tables}
            finally:
                conn.close()

    def initial_entries(self) -> list[dict[str, Any]]:
        """The state of a fresh start (:func:`~lockgate.connectors.cdc_splits.initial_entries`)."""
        if self.start is None or (self.snapshot and self.boundaries is None):
            raise LockgateError("MySqlCdcSource: the job was not prepared (prepare() reads "
                                "the binlog position a fresh start begins at and cuts the "
                                "tables into chunks)")
        return initial_entries(self.tables, self.boundaries if self.snapshot else None,
                               list(self.start))

    def create_reader(self, info: TaskInfo) -> MySqlCdcReader:
        return MySqlCdcReader(self, info)


def _qualified(table: str) -> str:
    db, name = table.split(".")
    return f"{quote(db)}.{quote(name)}"


@dataclass
class TableInfo:
    """A table's primary key and columns, from information_schema."""

    table: str
    key: list[str]
    columns: list[str]
    kinds: dict[str, str | None]

    @property
    def special(self) -> dict[str, str | None]:
        """The columns whose values are brought to one form (most are not)."""
        return {c: k for c, k in self.kinds.items() if k is not None}

    @classmethod
    def read(cls, conn: Any, table: str) -> TableInfo:
        db, name = table.split(".")
        with conn.cursor() as cur:
            cur.execute("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s", (db, name))
            engine = cur.fetchone()
            if engine is None:
                raise ConfigurationError(f"MySqlCdcSource: table {table!r} does not exist")
            if str(engine[0] or "").lower() != "innodb":
                raise ConfigurationError(
                    f"MySqlCdcSource: table {table!r} uses the {engine[0]} engine; the "
                    "consistent snapshot needs a transactional one: ALTER TABLE "
                    f"{_qualified(table)} ENGINE=InnoDB")
            cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_OCTET_LENGTH, "
                        "COLLATION_NAME, COLUMN_KEY FROM information_schema.COLUMNS WHERE "
                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                        (db, name))
            cols = cur.fetchall()
            cur.execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE "
                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' "
                        "ORDER BY ORDINAL_POSITION", (db, name))
            key = [str(r[0]) for r in cur.fetchall()]
        if not key:
            raise ConfigurationError(f"MySqlCdcSource: table {table!r} has no primary key; "
                                     "the snapshot chunks and the change events need one: "
                                     "add it")
        types = {str(c[0]): (str(c[1]).lower(), c[4]) for c in cols}
        bad = [f"{k} {types[k][0]}" + (f" {types[k][1]}" if types[k][1] else "")
               for k in key if not key_type_ok(*types[k])]
        if bad:
            raise ConfigurationError(
                f"MySqlCdcSource: primary key column(s) {bad} of {table!r} have a type the "
                "snapshot cannot cut into chunks in the server's order; supported: integers, "
                "decimal, date, datetime, binary, varbinary, and char/varchar with a binary "
                "collation (e.g. utf8mb4_bin)")
        return cls(table, key, [str(c[0]) for c in cols],
                   {str(c[0]): column_kind(str(c[1]).lower(), str(c[2]).lower(),
                                           None if c[3] is None else int(c[3])) for c in cols})


@functools.cache
def _events() -> Any:
    """mysql-replication's event classes the stream reads."""
    from pymysqlreplication import event, row_event

    return SimpleNamespace(
        gtid=event.GtidEvent, mariadb_gtid=event.MariadbGtidEvent,
        other=event.NotImplementedEvent, query=event.QueryEvent, rotate=event.RotateEvent,
        xa_prepare=event.XAPrepareEvent, xid=event.XidEvent, heartbeat=event.HeartbeatLogEvent,
        write=row_event.WriteRowsEvent, update=row_event.UpdateRowsEvent,
        delete=row_event.DeleteRowsEvent)


def chunk_boundaries(conn: Any, table: str, chunk_rows: int) -> list[list[Any]]:
    """The keys that cut ``table`` into chunks of ``chunk_rows`` rows as it is now."""
    info = TableInfo.read(conn, table)
    db, name = table.split(".")
    with conn.cursor() as cur:
        cur.execute(boundaries_select(db, name, info.key, chunk_rows))
        return [list(snapshot_values(dict(zip(info.key, r, strict=True)), info.kinds).values())
                for r in cur.fetchall()]


def _stream_kwargs(source: MySqlCdcSource, pos: list[Any], blocking: bool,
                   by_gtid: bool) -> dict[str, Any]:
    watched = [*source.tables, *([source.stop_table] if source.stop_table else [])]
    kwargs: dict[str, Any] = dict(
        connection_settings=source.settings(), server_id=source.server_id, blocking=blocking,
        only_events=list(vars(_events()).values()),
        filter_non_implemented_events=False,
        only_schemas=sorted({t.split(".")[0] for t in watched}),
        only_tables=sorted({t.split(".")[1] for t in watched}),
        slave_heartbeat=source.heartbeat_s, enable_logging=False)
    file, offset, _index, gtid, _txn = pos
    if by_gtid and gtid:
        kwargs.update(auto_position=gtid, is_mariadb=source.flavor == "mariadb")
    else:
        kwargs.update(resume_stream=True, log_file=file, log_pos=offset)
    return kwargs


def binlog_error(source: MySqlCdcSource, pos: list[Any] | None, error: BaseException
                 ) -> LockgateError | None:
    """The error with its fix for what the server said when asked for the
    binlog from ``pos``; None if it is not one we know."""
    code, text = _code(error), str(error)
    where = ("the current position" if pos is None else
             f"binlog {pos[0]} at {pos[1]}" + (f" (GTID state {pos[3]})" if pos[3] else ""))
    if code == 1236 and any(p in text.lower() for p in _PURGED):
        return LockgateError(
            f"MySqlCdcSource: the server at {source.host}:{source.port} no longer has the "
            f"binlog from {where}: {text}. The changes since the checkpoint are lost to it "
            "(the binlog was purged: PURGE BINARY LOGS, binlog_expire_logs_seconds / "
            "expire_logs_days). Start the job fresh (not from a checkpoint or savepoint): it "
            "takes a new snapshot; and keep binlogs longer than a job may be down")
    if code in (1227, 1045, 1044, 1142):
        return LockgateError(
            f"MySqlCdcSource: {source.user!r} may not read the binlog ({text}): GRANT "
            f"REPLICATION SLAVE ON *.* TO '{source.user}'")
    if code == 1236:
        return LockgateError(f"MySqlCdcSource: the server refused to send the binlog from "
                             f"{where}: {text}")
    return None


def probe_stream(source: MySqlCdcSource, pos: list[Any] | None) -> None:
    """Ask for the binlog from ``pos`` (None: the current end) and read its
    first event: the server's refusal (a purged binlog, a missing privilege)
    comes now, as an error that names the fix."""
    pymysql = import_pymysql()
    repl = import_replication()
    at = pos
    if at is None:
        conn = source.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
        finally:
            conn.close()
        at = [str(row[0]), int(row[1]), 0, "", ""]
    stream = repl.BinLogStreamReader(**_stream_kwargs(source, at, blocking=False,
                                                      by_gtid=source.use_gtid))
    try:
        stream.fetchone()
    except pymysql.Error as e:
        raise (binlog_error(source, pos, e) or e) from e
    finally:
        stream.close()


@dataclass
class _Txn:
    """The transaction being read: where it begins, its GTID, its changes."""

    file: str
    start: int
    gtid: str
    begun: bool = False
    changes: list[Change] = field(default_factory=list)


class MySqlCdcReader(SourceReader[ChangeEvent]):
    """The task numbered 0 reads the snapshot chunks (in chunk order), then
    the binlog; the other tasks have nothing to read (downstream operators
    scale out). The state's entries are those of
    :mod:`~lockgate.connectors.cdc_splits`, all of them task 0's: it knows
    each chunk's high watermark itself, so the stream starts as soon as the
    last chunk's rows are emitted."""

    def __init__(self, source: MySqlCdcSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.tables = source.tables
        self.stream: dict[str, Any] | None = None
        """The stream entry (task 0)."""
        self.todo: deque[dict[str, Any]] = deque()
        """The chunks with work left (unread or emitting), in order."""
        self.done: list[dict[str, Any]] = []
        self.buffer: deque[tuple[ChangeEvent | None, list[Any]]] = deque()
        self.conn: Any = None
        self.lock_conn: Any = None
        self.binlog: Any = None
        self.infos: dict[str, TableInfo] = {}
        self.txn: _Txn | None = None
        self.file = ""
        self.gtid_state = ""
        self._skip: tuple[int, str, int, str] | None = None
        self._rotations = 0
        self._stopped = False

    # ------------------------------------------------------------ lifecycle
    def restore(self, state: list[Any] | None) -> None:
        stream, chunks = check_restored(state, self.source.initial_entries, self.tables, _WHAT,
                                        check_position)
        if self.info.task_index != 0:
            return
        share = deal(stream, chunks, 0, 1)  # every chunk is task 0's
        self.stream = share.stream
        self.todo, self.done = share.todo(), share.done()
        self.conn = self.source.connect()
        assert self.stream is not None
        if not self.stream["ended"]:
            probe_stream(self.source, self.stream["pos"])

    def close(self) -> None:
        for attr in ("binlog", "lock_conn", "conn"):
            handle = getattr(self, attr)
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # closing a dead connection
                    pass
                setattr(self, attr, None)

    # --------------------------------------------------------------- reading
    def poll(self, max_records: int) -> list[ChangeEvent] | None:
        if self.todo:
            return take_chunk(self.todo, self.done, max_records, self._read_chunk)
        stream = self.stream
        if stream is None:  # not the reading task
            return None if self.source.bounded else []
        if stream["hw"] is None:  # every chunk emitted: the stream starts
            stream["hw"] = stream_watermarks({c["id"]: c for c in self.done},
                                             {c["id"]: c["hw"] for c in self.done})
            self.done = []
        if not self.buffer:
            if stream["ended"]:
                return None
            self._fetch()
        return take_buffered(self.buffer, stream, max_records, self._stopped)

    # -------------------------------------------------------------- snapshot
    def _read_chunk(self, chunk: dict[str, Any]) -> None:
        """Read ``chunk`` as of its exact binlog position (its high
        watermark): its rows become the chunk's ``rows``."""
        assert self.conn is not None
        table = chunk["table"]
        info = TableInfo.read(self.conn, table)
        db, name = table.split(".")
        select, params = chunk_select(db, name, info.columns, info.key, chunk["lower"],
                                      chunk["upper"])
        method = self.source.method or "snapshot_status"
        with self.conn.cursor() as cur:
            if method == "lock_tables":
                high = self._begin_locked(cur, table)
            else:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
                high = coordinate(status["binlog_snapshot_file"],
                                  int(status["binlog_snapshot_position"]))
            try:
                cur.execute(select, params)
                got = cur.fetchall()
                cur.execute("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")
                now_ms = int(cur.fetchone()[0])
            finally:
                cur.execute("COMMIT")
        special, columns = info.special, info.columns
        chunk["rows"] = [snapshot_values(dict(zip(columns, values, strict=True)), special)
                         for values in got]
        chunk["hw"], chunk["ms"] = high, now_ms

    def _begin_locked(self, cur: Any, table: str) -> int:
        """Begin the consistent snapshot while a second session holds the
        table read-locked (no transaction that writes it is in flight), and
        read the binlog position then: the snapshot holds every change of
        the table before it and none after."""
        if self.lock_conn is None:
            self.lock_conn = self.source.connect()
        with self.lock_conn.cursor() as lock:
            lock.execute(f"LOCK TABLES {_qualified(table)} READ")
            try:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                lock.execute("SHOW MASTER STATUS")
                row = lock.fetchone()
            finally:
                lock.execute("UNLOCK TABLES")
        return coordinate(str(row[0]), int(row[1]))

    # ---------------------------------------------------------------- stream
    def _open(self) -> None:
        assert self.stream is not None
        repl = import_replication()
        pos = self.stream["pos"]
        self.binlog = repl.BinLogStreamReader(**_stream_kwargs(
            self.source, pos, blocking=True, by_gtid=self.source.use_gtid))
        self.file = pos[0]
        self.gtid_state = pos[3]
        self._skip = (pos[2], pos[0], pos[1], pos[4]) if pos[2] else None
        self._rotations = 0
        self.txn = None
        for table in self.tables:
            self.infos[table] = TableInfo.read(self.conn, table)

    def _reopen(self) -> None:
        """The stream reconnected by itself (it resumes where it last read,
        maybe in the middle of a transaction): read again from our position."""
        if self.binlog is not None:
            self.binlog.close()
        self.binlog = None
        self.buffer.clear()
        self.txn = None

    def _next(self) -> Any:
        pymysql = import_pymysql()
        try:
            return self.binlog.fetchone()
        except pymysql.Error as e:
            assert self.stream is not None
            raise (binlog_error(self.source, self.stream["pos"], e) or e) from e

    def _fetch(self) -> None:
        """Read the binlog after the position into the buffer, transaction by
        transaction, until about a batch is there or the server is idle."""
        kinds = _events()
        if self.binlog is None:
            self._open()
        deadline = time.monotonic() + 0.2
        while not self._stopped:
            ev = self._next()
            if ev is None:  # the server ended the stream: open it again next time
                self._reopen()
                return
            if isinstance(ev, kinds.heartbeat):
                return
            if isinstance(ev, kinds.rotate):
                if ev.timestamp == 0:  # the one a connection begins with
                    self._rotations += 1
                    if self._rotations > 1:
                        self._reopen()
                        return
                self.file = ev.next_binlog
                continue
            if isinstance(ev, kinds.mariadb_gtid):
                self._begin(ev, ev.gtid)
                assert self.txn is not None
                self.txn.begun = not ev.flags & 1  # FL_STANDALONE: one statement, no COMMIT
            elif isinstance(ev, kinds.gtid):
                self._begin(ev, ev.gtid)
            elif isinstance(ev, kinds.other):
                if ev.packet.event_type == 0x22:  # MySQL's anonymous GTID
                    self._begin(ev, "")
            elif isinstance(ev, kinds.query):
                self._query(ev)
            elif isinstance(ev, kinds.write | kinds.update | kinds.delete):
                self._rows(ev)
            elif isinstance(ev, kinds.xid | kinds.xa_prepare):
                self._end(ev)
            if not self.txn and (len(self.buffer) >= 4096 or time.monotonic() > deadline):
                return

    def _begin(self, ev: Any, gtid: str) -> None:
        start = int(ev.packet.log_pos) - int(ev.packet.event_size)
        self.txn = _Txn(self.file, start, gtid)

    def _query(self, ev: Any) -> None:
        text = ev.query.strip()
        upper = text[:16].upper()
        if self.txn is None:
            self._begin(ev, "")
        assert self.txn is not None
        if upper == "BEGIN" or upper.startswith("XA START"):
            self.txn.begun = True
            return
        if upper in ("COMMIT", "ROLLBACK"):
            self._end(ev)
            return
        db = ev.schema.decode() if isinstance(ev.schema, bytes) else str(ev.schema or "")
        table = truncated_table(text, db)
        if table is not None and table in self.tables:
            self.txn.changes.append(Change("truncate", table, None, None,
                                           self.infos[table].key))
        if not self.txn.begun:  # a statement of its own (DDL): its own transaction
            self._end(ev)

    def _rows(self, ev: Any) -> None:
        kinds = _events()
        table = f"{ev.schema}.{ev.table}"
        if self.txn is None:
            self._begin(ev, "")
        assert self.txn is not None
        if table == self.source.stop_table:
            if isinstance(ev, kinds.write):
                self.txn.changes.append(Change("insert", table, None, {}, []))
            return
        if table not in self.tables:
            return
        info = self.infos.get(table)
        first = ev.rows[0] if ev.rows else {}
        if info is None or any(name not in info.kinds
                               for name in first.get("values", first.get("after_values", {}))):
            info = self.infos[table] = TableInfo.read(self.conn, table)  # a column added
        special = info.special
        for r in ev.rows:
            if isinstance(ev, kinds.write):
                change = Change("insert", table, None, stream_values(r["values"], special),
                                info.key)
            elif isinstance(ev, kinds.delete):
                change = Change("delete", table, stream_values(r["values"], special), None,
                                info.key)
            else:
                change = Change("update", table, stream_values(r["before_values"], special),
                                stream_values(r["after_values"], special), info.key)
            self.txn.changes.append(change)

    def _end(self, ev: Any) -> None:
        """The transaction committed: its changes go to the buffer, each with
        the position after it."""
        assert self.stream is not None
        txn, self.txn = self.txn, None
        if txn is None:
            return
        end = int(ev.packet.log_pos)
        before = self.gtid_state
        after = next_gtid_state(before, txn.gtid) if txn.gtid else before
        self.gtid_state = after
        done = [self.file, end, 0, after, ""]
        first = 0
        if self._skip is not None:
            index, file, start, gtid = self._skip
            self._skip = None
            same = (gtid == txn.gtid) if gtid else (file == txn.file and start == txn.start)
            if not same:
                raise LockgateError(
                    f"MySqlCdcSource: the binlog differs from the checkpoint: it was read in "
                    f"the middle of the transaction {gtid or f'at {file} {start}'}, the server "
                    f"now has {txn.gtid or f'{txn.file} {txn.start}'} there. Restore with the "
                    "server the checkpoint was taken from, or start the job fresh")
            first = min(index, len(txn.changes))
        chunks = self.stream["hw"]
        position = coordinate(txn.file, txn.start)
        lsn = coordinate(self.file, end)
        commit_ms = int(ev.timestamp) * 1000
        n = len(txn.changes)
        reached = False  # an entry carries ``done``
        for i in range(first, n):
            change = txn.changes[i]
            pos = done if i + 1 >= n else [txn.file, txn.start, i + 1, before, txn.gtid]
            if change.table == self.source.stop_table:
                self.buffer.append((None, pos))
                self._stopped = True
                return
            for op, b, a in emit_change(change, position, chunks):
                self.buffer.append((ChangeEvent(op, change.table, b, a, lsn, commit_ms), pos))
                reached = pos is done
        if not reached:
            if self.buffer and self.buffer[-1][0] is None:
                self.buffer[-1] = (None, done)  # positions only: the latest is enough
            else:
                self.buffer.append((None, done))

    # ------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Copies: the snapshot thread writes them while this one reads on."""
        if self.stream is None:
            return []
        self._close_filter()
        return state_entries(self.stream, self.todo, self.done)

    def _close_filter(self) -> None:
        """Once the position is past every chunk's high watermark, every
        change is the stream's: the watermarks are dropped (the state
        shrinks, and no comparison of binlog places remains, so a GTID
        restore on another server of the same replication set reads on)."""
        stream = self.stream
        assert stream is not None
        if stream["hw"] is None:
            return
        highs = [c[1] for chunks in stream["hw"].values() for c in chunks]
        if highs and any(highs) and coordinate(*stream["pos"][:2]) >= max(highs):
            stream["hw"] = {t: [[None, 0]] for t in stream["hw"]}
