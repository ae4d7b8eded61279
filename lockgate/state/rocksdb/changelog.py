"""The RocksDB backend's changelog: incremental checkpoints that upload what
changed, not what RocksDB rewrote (``RocksDBStateBackend(changelog=True)``,
the default).

Without it, a checkpoint is a RocksDB checkpoint (the memtable flushed, the
SST files hard-linked) and every SST file new since the last one is
uploaded. With uniformly random keys, compactions rewrite the whole state
again and again: the bytes a checkpoint uploads were 1-12 times what changed
(the mean over a run, README's W2), and the barrier waited for the flush.
Flink's changelog state backend (FLIP-158) and Spark's RocksDB state store
with changelog checkpointing split the two, and so does this module:

* Every write of the backend's tables goes through :class:`LoggedDB`, which
  keeps, besides RocksDB, the last value written to each RocksDB key since
  the previous snapshot (``None``: deleted).
* A checkpoint's synchronous part writes the value cache back and takes that
  log (a dict swapped for an empty one: no flush, no hard links). Its
  asynchronous part writes the log as one sorted SST file (deletions as
  tombstones) and uploads it into ``<job>/shared/``. The handle names the
  last *materialization*'s files and the changelog files since it, oldest
  first (:class:`~lockgate.state.incremental.IncrementalState`).
* A *materialization* is a RocksDB checkpoint taken between records (a
  background flush first, :mod:`~lockgate.state.rocksdb.flush`'s
  ``start_flush``, then a short final one), once the changelog since the
  last one holds ``materialize_ratio`` times the state's size or
  ``max_changelog`` files. The log is cut at that moment; the next
  checkpoint uploads the materialization's new SST files and starts a new
  changelog. Bytes uploaded per checkpoint on average: the changes, plus the
  state's size once per ``materialize_ratio`` of it.
* Restore: the materialization's files as before, then each changelog file
  ingested in order (a newer entry shadows an older one, a tombstone deletes)
  into the database, before any range is cut out for a rescale
  (:func:`~lockgate.state.rocksdb.io.apply_changelog`).
* The log lives in the task's memory: once it (with the logs savepoints
  carry for the next checkpoint, :attr:`Chain.carried`) holds more entries
  than a quarter of ``memory_mb`` pays for (:func:`log_limit`), the backend
  materializes between records, which empties it (and the next snapshot's
  materialization supersedes what was carried).

The chain is only as good as its weakest link: a snapshot whose writing
failed breaks it (:attr:`Chain.broken`), later snapshots of the same chain
are declined, and the next snapshot taken materializes synchronously. The
first checkpoint of an attempt materializes synchronously too (there is no
chain yet); its RocksDB checkpoint has only the writes since the start to
flush.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.errors import LockgateError
from lockgate.state.incremental import IncrementalState, SharedFile, shared_file_name
from lockgate.state.rocksdb.io import options, require, upload

if TYPE_CHECKING:
    from lockgate.state.backends import StateFileWriter
    from lockgate.state.choice import BackendScope, RocksDBStateBackend
    from lockgate.state.rocksdb.recovery import LocalCopies

__all__ = ["LoggedDB", "LoggedBatch", "log_limit", "Chain", "Materialized", "Step", "advance",
           "handle", "write_segment", "upload_folder", "upload_shared", "write_private"]


class ChangelogHost(Protocol):
    """What the changelog's steps use of their backend
    (``state.rocksdb.RocksDBKeyedStateBackend``)."""

    config: RocksDBStateBackend
    scope: BackendScope
    folder: str
    key_group_range: range
    copies: LocalCopies | None
    uploaded: dict[str, SharedFile]
    """The SST files of the database already in the job's shared folder."""
    fault: Callable[[str], None]


LOG_ENTRY_BYTES = 160
"""About what one entry of the log costs in memory (a dict slot, a key and
a value as bytes objects)."""


def log_limit(config: RocksDBStateBackend) -> int:
    """Entries the log may hold: a quarter of the memory budget. Beyond, the
    backend materializes between records (a materialization empties the
    log) instead of waiting for the next checkpoint."""
    return (config.memory_mb << 20) // 4 // LOG_ENTRY_BYTES


class LoggedBatch:
    """A RocksDB write batch whose writes :meth:`LoggedDB.write` also logs."""

    __slots__ = ("batch", "ops")

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.ops: list[tuple[bytes, bytes | None]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.batch.put(key, value)
        self.ops.append((key, value))

    def delete(self, key: bytes) -> None:
        self.batch.delete(key)
        self.ops.append((key, None))


class LoggedDB:
    """The backend's database as its tables see it: reads go to RocksDB,
    every write also into :attr:`log` (RocksDB key -> the last value written
    since the log was taken, ``None`` for a deletion)."""

    def __init__(self, db: Any) -> None:
        self.raw = db
        self.log: dict[bytes, bytes | None] = {}
        self.unlogged = False
        """A range was deleted (restore): the log cannot say it, the next
        snapshot must materialize."""
        self.get = db.get  # the hot reads: no indirection
        self.iter = db.iter
        self.property_int_value = db.property_int_value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def put(self, key: bytes, value: bytes) -> None:
        self.raw.put(key, value)
        self.log[key] = value

    def delete(self, key: bytes) -> None:
        self.raw.delete(key)
        self.log[key] = None

    def write(self, batch: LoggedBatch) -> None:
        if not isinstance(batch, LoggedBatch):
            raise TypeError("a write batch must come from the backend's batch()")
        self.raw.write(batch.batch)
        self.log.update(batch.ops)

    def delete_range(self, start: bytes, stop: bytes) -> None:
        self.raw.delete_range(start, stop)
        self.unlogged = True

    def take(self) -> dict[bytes, bytes | None]:
        """The log so far; a new one starts."""
        log, self.log = self.log, {}
        return log


@dataclass
class Materialized:
    """A materialization as uploaded: its SST files' shared copies and its
    private files' bytes (written into every state file of its chain)."""

    shared: dict[str, SharedFile]
    private: dict[str, bytes]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.shared.values()) + sum(map(len, self.private.values()))


Step = tuple[int, str | None, int, dict[bytes, bytes | None]]
"""One snapshot for the chain: ``(seq, materialization folder or None, its
epoch, log)``."""


@dataclass
class Chain:
    """The changelog as uploaded so far, kept by the snapshot thread (which
    writes snapshots one at a time, in order); the task thread reads
    :attr:`broken`, :attr:`epoch` and the sizes to decide when to
    materialize."""

    base: Materialized | None = None
    files: list[SharedFile] = field(default_factory=list)
    bytes: int = 0
    """Bytes of :attr:`files`."""
    seq: int = 0
    """The last snapshot written into the chain."""
    epoch: int = 0
    """The epoch of the materialization uploaded last."""
    broken: bool = False
    carried: list[Step] = field(default_factory=list)
    """Savepoints' snapshots since the last checkpoint: their changes go
    with the next checkpoint's (a file uploaded for a savepoint could be
    deleted as referenced by no retained checkpoint before the next one
    completes)."""
    carried_entries: int = 0
    """Entries of :attr:`carried`'s logs (they count in the log's memory
    share: savepoints without checkpoints would pile them up)."""

    def carry(self, step: Step) -> None:
        """Keep a savepoint's snapshot for the next checkpoint; one with a
        materialization supersedes those before it."""
        if step[1] is not None:
            for _, cut, _, _ in self.carried:
                if cut is not None:
                    shutil.rmtree(cut, ignore_errors=True)
            self.carried, self.carried_entries = [], 0
        self.carried.append(step)
        self.carried_entries += len(step[3])

    def due(self, ratio: float, most: int) -> bool:
        """Whether the next materialization is due."""
        base = self.base
        return base is not None and (self.bytes >= ratio * max(base.size, 1)
                                     or len(self.files) >= most)


def write_segment(log: dict[bytes, bytes | None], path: str, backend: ChangelogHost
                  ) -> bool:
    """Write ``log`` sorted into the SST file ``path``; False if it is empty."""
    if not log:
        return False
    writer = require().SstFileWriter(options(backend.config))
    writer.open(path)
    try:
        put, delete, get = writer.__setitem__, writer.__delitem__, log.__getitem__
        for key in sorted(log):  # keys only: sorting (key, value) pairs is 3x slower
            value = get(key)
            if value is None:
                delete(key)
            else:
                put(key, value)
        writer.finish()
    except BaseException:
        try:
            os.remove(path)
        except OSError:
            pass
        raise
    return True


def upload_shared(backend: ChangelogHost, local: str, checkpoint_id: int
                  ) -> SharedFile:
    """Upload the SST file ``local`` into the job's shared folder, named for
    ``checkpoint_id`` and this backend's operator and task."""
    s = backend.scope
    return upload(local, s.job_dir, shared_file_name(s.uid, s.task_index, checkpoint_id,
                                                     os.urandom(8).hex()))


def write_private(out: StateFileWriter, files: dict[str, bytes]) -> dict[str, tuple[int, int]]:
    """Write ``files`` into ``out`` (a state file); their ``(offset, length)``."""
    private: dict[str, tuple[int, int]] = {}
    for name, data in files.items():
        private[name] = (out.tell(), len(data))
        out.write(data)
    return private


def upload_folder(backend: ChangelogHost, path: str, checkpoint_id: int
                  ) -> tuple[dict[str, SharedFile], dict[str, bytes]]:
    """Upload the SST files of the RocksDB checkpoint folder ``path`` that no
    earlier checkpoint uploaded (the others are referenced); read the private
    files. Returns ``(shared, private)``."""
    b = backend
    shared: dict[str, SharedFile] = {}
    private: dict[str, bytes] = {}
    for name in sorted(os.listdir(path)):
        local = os.path.join(path, name)
        if name.endswith(".sst"):
            ref = b.uploaded.get(name)
            shared[name] = ref if ref is not None else upload_shared(b, local, checkpoint_id)
            if b.copies is not None:  # local recovery: the same file, linked
                b.copies.add("db", name, local)
        else:
            with open(local, "rb") as f:
                private[name] = f.read()
    b.uploaded = dict(shared)  # files leave a database for good
    return shared, private


def advance(backend: ChangelogHost, chain: Chain, step: Step,
            checkpoint_id: int) -> None:
    """Add one snapshot to ``chain`` (on the snapshot thread), with those
    savepoints carried since the last: the newest materialization among
    them uploaded (it holds everything before it), then the logs after it,
    merged into one changelog file. A failure breaks the chain."""
    taken, chain.carried, chain.carried_entries = [*chain.carried, step], [], 0
    cuts = [i for i, (_, cut, _, _) in enumerate(taken) if cut is not None]
    steps = taken[cuts[-1]:] if cuts else taken
    try:
        # every snapshot since the materialization (or the chain's last) is
        # here: one that never reached the writer leaves a gap
        gap = any(b[0] != a[0] + 1 for a, b in zip(steps, steps[1:], strict=False))
        if gap or not cuts and (chain.base is None or chain.broken
                                or chain.seq != steps[0][0] - 1):
            raise LockgateError(
                "the changelog lacks an earlier snapshot that failed to be written: this "
                "checkpoint cannot be complete and is declined; the next one materializes "
                "the state")
        if cuts:
            _, cut, epoch, _ = steps[0]
            assert cut is not None
            shared, private = upload_folder(backend, cut, checkpoint_id)
            chain.base = Materialized(shared, private)
            chain.files, chain.bytes, chain.broken = [], 0, False
            chain.epoch = epoch
        log: dict[bytes, bytes | None] = {}
        for _, _, _, part in steps:
            log.update(part)
        path = os.path.join(backend.folder, f"changelog-{step[0]}.sst")
        if write_segment(log, path, backend):
            try:
                ref = upload_shared(backend, path, checkpoint_id)
                if backend.copies is not None:  # local recovery: the same file, linked
                    backend.copies.add("log", ref.name, path)
            finally:
                os.remove(path)
            chain.files.append(ref)
            chain.bytes += ref.size
            backend.fault("changelog")
        chain.seq = step[0]
    except BaseException:
        chain.broken = True
        raise
    finally:
        for _, cut, _, _ in taken:  # superseded materializations too
            if cut is not None:
                shutil.rmtree(cut, ignore_errors=True)


def handle(backend: ChangelogHost, chain: Chain,
           out: StateFileWriter) -> IncrementalState:
    """The state handle of the chain as it is now, its private files
    written into ``out`` (the state file)."""
    assert chain.base is not None
    private = write_private(out, chain.base.private)
    r = backend.key_group_range
    return IncrementalState("rocksdb", (r.start, r.stop), private, dict(chain.base.shared),
                            tuple(chain.files))
