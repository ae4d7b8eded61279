"""An exactly-once file sink (JSONL or Parquet) built on two-phase commit.

File life cycle of one transaction (one file per task per checkpoint:
Flink's ``OnCheckpointRollingPolicy``)::

    .part-{uid}-{task}-{attempt}-{seq}.{ext}.inprogress   written while records arrive
    .part-{uid}-{task}-{attempt}-{seq}.{ext}.pending      at pre-commit (flushed, fsynced)
     part-{uid}-{task}-{attempt}-{seq}.{ext}              at commit (visible)

Names starting with ``.`` are skipped by Spark, Hadoop and pyarrow dataset
readers, so only committed output is ever read. The names and the recovery
plan are :mod:`lockgate.connectors.filesink_plan`'s (pure); the writer only
executes the plan. The record formats are :mod:`lockgate.connectors.formats`.

The folder is a local path or a URL (``file://``, ``s3://``, ``hdfs://``; see
:mod:`lockgate.fs`, which every filesystem call goes through). Local folders
use plain Python I/O with fsync. On an object store (S3) there is no rename
and no folder: the in-progress stage is the upload itself (an object is
invisible until its upload completes), so a streaming part is written
straight under its hidden pending name and completed at pre-commit; commit
is a server-side copy pending -> final, then the delete of the pending
object; a retried commit finds either the pending object (copy again, same
bytes) or only the final one (already committed). A folder must not be
shared by two running jobs that use the same sink uid.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import IO, Any, cast

from lockgate import fs
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.filesink_plan import (
    FilePartHandle,
    check_handle,
    final_name,
    inprogress_name,
    parse_part_name,
    pending_name,
    plan_file_sink_recovery,
)
from lockgate.connectors.formats import JsonlFormat, ParquetFormat, RecordFormat
from lockgate.connectors.twophase import Precommitted, TwoPhaseCommitSinkWriter
from lockgate.errors import (
    ConfigurationError,
    LockgateError,
    OutputLostError,
    SavepointMismatchError,
)
from lockgate.fs.explain import explain

__all__ = ["FileSink", "FileSinkWriter", "FileTxn", "ensure_writable_dir", "existing_parts"]

SINK_MODES = ("error", "append", "overwrite")


def _probe_local(folder: str, probe_name: str) -> None:
    """Prove the local ``folder`` writable: an unnamed file (``O_TMPFILE``),
    which nothing has to remove (a task killed in the middle leaves nothing),
    else, where the filesystem has none, a file named ``probe_name``, written
    and removed."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            os.close(os.open(folder, flag | os.O_WRONLY, 0o600))
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    probe = os.path.join(folder, probe_name)
    with open(probe, "wb") as f:
        f.write(b"")
    os.remove(probe)


def ensure_writable_dir(folder: str, probe_name: str) -> None:
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
        try:
            _probe_local(local, probe_name)
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
            f"file sink folder {explain(e, folder)}") from e


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
    batches: list[Any] = field(default_factory=list)
    """Record batches (the Arrow path), written as they are (Parquet)."""
    count: int = 0


class FileSinkWriter(TwoPhaseCommitSinkWriter[FileTxn, FilePartHandle]):
    """Writes one task's part files; see the module docstring for the names."""

    accepts_arrow = True
    """``pyarrow.RecordBatch`` es are written to Parquet as they are (JSONL: as rows)."""

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
            ensure_writable_dir(self.folder, probe)
            self._direct = fs.is_object_store(self.folder)
            self._ready = True

    # -- 2PC hooks

    def decode_handle(self, entry: dict[str, Any]) -> FilePartHandle:
        """A restored handle, checked: it names this sink's part files only."""
        return check_handle(entry, self.info.uid)

    def recover(self, handles: list[Precommitted[FilePartHandle]]) -> None:
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
        names = fs.listdir(self.folder)
        plan = plan_file_sink_recovery(
            names,
            handles,
            self.info.uid,
            self.info.task_index,
            self.info.parallelism,
        )
        # Step 3. Commit.
        recorded = sorted({h.handle.folder for h in handles if h.handle.folder})
        moved_from = recorded[0] if recorded and fs.redact(self.folder) not in recorded else None
        for pending, final in plan.to_commit:
            self._commit_names(pending, final, moved_from)
        # Step 4. Delete (and the probes of earlier attempts killed while probing).
        doomed = list(plan.to_delete) + self._stale_probes(names)
        for name in doomed:
            fs.remove(fs.join(self.folder, name))
        if doomed:
            fs.sync_dir(self.folder)
        # Step 5. Sequence numbers.
        self._seq = max(self._seq, plan.next_seq)

    def _stale_probes(self, names: list[str]) -> list[str]:
        """Probe files (:meth:`_ensure_ready`) of this sink's earlier attempts
        on this task's index, or on an index that is this task's after a
        rescale down: left when a task was killed between creating and
        removing its probe."""
        info = self.info
        prefix = f".lockgate-probe-{info.uid}-"
        stale = []
        for name in names:
            index, _, attempt = name[len(prefix):].partition("-") if name.startswith(prefix) \
                else ("", "", "")
            if (index.isdigit() and attempt.isdigit() and int(attempt) < info.attempt
                    and int(index) % info.parallelism == info.task_index):
                stale.append(name)
        return stale

    def begin_transaction(self) -> FileTxn:
        """Open a new in-progress part file (streaming formats) or a buffer."""
        self._ensure_ready()
        info = self.info
        final = final_name(info.uid, info.task_index, info.attempt, self._seq, self.fmt.ext)
        self._seq += 1
        hidden = pending_name(final) if self._direct else inprogress_name(final)
        txn = FileTxn(final=final, inprogress_path=fs.join(self.folder, hidden))
        if self.fmt.streaming:
            txn.file = fs.open_write(txn.inprogress_path)
        return txn

    def write(self, txn: FileTxn, batch: list[Any]) -> None:
        """Append ``batch`` (one write call) or buffer it (Parquet)."""
        if not isinstance(cast(Any, batch), list):  # a pyarrow.RecordBatch
            if not self.fmt.streaming:
                txn.batches.append(batch)
                txn.count += len(batch)
                return
            batch = cast(Any, batch).to_pylist()
        if txn.file is not None:
            txn.file.write(self.fmt.encode_batch(batch))
        else:
            txn.records.extend(batch)
        txn.count += len(batch)

    def pre_commit(self, txn: FileTxn) -> FilePartHandle:
        """Make the part file durable under its pending name.

        Step 1. Write the buffered records (buffered formats).
        Step 2. Flush, fsync and close the in-progress file (object store:
                complete the upload, straight under the pending name).
        Step 3. Rename it to the pending name and fsync the folder.
        Step 4. Return the handle: pending and final name, records, folder.
        """
        # Step 1. Buffered formats write now.
        if txn.file is None:
            txn.file = fs.open_write(txn.inprogress_path)
            if txn.batches:
                self.fmt.write_batches(txn.file, txn.batches, txn.records)
            else:
                self.fmt.write_file(txn.file, txn.records)
            txn.records, txn.batches = [], []
        # Step 2. Durable.
        fs.finish_write(txn.file)
        txn.file = None
        # Step 3. Pending (still hidden).
        pending = pending_name(txn.final)
        if not self._direct:
            fs.move(txn.inprogress_path, fs.join(self.folder, pending))
            fs.sync_dir(self.folder)
        # Step 4. Handle.
        return FilePartHandle(pending, txn.final, txn.count, fs.redact(self.folder))

    def commit(self, entry: Precommitted[FilePartHandle]) -> None:
        """Rename pending -> final (object store: copy, then delete the pending
        object); idempotent."""
        self._commit_names(entry.handle.pending, entry.handle.final)

    def _commit_names(self, pending: str, final: str, moved_from: str | None = None) -> None:
        """Step 1. Pending present: rename it to final, fsync the folder (object
                store: copy it to final, then delete it; if that stopped
                half-way, both exist and doing it again finishes it).
        Step 2. Else final present: already committed, nothing to do.
        Step 3. Else the committed output was lost: raise."""
        pending_path = fs.join(self.folder, pending)
        final_path = fs.join(self.folder, final)
        # Step 1. Commit.
        if fs.exists(pending_path):
            fs.move(pending_path, final_path)
            fs.sync_dir(self.folder)
            return
        # Step 2. Already committed.
        if fs.exists(final_path):
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

    def abort(self, txn: FileTxn) -> None:
        """Delete an open transaction's in-progress file."""
        if txn.file is not None:
            try:
                txn.file.close()
            finally:
                txn.file = None
        txn.records, txn.batches = [], []
        fs.remove(txn.inprogress_path)


# ---------------------------------------------------------------- the sink


class FileSink(Sink[Any]):
    """Exactly-once files (``"jsonl"`` or ``"parquet"``) in the folder ``path``,
    one part file per task per checkpoint, visible once the checkpoint completes."""

    exactly_once = True

    def __init__(self, path: str, format: str = "jsonl", mode: str = "error") -> None:
        """``path``: the output folder (created if missing), a local path or a
        URL every task can reach (``file://``, ``s3://``, ``hdfs://``, see
        :mod:`lockgate.fs`); ``format``: ``"jsonl"`` or ``"parquet"``.

        ``mode``: what a job that starts without state for this sink (a new
        job, not a resumed one) does with committed part files of this sink
        (its uid) already in the folder: ``"error"`` (the default) refuses to
        start, naming the choices; ``"overwrite"`` deletes them first;
        ``"append"`` adds new files beside them. A job that resumes or
        restores the sink's state keeps its files whatever the mode."""
        if format not in _SINK_FORMATS:
            raise LockgateError(
                f"FileSink: unknown format {format!r}; use one of {sorted(_SINK_FORMATS)}"
            )
        if mode not in SINK_MODES:
            raise LockgateError(
                f"FileSink: unknown mode {mode!r}; use \"error\" (refuse a folder holding this "
                "sink's output from an earlier run), \"overwrite\" or \"append\"")
        self.mode = mode
        # resolved here, in the driver: a task on a cluster runs in its
        # executor's working folder
        self.path = fs.absolute(path)
        self.format = format

    def task_modules(self) -> tuple[str, ...]:
        parquet = ("pyarrow.parquet",) if self.format == "parquet" else ()
        return parquet + fs.modules_for(self.path)

    def validate(self) -> None:
        """The folder must be creatable and writable before the job starts."""
        ensure_writable_dir(self.path, ".lockgate-probe-driver")

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        """A :class:`FileSinkWriter` for task ``info``."""
        return FileSinkWriter(info, self.path, _SINK_FORMATS[self.format]())

    def __repr__(self) -> str:
        return f"FileSink({fs.redact(self.path)!r}, format={self.format!r}, mode={self.mode!r})"


def existing_parts(folder: str, uid: str) -> tuple[list[str], list[str]]:
    """The part files of sink ``uid`` in ``folder``: (committed, hidden)."""
    if not fs.is_dir(folder):
        return [], []
    parts = [(name, p) for name in fs.listdir(folder)
             if (p := parse_part_name(name)) is not None and p.uid == uid]
    return ([n for n, p in parts if not p.hidden], [n for n, p in parts if p.hidden])
