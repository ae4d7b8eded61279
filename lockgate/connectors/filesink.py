"""An exactly-once file sink (JSONL or Parquet) built on two-phase commit.

File life cycle of one transaction (one file per task per checkpoint:
Flink's ``OnCheckpointRollingPolicy``)::

    .part-{uid}-{task}-{attempt}-{seq}.{ext}.inprogress   written while records arrive
    .part-{uid}-{task}-{attempt}-{seq}.{ext}.pending      at pre-commit (flushed, fsynced)
     part-{uid}-{task}-{attempt}-{seq}.{ext}              at commit (visible)

Names starting with ``.`` are skipped by Spark, Hadoop and pyarrow dataset
readers, so only committed output is ever read. Recovery is decided by the pure
function :func:`plan_file_sink_recovery`; the writer only executes the plan.

The folder is a local path or a URL (``file://``, ``s3://``, ``hdfs://``; see
:mod:`lockgate.fs`); every filesystem call goes through the small ``_fs_*``
helpers below. Local folders use plain Python I/O with fsync. On an object store
(S3) there is no rename and no folder: the in-progress stage is the upload
itself (an object is invisible until its upload completes), so a streaming
part is written straight under its hidden pending name and completed at
pre-commit; commit is a server-side copy pending -> final, then the delete of
the pending object; a retried commit finds either the pending object (copy
again, same bytes) or only the final one (already committed).
A folder must not be shared by two running jobs that use the same sink uid.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from lockgate import fs
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.twophase import TwoPhaseCommitSinkWriter
from lockgate.errors import (
    CheckpointCorruptError,
    ConfigurationError,
    LockgateError,
    OutputLostError,
    SavepointMismatchError,
)
from lockgate.untrusted import plain_name

__all__ = [
    "FileSink",
    "FileSinkWriter",
    "FileSinkRecoveryPlan",
    "PartName",
    "FileTxn",
    "plan_file_sink_recovery",
    "parse_part_name",
    "final_name",
    "inprogress_name",
    "pending_name",
    "RecordFormat",
    "JsonlFormat",
    "ParquetFormat",
]

INPROGRESS_SUFFIX = ".inprogress"
PENDING_SUFFIX = ".pending"

# ------------------------------------------------------------------ names

_PART_RE = re.compile(
    r"^(?P<hidden>\.?)part-(?P<uid>.+)-(?P<task>\d+)-(?P<attempt>\d+)-(?P<seq>\d+)"
    r"\.(?P<ext>[A-Za-z0-9]+)(?P<suffix>\.inprogress|\.pending)?$"
)


@dataclass(frozen=True)
class PartName:
    """A parsed part-file name.

    ``kind`` is ``"inprogress"``, ``"pending"`` or ``"final"``.
    """

    uid: str
    task_index: int
    attempt: int
    seq: int
    ext: str
    kind: str

    @property
    def hidden(self) -> bool:
        """Whether readers skip this file (in-progress or pending)."""
        return self.kind != "final"

    @property
    def final(self) -> str:
        """The visible name this part gets once committed."""
        return final_name(self.uid, self.task_index, self.attempt, self.seq, self.ext)


def final_name(uid: str, task_index: int, attempt: int, seq: int, ext: str) -> str:
    """The visible name of a committed part file."""
    return f"part-{uid}-{task_index}-{attempt}-{seq}.{ext}"


def inprogress_name(final: str) -> str:
    """The hidden name a part file has while records are written into it."""
    return f".{final}{INPROGRESS_SUFFIX}"


def pending_name(final: str) -> str:
    """The hidden name a part file has between pre-commit and commit."""
    return f".{final}{PENDING_SUFFIX}"


def parse_part_name(name: str) -> PartName | None:
    """Parse a part-file name (any of the three kinds); ``None`` if ``name`` is
    not one. A hidden name must carry a suffix and a visible one must not."""
    m = _PART_RE.match(name)
    if m is None:
        return None
    hidden, suffix = m.group("hidden"), m.group("suffix")
    if bool(hidden) != bool(suffix):
        return None
    kind = "final" if not suffix else suffix[1:]
    return PartName(
        uid=m.group("uid"),
        task_index=int(m.group("task")),
        attempt=int(m.group("attempt")),
        seq=int(m.group("seq")),
        ext=m.group("ext"),
        kind=kind,
    )


def part_sort_key(name: str) -> tuple[Any, ...]:
    """Sort key ordering part files by (uid, task, attempt, seq) numerically,
    other names after them by name."""
    p = parse_part_name(name)
    if p is None:
        return (1, name)
    return (0, p.uid, p.task_index, p.attempt, p.seq, p.ext, name)


# ---------------------------------------------------------------- recovery plan


@dataclass
class FileSinkRecoveryPlan:
    """What one writer does at restore.

    Attributes:
        to_commit: ``(pending, final)`` names to commit, in checkpoint order.
        to_delete: hidden files to delete.
        next_seq: first sequence number this task may use for new files (above
            every sequence number of this uid and task index seen in the listing
            or the handles, so names never collide with older output).
    """

    to_commit: list[tuple[str, str]] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    next_seq: int = 0


def check_handle(handle: Any, uid: str) -> None:
    """A restored pre-commit handle of the sink ``uid`` names this sink's part
    files and nothing else (untrusted input: :mod:`lockgate.untrusted`)."""
    what = f"file sink {uid!r}: a pre-committed part's"
    if not isinstance(handle, dict):
        raise CheckpointCorruptError(f"{what} handle is {handle!r}, not a mapping: the "
                                     "checkpoint or savepoint is damaged or was crafted")
    final = plain_name(handle.get("final"), f"{what} final name")
    pending = plain_name(handle.get("pending"), f"{what} pending name")
    part = parse_part_name(final)
    if part is None or part.kind != "final" or part.uid != uid or pending != pending_name(final):
        raise CheckpointCorruptError(
            f"{what} names are {pending!r} and {final!r}, not this sink's part files: the "
            "checkpoint or savepoint is damaged or was crafted; it is not restored, and "
            "nothing in the sink's folder was touched")
    for key in ("task_index", "checkpoint_id"):
        if type(handle.get(key)) is not int or handle[key] < 0:
            raise CheckpointCorruptError(f"{what} {key} is {handle.get(key)!r}: the "
                                         "checkpoint or savepoint is damaged or was crafted")


def plan_file_sink_recovery(
    listing: list[str],
    handles: list[dict[str, Any]],
    uid: str,
    task_index: int,
    parallelism: int,
) -> FileSinkRecoveryPlan:
    """Decide what a restored file-sink writer commits and deletes (pure).

    Args:
        listing: the names in the sink folder.
        handles: the restored entries of ALL tasks of this sink (each with
            ``"pending"``, ``"final"``, ``"checkpoint_id"``, ``"task_index"``).
        uid, task_index, parallelism: the restored writer's identity.

    Rules:
        * commit the handles with ``task_index % parallelism == task_index``
          unless already committed (final listed, pending not); a handle whose
          two files are both missing is still planned, so that committing it
          reports the lost output;
        * delete the hidden files (in-progress or pending) of this uid whose task
          index is this task's, or, for task 0 only, is ``>= parallelism``, unless
          a handle of any task names them;
        * never touch visible files or files of other uids.
    """
    # Step 1. Index the listing and the names the handles protect (after
    # checking them: they come from a checkpoint).
    for h in handles:
        check_handle(h, uid)
    present = set(listing)
    named: set[str] = set()
    for h in handles:
        named.add(str(h["pending"]))
        named.add(str(h["final"]))
    # Step 2. Commit this task's handles, in checkpoint order.
    to_commit: list[tuple[str, str]] = []
    mine = [h for h in handles if int(h["task_index"]) % parallelism == task_index]
    for h in sorted(mine, key=lambda h: int(h["checkpoint_id"])):
        pending, final = str(h["pending"]), str(h["final"])
        if pending not in present and final in present:
            continue  # already committed
        to_commit.append((pending, final))
    # Step 3. Delete orphans this task owns; find the next free sequence number.
    to_delete: list[str] = []
    next_seq = 0
    for name in sorted(present | named, key=part_sort_key):
        p = parse_part_name(name)
        if p is None or p.uid != uid:
            continue
        if p.task_index == task_index:
            next_seq = max(next_seq, p.seq + 1)
        if not p.hidden or name in named or name not in present:
            continue
        if p.task_index == task_index or (task_index == 0 and p.task_index >= parallelism):
            to_delete.append(name)
    return FileSinkRecoveryPlan(to_commit=to_commit, to_delete=to_delete, next_seq=next_seq)


# ------------------------------------------------------- filesystem helpers
# A folder is a local path or a URL (lockgate.fs): local folders keep plain
# Python I/O with fsync; other filesystems go through pyarrow.fs.


def _fs_join(folder: str, name: str) -> str:
    return fs.join(folder, name)


def _fs_ensure_writable_dir(folder: str, probe_name: str) -> None:
    """Create ``folder`` if needed and prove it is writable (a probe file is
    created and removed; ``os.access`` lies for root). An object store has no
    folders: the probe proves the bucket exists and may be written."""
    local = fs.local_path(folder)
    if local is not None:
        fix = "choose a folder this process can create and write, or fix its permissions"
        try:
            os.makedirs(local, exist_ok=True)
        except OSError as e:
            raise ConfigurationError(
                f"file sink folder {folder!r} cannot be created ({e}); {fix}") from e
        if not os.path.isdir(local):
            raise ConfigurationError(f"file sink folder {folder!r} is not a directory; {fix}")
        probe = os.path.join(local, probe_name)
        try:
            with open(probe, "wb") as f:
                f.write(b"")
            os.remove(probe)
        except OSError as e:
            raise ConfigurationError(
                f"file sink folder {folder!r} is not writable ({e}); {fix}") from e
        return
    try:
        fs.makedirs(folder)
        probe = fs.join(folder, probe_name)
        fs.finish_write(fs.open_write(probe))
        fs.remove(probe)
    except (OSError, ValueError) as e:
        raise ConfigurationError(
            f"file sink folder {fs.explain(e, folder)}") from e


def _fs_list(folder: str) -> list[str]:
    local = fs.local_path(folder)
    return os.listdir(local) if local is not None else fs.listdir(folder)


def _fs_exists(path: str) -> bool:
    return fs.exists(path)


def _fs_open_write(path: str) -> IO[bytes]:
    return fs.open_write(path)


def _fs_sync_close(f: IO[bytes]) -> None:
    """Flush, fsync and close a local file; complete an object's upload."""
    fs.finish_write(f)


def _fs_rename(src: str, dst: str) -> None:
    """Rename (local, HDFS: atomic) or, on an object store, server-side copy
    then delete the source: see :func:`lockgate.fs.move`."""
    fs.move(src, dst)


def _fs_remove(path: str) -> None:
    fs.remove(path)


def _fs_sync_dir(folder: str) -> None:
    """Make renames in a local ``folder`` durable (no-op where directories cannot
    be opened, e.g. Windows, and on object stores and HDFS)."""
    fs.sync_dir(folder)


# ---------------------------------------------------------------- formats


class RecordFormat:
    """How records become file bytes. Streaming formats encode every batch as it
    arrives (one ``write`` call per batch); buffered formats (Parquet) keep the
    records and write the whole file at pre-commit."""

    ext: str = ""
    streaming: bool = True

    def encode_batch(self, batch: list[Any]) -> bytes:
        """Bytes of ``batch`` (streaming formats)."""
        raise NotImplementedError

    def write_file(self, f: IO[bytes], records: list[Any]) -> None:
        """Write all ``records`` into ``f`` (buffered formats)."""
        raise NotImplementedError


class JsonlFormat(RecordFormat):
    """One compact JSON document per line."""

    ext = "jsonl"
    streaming = True

    def __init__(self) -> None:
        """Precompile the encoders (this is the hot path)."""
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def encode_batch(self, batch: list[Any]) -> bytes:
        """``batch`` as newline-terminated JSON lines: orjson (a C encoder, about
        ten times faster than ``json``; NaN and infinities become ``null``),
        falling back to ``json`` for what orjson refuses (integers beyond 64 bits)."""
        try:
            return _encode_flat(batch) or b"\n".join(map(_orjson_dumps, batch)) + b"\n"
        except (TypeError, ValueError):
            pass
        try:
            text = "\n".join(map(self._encode, batch))
        except (TypeError, ValueError) as e:
            raise LockgateError(
                f"file sink (jsonl): a record cannot be written as JSON ({e}); map records "
                "to dicts/lists of str, int, float, bool and None before the sink"
            ) from e
        return (text + "\n").encode("utf-8")


_orjson_dumps = functools.partial(orjson.dumps, option=orjson.OPT_NON_STR_KEYS)


def _encode_flat(batch: list[Any]) -> bytes | None:
    """JSON lines of a batch of numbers, booleans and nulls, or of flat rows
    (tuples/lists) of them, with ONE encoder call for the whole batch. The
    encoded array is split into lines only when it provably has that shape:
    no string or object anywhere, and either no bracket inside (scalars) or
    exactly one ``[`` per record and ``],[`` between records (flat rows).
    ``None`` when the batch has another shape."""
    if not batch:
        return None
    inner = orjson.dumps(batch)[1:-1]
    if b'"' in inner or b"{" in inner:
        return None
    if b"[" not in inner:
        return inner.replace(b",", b"\n") + b"\n"
    n = len(batch)
    if inner.count(b"[") == n and inner.count(b"],[") == n - 1:
        return inner.replace(b"],[", b"]\n[") + b"\n"
    return None


class ParquetFormat(RecordFormat):
    """A Parquet file per transaction, written with pyarrow at pre-commit.
    Dict records become columns; any other records become one column ``value``."""

    ext = "parquet"
    streaming = False

    def write_file(self, f: IO[bytes], records: list[Any]) -> None:
        """Write ``records`` as one Parquet table into ``f``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if all(isinstance(r, dict) for r in records):
                table = pa.Table.from_pylist(records)
            else:
                table = pa.table({"value": records})
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise LockgateError(
                f"file sink (parquet): the records cannot form an Arrow table ({e}); emit "
                "dicts with the same keys and consistently typed values"
            ) from e
        pq.write_table(table, f)


_SINK_FORMATS: dict[str, type[RecordFormat]] = {"jsonl": JsonlFormat, "parquet": ParquetFormat}


# ---------------------------------------------------------------- the writer


@dataclass
class FileTxn:
    """One open transaction: one in-progress part file."""

    final: str
    inprogress_path: str
    """Where the records are written: the hidden in-progress name, or on an
    object store the pending name (nothing is visible before pre-commit)."""
    file: IO[bytes] | None = None
    records: list[Any] = field(default_factory=list)
    count: int = 0


class FileSinkWriter(TwoPhaseCommitSinkWriter[FileTxn]):
    """Writes one task's part files; see the module docstring for the names."""

    def __init__(self, info: TaskInfo, folder: str, fmt: RecordFormat) -> None:
        """A writer of ``fmt`` files into ``folder`` for task ``info``."""
        super().__init__(info)
        self.folder = folder
        self.fmt = fmt
        self._seq = 0
        self._ready = False
        self._direct = False
        """Write parts under their pending name (object stores: no rename)."""

    def _ensure_ready(self) -> None:
        if not self._ready:
            probe = f".lockgate-probe-{self.info.uid}-{self.info.task_index}-{self.info.attempt}"
            _fs_ensure_writable_dir(self.folder, probe)
            self._direct = fs.is_object_store(self.folder)
            self._ready = True

    # -- 2PC hooks

    def recover(self, handles: list[dict[str, Any]]) -> None:
        """Restore the folder to the checkpoint's view.

        Step 1. Create the folder and check it is writable (fail before writing).
        Step 2. List the folder and plan with :func:`plan_file_sink_recovery`.
        Step 3. Commit the planned pending files (idempotent; lost output raises).
        Step 4. Delete the planned orphans and make the deletions durable.
        Step 5. Continue sequence numbers after every existing part of this task.
        """
        # Step 1. Folder.
        self._ensure_ready()
        # Step 2. Plan.
        plan = plan_file_sink_recovery(
            _fs_list(self.folder),
            handles,
            self.info.uid,
            self.info.task_index,
            self.info.parallelism,
        )
        # Step 3. Commit.
        recorded = sorted({str(h["folder"]) for h in handles if h.get("folder")})
        moved_from = recorded[0] if recorded and fs.redact(self.folder) not in recorded else None
        for pending, final in plan.to_commit:
            self._commit_names(pending, final, moved_from)
        # Step 4. Delete.
        for name in plan.to_delete:
            _fs_remove(_fs_join(self.folder, name))
        if plan.to_delete:
            _fs_sync_dir(self.folder)
        # Step 5. Sequence numbers.
        self._seq = max(self._seq, plan.next_seq)

    def begin_transaction(self) -> FileTxn:
        """Open a new in-progress part file (streaming formats) or a buffer."""
        self._ensure_ready()
        info = self.info
        final = final_name(info.uid, info.task_index, info.attempt, self._seq, self.fmt.ext)
        self._seq += 1
        hidden = pending_name(final) if self._direct else inprogress_name(final)
        txn = FileTxn(final=final, inprogress_path=_fs_join(self.folder, hidden))
        if self.fmt.streaming:
            txn.file = _fs_open_write(txn.inprogress_path)
        return txn

    def write(self, txn: FileTxn, batch: list[Any]) -> None:
        """Append ``batch`` (one write call) or buffer it (Parquet)."""
        if txn.file is not None:
            txn.file.write(self.fmt.encode_batch(batch))
        else:
            txn.records.extend(batch)
        txn.count += len(batch)

    def pre_commit(self, txn: FileTxn) -> dict[str, Any]:
        """Make the part file durable under its pending name.

        Step 1. Write the buffered records (buffered formats).
        Step 2. Flush, fsync and close the in-progress file (object store:
                complete the upload, straight under the pending name).
        Step 3. Rename it to the pending name and fsync the folder.
        Step 4. Return the handle ``{"pending", "final", "records"}``.
        """
        # Step 1. Buffered formats write now.
        if txn.file is None:
            txn.file = _fs_open_write(txn.inprogress_path)
            self.fmt.write_file(txn.file, txn.records)
            txn.records = []
        # Step 2. Durable.
        _fs_sync_close(txn.file)
        txn.file = None
        # Step 3. Pending (still hidden).
        pending = pending_name(txn.final)
        if not self._direct:
            _fs_rename(txn.inprogress_path, _fs_join(self.folder, pending))
            _fs_sync_dir(self.folder)
        # Step 4. Handle.
        return {"pending": pending, "final": txn.final, "records": txn.count,
                "folder": fs.redact(self.folder)}

    def commit(self, handle: dict[str, Any]) -> None:
        """Rename pending -> final (object store: copy, then delete the pending
        object); idempotent."""
        self._commit_names(str(handle["pending"]), str(handle["final"]))

    def _commit_names(self, pending: str, final: str, moved_from: str | None = None) -> None:
        """Step 1. Pending present: rename it to final, fsync the folder (object
                store: copy it to final, then delete it; if that stopped
                half-way, both exist and doing it again finishes it).
        Step 2. Else final present: already committed, nothing to do.
        Step 3. Else the committed output was lost: raise."""
        pending_path = _fs_join(self.folder, pending)
        final_path = _fs_join(self.folder, final)
        # Step 1. Commit.
        if _fs_exists(pending_path):
            _fs_rename(pending_path, final_path)
            _fs_sync_dir(self.folder)
            return
        # Step 2. Already committed.
        if _fs_exists(final_path):
            return
        # Step 3. Lost: or never here, because the sink's folder changed.
        if moved_from is not None:
            raise SavepointMismatchError(
                f"file sink {self.info.uid!r} wrote to {moved_from} when the checkpoint was "
                f"taken, and now writes to {fs.redact(self.folder)}, which does not hold its "
                f"pre-committed output ({pending!r}). To go on writing there, give the sink "
                "its old location (or move the folder with its hidden files); to start this "
                "sink afresh in the new one, give it a new uid and restore with "
                "allow_non_restored_state=True (--allow-non-restored-state)")
        raise OutputLostError(
            f"file sink {self.info.uid!r}: committed output was lost: neither {pending!r} nor "
            f"{final!r} exists in {fs.redact(self.folder)!r} (deleted or moved outside "
            "Lockgate); restore the file, or restart the job without this checkpoint's state"
        )

    def abort(self, handle_or_txn: Any) -> None:
        """Delete an open transaction's in-progress file or a handle's pending file."""
        if isinstance(handle_or_txn, FileTxn):
            txn = handle_or_txn
            if txn.file is not None:
                try:
                    txn.file.close()
                finally:
                    txn.file = None
            txn.records = []
            _fs_remove(txn.inprogress_path)
        else:
            _fs_remove(_fs_join(self.folder, str(handle_or_txn["pending"])))


# ---------------------------------------------------------------- the sink


class FileSink(Sink[Any]):
    """Exactly-once files (``"jsonl"`` or ``"parquet"``) in the folder ``path``,
    one part file per task per checkpoint, visible once the checkpoint completes."""

    exactly_once = True

    def __init__(self, path: str, format: str = "jsonl") -> None:
        """``path``: the output folder (created if missing), a local path or a
        URL every task can reach (``file://``, ``s3://``, ``hdfs://``, see
        :mod:`lockgate.fs`); ``format``: ``"jsonl"`` or ``"parquet"``."""
        if format not in _SINK_FORMATS:
            raise LockgateError(
                f"FileSink: unknown format {format!r}; use one of {sorted(_SINK_FORMATS)}"
            )
        # resolved here, in the driver: a task on a cluster runs in its
        # executor's working folder
        self.path = fs.absolute(path)
        self.format = format

    def validate(self) -> None:
        """The folder must be creatable and writable before the job starts."""
        _fs_ensure_writable_dir(self.path, ".lockgate-probe-driver")

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        """A :class:`FileSinkWriter` for task ``info``."""
        return FileSinkWriter(info, self.path, _SINK_FORMATS[self.format]())

    def __repr__(self) -> str:
        return f"FileSink({self.path!r}, format={self.format!r})"
