"""Lakehouse sinks (Delta Lake, Iceberg): staged Parquet files, one table
commit per checkpoint, made by one committer per sink.

The protocol (Flink's ``IcebergFilesCommitter``, and Spark's idempotent
``foreachBatch`` writes to Delta)::

    task k, between checkpoints   Arrow batches written to one in-progress
                                  Parquet file as they come, a row group at a
                                  time (:class:`StagedWriter`); at the snapshot
                                  of checkpoint c the file is finished,
                                  fsynced and renamed to its staged name
                                  _lockgate/{uid}/{job}/c{c}-t{k}-a{attempt}.parquet
                                  (durable before the task acknowledges c)
    task 0, checkpoint n done     lists the staged files of its attempt with
                                  committed < c <= n and makes ONE table commit
                                  of them, carrying (job, sink uid, n) in the
                                  commit itself: the table is the record of
                                  what is committed
    any task, restore             task 0 asks the table, per job that wrote a
                                  restored handle, for the newest checkpoint
                                  committed and commits the restored handles
                                  that are newer, in one commit; every task
                                  deletes the staged files of its index that no
                                  restored handle names (checkpoints that never
                                  completed)

Every task keeps its handles as (union) operator state until the table shows
them committed (the tasks other than task 0 ask it every
:data:`ASK_TABLE_EVERY_S` at most), so a restored checkpoint always names
every staged file that is not in the table yet. Which files a task has staged is told to task 0 by
the staging folder itself (names are the protocol); the checkpoint's
completion guarantees that every file of a checkpoint ``<= n`` is staged.

Names and the recovery plan are pure functions here; the table formats
implement :class:`LakeTable`.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.parquet as pq

from lockgate import fs
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.twophase import Precommitted, TwoPhaseCommitSinkWriter
from lockgate.errors import ConfigurationError, OutputLostError

__all__ = ["LakeTable", "StagedFile", "LakeSinkWriter", "LakeFileHandle", "app_id",
           "staged_name", "parse_staged_name", "check_handle", "plan_recovery", "LAKE_MODES",
           "key_columns", "move_staged"]

LAKE_MODES = ("append", "merge")
STAGING = "_lockgate"
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")
_STAGED = re.compile(r"^c(\d+)-t(\d+)-a(\d+)\.parquet$")
_INPROGRESS = re.compile(r"^\.t(\d+)-a(\d+)-s(\d+)\.parquet\.inprogress$")


def safe(name: str) -> str:
    """``name`` with every character unsafe in a file name replaced by ``_``."""
    return _SAFE.sub("_", name)


def app_id(job_id: str, uid: str) -> str:
    """The application id that the table commit carries: job and sink uid."""
    return f"lockgate/{job_id}/{uid}"


def staged_name(checkpoint_id: int, task: int, attempt: int) -> str:
    """The staged file of task ``task``'s transaction of checkpoint ``checkpoint_id``."""
    return f"c{checkpoint_id}-t{task}-a{attempt}.parquet"


def parse_staged_name(name: str) -> tuple[int, int, int] | None:
    """(checkpoint id, task, attempt) of a staged name, else None."""
    m = _STAGED.match(name)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file: where it is and what it holds."""

    job: str
    uid: str
    checkpoint_id: int
    task: int
    attempt: int
    path: str
    rows: int

    @property
    def final_name(self) -> str:
        """Its name in the table's data folder, once committed (append)."""
        return (f"part-lockgate-{safe(self.uid)}-{safe(self.job)}-c{self.checkpoint_id}"
                f"-t{self.task}-a{self.attempt}.parquet")


ASK_TABLE_EVERY_S = 10.0
"""How often a task other than the committer asks the table which of its
pending handles it holds (at a snapshot): keeping a committed handle a little
longer is harmless (a restore finds it in the table), loading the table at
every checkpoint is not."""

MAX_ID = 1024
"""The longest app id or job id a restored handle may hold."""


@dataclass(frozen=True, slots=True)
class LakeFileHandle:
    """A staged file (a lakehouse sink's two-phase-commit handle): the app id
    its commit records, the job whose staging folder holds it, its staged
    name, its rows (-1: not recorded) and the attempt that wrote it."""

    app: str
    job: str
    file: str
    rows: int = -1
    attempt: int = 0

    def to_state(self) -> dict[str, Any]:
        return {"app": self.app, "job": self.job, "file": self.file, "rows": self.rows,
                "attempt": self.attempt}


def valid_handle(h: dict[str, Any]) -> bool:
    """Whether a restored (untrusted) entry is a lakehouse handle: its file a
    staged name of its own checkpoint and task, its ids integers, its app
    and job strings."""
    name = h.get("file")
    parsed = parse_staged_name(name) if isinstance(name, str) else None
    ids = (h.get("checkpoint_id"), h.get("task_index"))
    app, job = h.get("app"), h.get("job")
    return (parsed is not None and all(type(i) is int for i in ids)
            and parsed[:2] == ids and isinstance(app, str) and len(app) <= MAX_ID
            and isinstance(job, str) and len(job) <= MAX_ID
            and type(h.get("rows", 0)) is int)


def check_handle(h: dict[str, Any], uid: str) -> LakeFileHandle:
    """A restored (untrusted) entry as a handle, if :func:`valid_handle`."""
    if not valid_handle(h):
        raise ConfigurationError(
            f"sink {uid!r}: restored entry {str(h)[:200]} is not a lakehouse sink "
            "handle; restore the checkpoint with the sink that wrote it")
    _, _, attempt = cast(tuple[int, int, int], parse_staged_name(h["file"]))
    return LakeFileHandle(h["app"], h["job"], h["file"], h.get("rows", -1), attempt)


@dataclass
class RecoveryPlan:
    """What a restored sink does: per app id the newest checkpoint and its files."""

    to_commit: list[Precommitted[LakeFileHandle]] = field(default_factory=list)
    """Restored handles newer than the table's record for their job, by checkpoint."""
    versions: dict[str, int] = field(default_factory=dict)
    """Per app id, the checkpoint id the recovery commit records."""
    committed: list[Precommitted[LakeFileHandle]] = field(default_factory=list)
    """Restored handles the table already holds (their staged files, if any
    are left, are deleted)."""


def plan_recovery(handles: list[Precommitted[LakeFileHandle]],
                  table_versions: dict[str, int | None]) -> RecoveryPlan:
    """Split restored ``handles`` by whether the table holds them already
    (``table_versions``: per app id, the newest checkpoint committed or None)."""
    plan = RecoveryPlan()
    for h in sorted(handles, key=lambda h: (h.checkpoint_id, h.task_index)):
        app, cid = h.handle.app, h.checkpoint_id
        done = table_versions.get(app)
        if done is not None and cid <= done:
            plan.committed.append(h)
        else:
            plan.to_commit.append(h)
            plan.versions[app] = max(plan.versions.get(app, cid), cid)
    return plan


def check_columns(sink: str, table: str, names: list[str], schema: pa.Schema,
                  delete_column: str | None) -> None:
    """The records (less the delete marker) have the table's columns, or a
    ``ConfigurationError`` naming both and the fix."""
    written = [n for n in schema.names if n != delete_column]
    if sorted(names) != sorted(written):
        raise ConfigurationError(
            f"{sink}: the table {table} has the columns {names}, the records have "
            f"{written}; write records with the table's columns (or give the sink a "
            "schema), or write to a new table")


def key_columns(sink: str, mode: str, key: list[str] | str | None,
                delete_column: str | None, schema: pa.Schema | None) -> list[str]:
    """``key`` as a list, checked with ``mode`` (one of :data:`LAKE_MODES`;
    ``merge`` needs a key), ``delete_column`` (``merge`` only) and the
    records' ``schema`` if one is given (it has the key and delete columns)."""
    if mode not in LAKE_MODES:
        raise ConfigurationError(
            f"{sink}: unknown mode {mode!r}; use \"append\" or \"merge\" (with key=...)")
    keys = [key] if isinstance(key, str) else list(key or [])
    if mode == "merge" and not keys:
        raise ConfigurationError(
            f"{sink}: mode=\"merge\" needs key=[column, ...]: the columns that identify a row")
    if delete_column and mode != "merge":
        raise ConfigurationError(f"{sink}: delete_column needs mode=\"merge\"")
    if schema is not None:
        missing = [k for k in keys + ([delete_column] if delete_column else [])
                   if k not in schema.names]
        if missing:
            raise ConfigurationError(
                f"{sink}: the schema lacks the column(s) {missing}; add them or fix "
                "key/delete_column")
    return keys


def partition_columns(sink: str, partition_by: list[str] | str | None, key: list[str],
                      delete_column: str | None, schema: pa.Schema | None) -> list[str]:
    """``partition_by`` as a list, checked: no column twice, not the delete
    marker, in ``schema`` if one is given."""
    cols = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
    if len(set(cols)) != len(cols) or not all(isinstance(c, str) and c for c in cols):
        raise ConfigurationError(
            f"{sink}: partition_by={cols!r} names a column twice or not by name; name each "
            "partition column once")
    if delete_column in cols:
        raise ConfigurationError(
            f"{sink}: the delete marker {delete_column!r} cannot be a partition column "
            "(it is not written to the table); partition by a column of the table")
    if schema is not None:
        missing = [c for c in cols if c not in schema.names]
        if missing:
            raise ConfigurationError(
                f"{sink}: the schema lacks the partition column(s) {missing}; add them or "
                "fix partition_by")
    return cols


def check_partitioning(sink: str, table: str, have: list[str], want: list[str]) -> None:
    """An existing table is partitioned as the sink says (``want``; no
    ``partition_by`` given accepts the table's), or a ``ConfigurationError``."""
    if want and have != want:
        raise ConfigurationError(
            f"{sink}: the table {table} is partitioned by {have or 'nothing'}, the sink by "
            f"{want}; give partition_by={have!r} (or leave it out: the table's own "
            "partitioning is used), or write to a new table")


def move_staged(f: StagedFile, final: str, uid: str) -> None:
    """Move staged file ``f`` to ``final`` in the table's folder; a retry of
    the commit finds it there (neither: lost output)."""
    if fs.exists(f.path):
        fs.move(f.path, final)
    elif not fs.exists(final):
        raise require_lost(f.path, uid)


def concat_staged(files: list[StagedFile], uid: str) -> pa.Table:
    """The rows of ``files``, in order (a staged file that is gone: lost output)."""
    parts = []
    for f in files:
        if not fs.exists(f.path):
            raise require_lost(f.path, uid)
        parts.append(read_parquet(f.path))
    return pa.concat_tables(parts, promote_options="default")


class LakeTable(ABC):
    """One lakehouse table as the committer sees it."""

    @abstractmethod
    def committed_version(self, app: str) -> int | None:
        """The newest checkpoint id committed under ``app``, None if none (or no table)."""

    @abstractmethod
    def commit(self, files: list[StagedFile], versions: dict[str, int],
               fault: Callable[[str], None]) -> None:
        """Commit ``files`` (ordered by checkpoint, then task) in ONE table
        commit that records ``versions`` (app id -> checkpoint id); call
        ``fault("table_commit")`` when the commit is ready, just before the
        table commit is made."""


def beside(location: str, uri: str) -> str:
    """``uri``, a plain path or URL that a table format names (no
    credentials), as a location on ``location``'s filesystem (the same
    scheme, bucket, credentials and options)."""
    local = fs.local_path(uri)
    if local is not None:
        return local
    loc, u = urlsplit(location), urlsplit(uri)
    if loc.scheme != u.scheme or loc.netloc.rpartition("@")[2] != u.netloc:
        raise ConfigurationError(
            f"the table's data folder {uri} is not in the bucket of the staging folder "
            f"{fs.redact(location)}; put the staging folder in the table's bucket")
    return urlunsplit((loc.scheme, loc.netloc, u.path, loc.query, ""))


def plain_uri(location: str) -> str:
    """``location`` without credentials and options: as a table format records it."""
    local = fs.local_path(location)
    if local is not None:
        return local
    loc = urlsplit(location)
    return urlunsplit((loc.scheme, loc.netloc.rpartition("@")[2], loc.path, "", ""))


def read_parquet(location: str) -> pa.Table:
    """The Parquet file at ``location`` (a path or a :mod:`lockgate.fs` URL)."""
    filesystem, path = fs.resolve(location)
    return pq.read_table(path, filesystem=filesystem)


def read_parquet_schema(location: str) -> pa.Schema:
    """The Arrow schema of the Parquet file at ``location``."""
    filesystem, path = fs.resolve(location)
    with filesystem.open_input_file(path) as f:
        return pq.read_schema(f)


ROW_GROUP_ROWS = 1 << 20
"""Rows per row group of a staged file (pyarrow's default: smaller ones cost
more to write, and readers prefer large ones)."""
ROW_GROUP_BYTES = 128 << 20
"""... or fewer, once the buffered batches take this much memory."""


class StagedWriter:
    """One transaction's staged Parquet file, written while the batches come:
    every :data:`ROW_GROUP_ROWS` rows (or :data:`ROW_GROUP_BYTES`) the
    buffered batches go to the file as one row group, written by a
    background thread while the task goes on (pyarrow encodes and compresses
    without the GIL); at most one row group is being written and one
    buffered, so memory stays bounded. :meth:`close` writes the rest and the
    footer and makes the file durable: a snapshot only waits for the last
    row group. An error of the background write is raised by the next call."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.batches: list[Any] = []
        self.buffered_rows = 0
        self.buffered_bytes = 0
        self.rows = 0
        self._out: Any = None
        self._writer: pq.ParquetWriter | None = None
        self._flushing: Any = None
        self._pool: Any = None

    def add(self, batch: Any) -> None:
        """Buffer ``batch``; hand the buffer to the background thread once it
        makes a row group."""
        self.batches.append(batch)
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self._wait()
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="lake-staging")
            self._flushing = self._pool.submit(self._write, self._take())

    def _take(self) -> list[Any]:
        batches, self.batches = self.batches, []
        self.buffered_rows = self.buffered_bytes = 0
        return batches

    def _write(self, batches: list[Any]) -> None:
        if self._writer is None:
            self._out = fs.open_write(self.path)
            self._writer = pq.ParquetWriter(self._out, self.schema)
        table = pa.Table.from_batches(batches, self.schema)
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))  # one group

    def _wait(self) -> None:
        flushing, self._flushing = self._flushing, None
        if flushing is not None:
            flushing.result()

    def close(self) -> int:
        """Write the rest and the footer, durably; the number of rows."""
        try:
            self._wait()
            if self.batches or self._writer is None:
                self._write(self._take())
            assert self._writer is not None
            self._writer.close()
        except BaseException:
            self.discard()
            raise
        finally:
            self._shutdown()
        fs.finish_write(self._out)
        return self.rows

    def discard(self) -> None:
        """Drop the file (an aborted transaction): its rows are replayed."""
        try:
            self._wait()
        except Exception:  # the file goes anyway
            pass
        finally:
            self._shutdown()
        writer, out = self._writer, self._out
        self._writer = self._out = None
        self.batches = []
        if writer is not None:
            try:
                writer.close()
            except Exception:  # after a failed write: nothing to keep
                writer.is_open = False
        if out is not None:
            out.close()
            fs.remove(self.path)

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


@dataclass
class LakeTxn:
    """One task's open transaction: its staged file (opened with the first batch)."""

    staged: StagedWriter | None = None


class LakeSinkWriter(TwoPhaseCommitSinkWriter[LakeTxn, LakeFileHandle]):
    """The task side of a lakehouse sink; task 0 is the committer."""

    accepts_arrow = True
    """``pyarrow.RecordBatch`` es are staged as they are, with no row conversion."""

    def __init__(self, info: TaskInfo, location: str, table: LakeTable,
                 schema: pa.Schema | None, staging: str | None = None) -> None:
        super().__init__(info)
        self.location = location
        self.table = table
        self.schema = schema
        self.app = app_id(info.job_id, info.uid)
        self.staging = fs.join(staging or fs.join(location, STAGING), safe(info.uid))
        self.job_dir = fs.join(self.staging, safe(info.job_id))
        self._checkpoint = 0
        self._seq = 0
        self._committed = -1
        """Task 0: the newest checkpoint id this attempt committed."""
        self._asked = time.monotonic()
        """The other tasks: when they last asked the table what it holds (not
        at the first snapshot: a short job never loads the table there)."""

    @property
    def committer(self) -> bool:
        """Whether this task commits (task 0 of the sink)."""
        return self.info.task_index == 0

    # -- staging

    def begin_transaction(self) -> LakeTxn:
        return LakeTxn()

    def write(self, txn: LakeTxn, batch: list[Any]) -> None:
        """Keep ``batch``: a record batch as it is, rows as one record batch."""
        if isinstance(cast(Any, batch), list):
            rb = (pa.RecordBatch.from_pylist(batch, schema=self.schema) if self.schema
                  else pa.RecordBatch.from_pylist(batch))
        else:
            rb = cast(Any, batch)
            if self.schema is not None and not rb.schema.equals(self.schema):
                rb = pa.RecordBatch.from_arrays(
                    [rb.column(n).cast(self.schema.field(n).type) for n in self.schema.names],
                    schema=self.schema)
        if self.schema is None:
            self.schema = rb.schema  # the schema of the first batch
        elif not rb.schema.equals(self.schema):
            raise ConfigurationError(
                f"sink {self.info.uid!r}: a batch with the schema {rb.schema} follows batches "
                f"with {self.schema}; give the sink a schema (schema=...) so that every batch "
                "is cast to it, or make every record carry the same fields and types")
        if txn.staged is None:
            info = self.info
            fs.makedirs(self.job_dir)
            hidden = fs.join(self.job_dir, f".t{info.task_index}-a{info.attempt}-s{self._seq}"
                                           ".parquet.inprogress")
            self._seq += 1
            txn.staged = StagedWriter(hidden, self.schema)
        txn.staged.add(rb)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Stage this checkpoint's file (see the base), then forget the handles
        the table already holds."""
        self._checkpoint = checkpoint_id
        if (self._pending and not self.committer
                and time.monotonic() - self._asked >= ASK_TABLE_EVERY_S):
            self._asked = time.monotonic()
            self._forget_committed()
        return super().snapshot_state(checkpoint_id)

    def pre_commit(self, txn: LakeTxn) -> LakeFileHandle:
        """Finish the staged file (its in-progress name), then give it its
        staged name."""
        info = self.info
        staged = txn.staged
        assert staged is not None  # a transaction that wrote a batch
        rows = staged.close()
        name = staged_name(self._checkpoint, info.task_index, info.attempt)
        fs.move(staged.path, fs.join(self.job_dir, name))
        fs.sync_dir(self.job_dir)
        return LakeFileHandle(self.app, info.job_id, name, rows, info.attempt)

    def abort(self, txn: LakeTxn) -> None:
        """Delete the open transaction's in-progress file."""
        if txn.staged is not None:
            txn.staged.discard()

    def commit(self, entry: Precommitted[LakeFileHandle]) -> None:  # pragma: no cover
        raise AssertionError("lakehouse sinks commit in notify_checkpoint_complete")

    # -- committing

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Task 0: commit every staged file of this attempt with a checkpoint
        in (last committed, ``checkpoint_id``], in one table commit."""
        if not self.committer:
            return
        info = self.info
        files = []
        for name in fs.listdir(self.job_dir) if fs.exists(self.job_dir) else []:
            parsed = parse_staged_name(name)
            if parsed is None:
                continue
            cid, task, attempt = parsed
            if attempt == info.attempt and self._committed < cid <= checkpoint_id:
                files.append(self._staged(info.job_id, cid, task, attempt, name))
        if files:
            files.sort(key=lambda f: (f.checkpoint_id, f.task))
            self.table.commit(files, {self.app: checkpoint_id}, self.fault)
            self.fault("table_committed")
        self._committed = max(self._committed, checkpoint_id)
        for cid in [c for c in self._pending if c <= checkpoint_id]:
            del self._pending[cid]

    def _forget_committed(self) -> None:
        """Drop the pending handles the table holds (committed by task 0)."""
        done = self.table.committed_version(self.app)
        if done is not None:
            for cid in [c for c in self._pending if c <= done]:
                del self._pending[cid]

    def _staged(self, job: str, cid: int, task: int, attempt: int, name: str,
                rows: int = -1) -> StagedFile:
        return StagedFile(job=job, uid=self.info.uid, checkpoint_id=cid, task=task,
                          attempt=attempt, path=fs.join(self.staging, safe(job), name),
                          rows=rows)

    def _staged_path(self, handle: LakeFileHandle) -> str:
        return fs.join(self.staging, safe(handle.job), handle.file)

    # -- recovery

    def decode_handle(self, entry: dict[str, Any]) -> LakeFileHandle:
        """A restored handle, checked: a staged file of its own checkpoint and task."""
        return check_handle(entry, self.info.uid)

    def recover(self, handles: list[Precommitted[LakeFileHandle]]) -> None:
        """Step 1. Task 0: commit the restored handles the table does not hold
                (one commit), delete the staged files of those it holds.
        Step 2. Every task: delete the staged files of its index that no
                restored handle names, from earlier attempts or other jobs.
        Step 3. Keep the restored handles of this task as pending until the
                table shows them committed."""
        # Step 1. Commit what the table lacks.
        if self.committer and handles:
            apps = sorted({h.handle.app for h in handles})
            plan = plan_recovery(handles, {a: self.table.committed_version(a) for a in apps})
            if plan.to_commit:
                files = []
                for h in plan.to_commit:
                    f = h.handle
                    files.append(self._staged(f.job, h.checkpoint_id, h.task_index, f.attempt,
                                              f.file, f.rows))
                self.table.commit(files, plan.versions, self.fault)
            for h in plan.committed:
                fs.remove(self._staged_path(h.handle))
        # Step 2. Clean up.
        self._clean_staging({(h.handle.job, h.handle.file) for h in handles})
        # Step 3. Pending.
        for h in handles:
            if h.task_index == self.info.task_index and not self.committer:
                self._pending.setdefault(h.checkpoint_id, []).append(h)

    def _clean_staging(self, named: set[tuple[str, str]]) -> None:
        info = self.info
        if not fs.exists(self.staging):
            return
        for job_dir in fs.listdir(self.staging):
            folder = fs.join(self.staging, job_dir)
            if not fs.is_dir(folder):
                continue
            same_job = job_dir == safe(info.job_id)
            for name in fs.listdir(folder):
                m = _STAGED.match(name) or _INPROGRESS.match(name)
                if m is None:
                    continue
                task, attempt = (int(m[2]), int(m[3])) if name[0] == "c" else \
                    (int(m[1]), int(m[2]))
                if task % info.parallelism != info.task_index:
                    continue
                if same_job and attempt >= info.attempt:
                    continue
                if any(job_dir == safe(j) and name == f for j, f in named):
                    continue
                fs.remove(fs.join(folder, name))


def require_lost(path: str, uid: str) -> OutputLostError:
    """The error for a staged file that a restored handle names and that is gone."""
    return OutputLostError(
        f"lakehouse sink {uid!r}: the staged file {fs.redact(path)} of a completed "
        "checkpoint is gone (deleted outside Lockgate) and the table does not hold it; "
        "restore the file, or restart the job without this checkpoint's state")

