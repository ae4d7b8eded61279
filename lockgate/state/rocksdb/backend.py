"""The RocksDB keyed state backend (``Pipeline(state_backend="rocksdb")``).

One embedded RocksDB (rocksdict, raw bytes) per keyed operator and task, in a
local folder of its own; key layout and handles in
:mod:`lockgate.state.rocksdb.tables`. Memory is bounded by
``RocksDBStateBackend.memory_mb`` (block cache and write buffers,
:func:`~lockgate.state.rocksdb.io.options`); state beyond it lives on disk.

**Snapshots.** With a changelog (the default), a checkpoint uploads the
entries written since the previous one and RocksDB's files only now and
then: :mod:`lockgate.state.rocksdb.changelog`. Without one, the synchronous
part writes the raw views' live objects back and takes a RocksDB checkpoint
(the memtable flushed, every SST file hard linked into a folder:
milliseconds, whatever the state's size). Shortly before a checkpoint is
expected, the task has the backend flush the
memtable in the background (:meth:`RocksDBKeyedStateBackend.prepare_snapshot`,
:mod:`~lockgate.state.rocksdb.flush`), so that the checkpoint's own flush
covers only the last writes. The snapshot thread then writes either

- *incrementally* (a checkpoint, ``incremental=True``): every SST file not
  uploaded before goes to ``<job>/shared/``, the others are referenced; the
  small private files (``MANIFEST``, ``CURRENT``, ``OPTIONS``) go into the
  task's state file; the handle lists them all
  (:class:`~lockgate.state.incremental.IncrementalState`); or
- *canonically* (a savepoint, or ``incremental=False``): the checkpoint's
  folder is opened read-only and written as one block per key group, the
  heap backend's format, so either backend restores it at any parallelism.

**Restore.** Canonical blocks are written into the database
(:meth:`RocksDBKeyedStateBackend.restore_block`; a big one as a sorted SST
file, ingested). Incremental state
(:meth:`RocksDBKeyedStateBackend.restore_incremental`): the handle whose key
groups overlap the task's most is materialized as the task's database (hard
links from a local checkpoint storage, downloads otherwise), the key groups
it must not keep are deleted with two ``delete_range``; every other
overlapping handle is materialized beside it, opened read-only, and its
entries of the task's key groups are copied in. The simplest correct way: a
range copy never needs to know what the bytes mean. A failover at the same
key groups reads the files from the task's local copy when one passes its
checks (local recovery: :mod:`lockgate.state.rocksdb.recovery`, whose
copies the snapshot thread makes as it uploads).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, overload

from lockgate import fs
from lockgate.errors import LockgateError
from lockgate.state.backend import (
    Descriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
    note_restored_kinds,
    registered_kind,
)
from lockgate.state.choice import BackendScope, RocksDBStateBackend
from lockgate.state.incremental import IncrementalState, SharedFile
from lockgate.state.rocksdb.changelog import Chain, LoggedBatch, LoggedDB, log_limit
from lockgate.state.rocksdb.cleanup import filter_keys, iter_keys
from lockgate.state.rocksdb.flush import POLL, EarlyFlush, flush_running, start_flush
from lockgate.state.rocksdb.handles import RocksListState, RocksMapState, RocksValueState
from lockgate.state.rocksdb.io import (
    apply_changelog,
    copy_range,
    materialize,
    open_db,
    options,
    require,
    state_names,
)
from lockgate.state.rocksdb.local import remove_task_folder, task_folder
from lockgate.state.rocksdb.recovery import CopyUnusable, LocalCopies, LocalRestore
from lockgate.state.rocksdb.snapshots import (
    READER,
    RocksDBChangelogSnapshot,
    RocksDBIncrementalSnapshot,
    RocksDBSnapshot,
)
from lockgate.state.rocksdb.tables import (
    KIND_PREFIX,
    META,
    KeyCodec,
    MapTable,
    ValueTable,
    WriteBatch,
    kg_bytes,
    state_id,
)
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl_config import (
    SnapshotFilter,
    StateTtlConfig,
    snapshot_filters,
    structure_kind,
)

if TYPE_CHECKING:
    pass

__all__ = ["RocksDBKeyedStateBackend"]

log = logging.getLogger("lockgate.task")


class RocksDBKeyedStateBackend:
    """Keyed state of one keyed operator in one task, in RocksDB."""

    prepares_snapshots = True
    """:meth:`prepare_snapshot` runs between records: the early flush, or
    with a changelog the materialization."""

    def __init__(self, config: RocksDBStateBackend, max_parallelism: int,
                 key_group_range: range, serializer: StateSerializer,
                 scope: BackendScope) -> None:
        self.config = config
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.serializer = serializer
        self.scope = scope
        self.current_key: Any = None
        self.codec = KeyCodec(max_parallelism)
        self.folder = task_folder(config, scope)
        self.db_path = os.path.join(self.folder, "db")
        self.logged = config.incremental and config.changelog
        """Checkpoints are a changelog (:mod:`~lockgate.state.rocksdb.changelog`)."""
        self.raw_db: Any = None
        self.db: Any = None
        """What the tables read and write: the database, or with a changelog
        the :class:`LoggedDB` over it."""
        self._tables: dict[str, ValueTable | MapTable] = {}
        self._open(open_db(self.db_path, config))
        self._kinds: dict[str, str] = {}
        self._restored_kinds: dict[str, str] = {}
        self._ttl: dict[str, StateTtlConfig] = {}
        self._handles: dict[str, ValueState | ListState | MapState] = {}
        self._snapshots = 0
        self.uploaded: dict[str, SharedFile] = {}
        """Local SST file -> its shared copy, for files an earlier checkpoint
        uploaded (or the restored one named) and this database still has."""
        self._lock = threading.Lock()
        self._early = EarlyFlush()
        self.chain = Chain()
        """The changelog as uploaded (the snapshot thread's)."""
        self._seq = 0
        self._cut: str | None = None
        """A materialization taken between records, for the next snapshot."""
        self._cutting: float | None = None
        """When the background flush before a materialization started."""
        self._epoch = 0
        """Materializations taken (the chain's epoch once the last is uploaded)."""
        self._log_limit = log_limit(config)
        self.fault: Callable[[str], None] = _no_fault
        """Fault injection at the changelog's points (``materialize``: a
        materialization taken, the log emptied; ``changelog``: a changelog
        file uploaded, its checkpoint not acknowledged)."""
        self.copies = (LocalCopies(config.directory, scope.job_id, scope.uid, key_group_range)
                       if config.keeps_local_copies else None)
        """Local recovery: the copies of completed checkpoints on this host."""

    def _open(self, db: Any) -> None:
        self.raw_db = db
        self.db = LoggedDB(db) if self.logged else db
        for table in self._tables.values():
            table.db = self.db

    def batch(self) -> WriteBatch:
        batch = require().WriteBatch(raw_mode=True)
        return LoggedBatch(batch) if self.logged else batch

    # -- states ------------------------------------------------------------
    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    def get_state(self, descriptor: Descriptor) -> ValueState | ListState | MapState:
        name = descriptor.name
        kind = registered_kind(descriptor, self._kinds, self._restored_kinds)
        if descriptor.ttl is not None:
            self._ttl[name] = descriptor.ttl
        if name in self._handles:
            return self._handles[name]
        table = self._register(name, kind)
        handle: ValueState | ListState | MapState
        match descriptor:
            case ValueStateDescriptor():
                assert isinstance(table, ValueTable)
                handle = RocksValueState(table, descriptor.default)
            case ListStateDescriptor():
                assert isinstance(table, ValueTable)
                handle = RocksListState(table)
            case MapStateDescriptor():
                assert isinstance(table, MapTable)
                handle = RocksMapState(table)
        self._handles[name] = handle
        return handle

    def _register(self, name: str, kind: str) -> ValueTable | MapTable:
        table = self._tables.get(name)
        if table is None:
            cls = MapTable if structure_kind(kind) == "map" else ValueTable
            table = self._tables[name] = cls(self, name)
            self._kinds[name] = kind
            self.db.put(KIND_PREFIX + name.encode(), kind.encode())
        return table

    def raw(self, name: str) -> Any:
        """The registered (or restored) state ``name`` as a mapping key ->
        stored object."""
        table = self._tables.get(name)
        if table is None:
            table = self._register(name, self._restored_kinds[name])
        return table

    def state_kinds(self) -> dict[str, str]:
        return {**self._restored_kinds, **self._kinds}

    def state_keys(self, name: str) -> list[Any]:
        table = self._tables.get(name)
        return table.keys() if table is not None else []

    def iter_state_keys(self, name: str) -> Iterator[Any]:
        """The keys of state ``name``, read lazily a chunk at a time (TTL's
        incremental cleanup: :func:`~lockgate.state.rocksdb.cleanup.iter_keys`)."""
        table = self._tables.get(name)
        return iter_keys(table) if table is not None else iter(())

    def filter_keys(self, name: str, keys: list[Any], keep: SnapshotFilter) -> None:
        """Replace the stored object ``o`` of each of ``keys`` by ``keep(o)``
        (None: deleted): :func:`~lockgate.state.rocksdb.cleanup.filter_keys`."""
        table = self._tables.get(name)
        if table is not None:
            filter_keys(table, keys, keep)

    def num_keys(self) -> int:
        keys: set[Any] = set()
        for table in self._tables.values():
            keys.update(table.keys())
        return len(keys)

    def approximate_keys(self) -> int:
        """RocksDB's estimate of its entries (a monitoring figure)."""
        try:
            return int(self.db.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:
            return 0

    def flush(self) -> None:
        """Write every raw view's live objects into RocksDB."""
        for table in self._tables.values():
            table.flush()

    # -- snapshots ---------------------------------------------------------
    def expect_checkpoints(self, interval: float | None) -> None:
        """Checkpoints are triggered every ``interval`` seconds (None: not
        periodically): the early flush's period until snapshots tell, the
        first one counted from now (the task starts running)."""
        self._early.expect(interval, time.monotonic())

    def prepare_snapshot(self, now: float) -> float:
        """Called by the task between records (``now``: ``time.monotonic()``):
        once the next checkpoint is near, write the live objects back and
        start a background flush of the memtable
        (:mod:`~lockgate.state.rocksdb.flush`). Returns the seconds until
        it is due (``inf``: not before the next snapshot)."""
        if self.logged:
            return self._prepare_materialization(now)
        early = self._early
        if early.running is not None:  # watched: the next lead depends on it
            if flush_running(self.db):
                return POLL
            early.finished(now)
        if now < early.due:
            return early.due - now
        if self.config.early_flush:
            self.flush()
            early.started(now if start_flush(self.db) else None)
            return POLL
        early.started(None)
        return float("inf")

    def _prepare_materialization(self, now: float) -> float:
        """With a changelog: materialize between records once it is due (a
        background flush first, watched; then the RocksDB checkpoint, which
        flushes only what came since, and the log cut at that moment)."""
        if self._cutting is not None:
            if flush_running(self.raw_db):
                return POLL
            self._cutting = None
            self._materialize()
            return 1.0
        chain, logged = self.chain, len(self.db.log)
        if logged > self._log_limit or self._cut is None and (
                logged + chain.carried_entries > self._log_limit  # savepoints'
                or not chain.broken and chain.epoch >= self._epoch
                and chain.due(self.config.materialize_ratio, self.config.max_changelog)):
            self.flush()
            if start_flush(self.raw_db):
                self._cutting = now
                return POLL
            self._materialize()
        return 1.0

    def _materialize(self) -> None:
        """A RocksDB checkpoint of everything written so far, the log cut
        here: the next snapshot uploads it and starts a new changelog."""
        self.flush()
        self._cutting = None  # a background flush before one: this one is it
        if self._cut is not None:
            shutil.rmtree(self._cut, ignore_errors=True)
        self._cut = self._checkpoint()
        self.db.take()
        self.db.unlogged = False
        self._epoch += 1
        self.fault("materialize")

    def _checkpoint(self) -> str:
        self._snapshots += 1
        path = os.path.join(self.folder, f"snapshot-{self._snapshots}")
        require().Checkpoint(self.raw_db).create_checkpoint(path)
        return path

    def snapshot(self, savepoint: bool = False) -> RocksDBSnapshot | RocksDBChangelogSnapshot:
        """The synchronous part: live objects written back, then with a
        changelog the log taken (a RocksDB checkpoint only when the chain
        needs a materialization at once), else a RocksDB checkpoint (memtable
        flushed, SST files hard-linked) in a folder of its own."""
        started = time.monotonic()
        self.flush()
        kinds = self.state_kinds()
        filters = snapshot_filters(self._ttl, kinds)
        if self.logged:
            if self.db.unlogged or self._cut is None and (self._epoch == 0
                                                          or self.chain.broken):
                self._materialize()  # no chain to extend (or a waiting cut is stale): at once
            self._seq += 1
            cut, self._cut = self._cut, None
            frozen = self._checkpoint() if savepoint else None
            return RocksDBChangelogSnapshot(self, self._seq, cut, self._epoch, self.db.take(),
                                            frozen, kinds, filters)
        path = self._checkpoint()
        early = self._early
        early.finished(time.monotonic())  # one unfinished at the barrier is, now
        early.snapshot_taken(started)
        cls = RocksDBIncrementalSnapshot if self.config.incremental else RocksDBSnapshot
        return cls(self, path, kinds, filters)

    # -- restore -----------------------------------------------------------
    def _check_kinds(self, states: dict[str, str]) -> None:
        note_restored_kinds(states, self._kinds, self._restored_kinds)

    def restore_block(self, data: bytes, states: dict[str, str]) -> None:
        """Merge one canonical key-group block (either backend wrote it)."""
        self._check_kinds(states)
        kg, content = self.serializer.loads(data)
        if kg not in self.key_group_range:
            raise LockgateError(
                f"state block of key group {kg} given to a task owning key groups "
                f"{self.key_group_range.start}..{self.key_group_range.stop - 1}: "
                "the checkpoint is corrupt or misassigned")
        dumps, parts = self.serializer.dumps, self.codec.parts
        batch = require().WriteBatch(raw_mode=True)  # restored: in the first materialization
        rows: list[tuple[bytes, bytes]] = []
        put = rows.append
        for name, entries in content.items():
            kind = states.get(name, "")
            sid = state_id(name)
            batch.put(KIND_PREFIX + name.encode(), kind.encode())
            is_map = structure_kind(kind) == "map"
            for key, value in entries:
                kgb, lk = parts(key)
                prefix = kgb + sid + lk
                if is_map:
                    for mk, v in value.items():
                        put((prefix + dumps(mk), dumps(v)))
                else:
                    put((prefix, dumps(value)))
        if len(rows) >= INGEST_MIN_ENTRIES:
            self._ingest(rows)
        else:
            for k, v in rows:
                batch.put(k, v)
        self.raw_db.write(batch)

    def _ingest(self, rows: list[tuple[bytes, bytes]]) -> None:
        """Write ``rows`` as one sorted SST file and ingest it (a big block of
        a savepoint restored: no memtable, no compaction of what was just
        written). A key given twice keeps its last value, as a batch would."""
        path = os.path.join(self.folder, "ingest.sst")
        writer = require().SstFileWriter(options(self.config))
        writer.open(path)
        try:
            for k, v in sorted(dict(rows).items()):
                writer[k] = v
            writer.finish()
            self.raw_db.ingest_external_file([path])
        finally:
            try:
                os.remove(path)
            except OSError:
                pass

    def restore_incremental(self, restore_dir: str, parts: list[tuple[IncrementalState, bytes]],
                            states: dict[str, str], checkpoint_id: int | None = None
                            ) -> LocalRestore | None:
        """Restore from incremental state handles (with their state files'
        bytes) of checkpoint ``checkpoint_id``: see the module's docstring.
        The kinds of the states are read from the databases restored
        (``states``, the handles' record of them, is not needed). A failover
        at the same key groups reads the local copy when one passes its
        checks (:mod:`~lockgate.state.rocksdb.recovery`); returns what it did
        about it (None: no local copy was looked for)."""
        wanted = self.key_group_range

        def overlap(s: IncrementalState) -> int:
            return max(0, min(s.key_groups[1], wanted.stop) - max(s.key_groups[0], wanted.start))

        parts = [(s, d) for s, d in parts if overlap(s) > 0]
        if not parts:
            return None
        parts.sort(key=lambda p: -overlap(p[0]))
        (base, base_data), others = parts[0], parts[1:]
        exact = base.key_groups == (wanted.start, wanted.stop) and not others
        same_job = _same_folder(fs.parent(restore_dir), self.scope.job_dir)
        failover = exact and same_job
        self.raw_db.close()
        note: LocalRestore | None = None
        if failover and self.copies is not None and checkpoint_id is not None:
            note = self._restore_local(base, base_data, restore_dir, checkpoint_id)
        elif self.copies is not None:
            self.copies.restored(None)
        if note is None or not note.local:
            self._materialize_base(base, base_data, restore_dir, None)
        db = self.raw_db  # restored: in the first materialization, not in a changelog
        if not exact:
            db.delete_range(kg_bytes(0), kg_bytes(wanted.start))
            db.delete_range(kg_bytes(wanted.stop) if wanted.stop < 0xFFFF else META, META)
            self.fault("restore_ranges")
        for i, (state, data) in enumerate(others):
            tmp = os.path.join(self.folder, f"restore-{i}")
            materialize(state, data, restore_dir, tmp)
            if state.changelog:
                target = open_db(tmp, READER)
                try:
                    apply_changelog(target, state, restore_dir, self.folder)
                finally:
                    target.close()
            source = open_db(tmp, READER, read_only=True)
            try:
                copy_range(source, db, max(state.key_groups[0], wanted.start),
                           min(state.key_groups[1], wanted.stop),
                           lambda: require().WriteBatch(raw_mode=True))
            finally:
                source.close()
                shutil.rmtree(tmp, ignore_errors=True)
        self._check_kinds({name: kind for name, kind in state_names(db).values()})
        for name, kind in self._kinds.items():
            db.put(KIND_PREFIX + name.encode(), kind.encode())
        if same_job:
            # the base's files are the job's shared files already (a range
            # deletion writes tombstones, it changes no file): the next
            # checkpoint references them instead of uploading them again
            self.uploaded = dict(base.shared)
        return note

    def _materialize_base(self, base: IncrementalState, data: bytes, restore_dir: str,
                          local: str | None) -> None:
        """The task's database from ``base``'s files (from the local copy
        ``local``, or the checkpoint storage), its changelog applied."""
        shutil.rmtree(self.db_path, ignore_errors=True)
        materialize(base, data, restore_dir, self.db_path, local)
        self._open(open_db(self.db_path, self.config))
        apply_changelog(self.raw_db, base, restore_dir, self.folder, local)

    def _restore_local(self, base: IncrementalState, data: bytes, restore_dir: str,
                       checkpoint_id: int) -> LocalRestore:
        """Restore ``base`` from its local copy if it passes its checks; else
        leave nothing of the attempt behind (the caller reads the storage)."""
        assert self.copies is not None
        try:
            copy = self.copies.find(checkpoint_id, base)
            self._materialize_base(base, data, restore_dir, copy)
            note = LocalRestore(checkpoint_id, True)
        except CopyUnusable as e:
            note = LocalRestore(checkpoint_id, False, e.reason)
        except Exception as e:  # RocksDB refused what it read, an I/O error
            note = LocalRestore(checkpoint_id, False, f"{type(e).__name__}: {e}"[:300])
        if not note.local:
            try:
                self.raw_db.close()
            except Exception:
                pass
            shutil.rmtree(self.db_path, ignore_errors=True)
        self.copies.restored(checkpoint_id if note.local else None)
        where = f"operator {self.scope.uid} (subtask {self.scope.task_index})"
        if note.local:
            log.info("%s: %s", where, note.describe())
        else:
            log.warning("%s: %s", where, note.describe())
        return note

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: local copies before it go."""
        if self.copies is not None:
            self.copies.completed(checkpoint_id)

    def close(self) -> None:
        try:
            self.raw_db.close()
        except Exception:
            pass
        remove_task_folder(self.folder)


INGEST_MIN_ENTRIES = 50_000
"""A canonical block with at least this many entries is restored by SST
ingestion, a smaller one by a write batch."""

def _no_fault(point: str) -> None:
    pass


def _same_folder(a: str, b: str) -> bool:
    return fs.absolute(a).rstrip("/") == fs.absolute(b).rstrip("/")
