"""The RocksDB backend's files: options from the memory budget, the task's
local folder, shared files in and out of checkpoint storage, and state read
out of a database in the canonical block format.

rocksdict is imported here and in :mod:`lockgate.state.rocksdb.backend` only, when a
job uses the RocksDB backend (``pip install 'lockgate[rocksdb]'``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from lockgate import fs
from lockgate.errors import CheckpointCorruptError, ConfigurationError
from lockgate.fs import private
from lockgate.fs import transfer as fs_transfer
from lockgate.fs.checked import copy_checked
from lockgate.state.choice import RocksDBStateBackend
from lockgate.state.incremental import SHARED_DIR, IncrementalState, SharedFile
from lockgate.state.rocksdb.recovery import link_checked
from lockgate.state.rocksdb.tables import (
    KIND_PREFIX,
    META,
    kg_bytes,
    prefix_items,
    split_key,
    state_id,
)
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl_config import structure_kind


def require() -> Any:
    """The rocksdict module, or a clear error naming the package to install."""
    try:
        import rocksdict
    except ImportError:  # pragma: no cover - said when a job asks for the backend
        raise ConfigurationError(
            "the RocksDB state backend needs rocksdict: pip install 'lockgate[rocksdb]'"
        ) from None
    return rocksdict


def options(config: RocksDBStateBackend) -> Any:
    """RocksDB options whose memory stays within ``config.memory_mb``: a block
    cache of half of it (index and filter blocks inside), two write buffers
    of an eighth each but at most 8 MiB (a checkpoint's synchronous part
    flushes the memtable: its time grows with the memtable, never with the
    state), bounded open files, levels sized so that one compaction rewrites
    a part of the state, not all of it."""
    rd = require()
    budget = config.memory_mb << 20
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(True)
    # the synchronous part of a checkpoint flushes the memtable: keep it small
    opts.set_write_buffer_size(max(1 << 20, min(budget // 8, 8 << 20)))
    opts.set_max_write_buffer_number(2)
    # an early flush cuts each checkpoint's memtable in two level-0 files:
    # compactions (uploaded by the next checkpoint) as frequent as without
    opts.set_level_zero_file_num_compaction_trigger(8 if config.early_flush else 4)
    opts.set_max_background_jobs(2)
    opts.set_max_open_files(512)
    opts.set_compression_type(rd.DBCompressionType.lz4())
    # uniformly random keys: every level-0 file overlaps the whole key range.
    # With a base level of 256 MiB (RocksDB's default) a task's state below
    # it is all in one level, and each level-0 compaction rewrote all of it
    # (seconds under load; level 0 grew until writes slowed). A small base
    # level, a fan-out of 4 and 4 MiB files bound what one compaction
    # rewrites (docs/state-backends.md, "Compaction")
    opts.set_max_bytes_for_level_base(16 << 20)
    opts.set_max_bytes_for_level_multiplier(4.0)
    opts.set_target_file_size_base(4 << 20)
    opts.set_max_subcompactions(2)
    table = rd.BlockBasedOptions()
    table.set_block_cache(rd.Cache(budget // 2))
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def write_options() -> Any:
    """No write-ahead log: what survives a failure is the checkpoint."""
    wo = require().WriteOptions()
    wo.disable_wal = True
    return wo


def open_db(path: str, config: RocksDBStateBackend, read_only: bool = False) -> Any:
    rd = require()
    if read_only:
        db = rd.Rdict(path, options(config), access_type=rd.AccessType.read_only())
    else:
        db = rd.Rdict(path, options(config))
        db.set_write_options(write_options())
    return db


def upload(local: str, job_dir: str, name: str) -> SharedFile:
    """Copy the SST file ``local`` into the job's shared folder as ``name``
    (private: 0600 in a 0700 folder, on a local filesystem); its size and
    CRC-32 go into the handle."""
    folder = fs.join(job_dir, SHARED_DIR)
    fs.makedirs(folder, private=True)
    size, crc = fs_transfer.copy_with_crc(local, fs.join(folder, name), private=True)
    return SharedFile(name, size, crc)


def materialize(state: IncrementalState, data: bytes, restore_dir: str, dest: str,
                local: str | None = None) -> None:
    """Make ``dest`` a private RocksDB folder with the files of ``state``:
    the private ones from the state file's bytes ``data``, the shared ones
    hard-linked from the checkpoint's job folder (a local filesystem) or
    copied, each checked as untrusted (:mod:`lockgate.fs.checked`);
    with ``local``, from that local copy instead
    (:mod:`lockgate.state.rocksdb.recovery`: a file that fails its checks
    raises ``CopyUnusable``). A changelog is not applied here
    (:func:`apply_changelog`, once the database is open)."""
    private.make_dir(dest)
    for name, (offset, length) in state.private.items():
        if offset + length > len(data):
            raise CheckpointCorruptError(
                f"private file {name} lies beyond the state file's end: it is corrupt")
        with private.open_new(os.path.join(dest, name)) as f:
            f.write(data[offset:offset + length])
    for name, ref in state.shared.items():
        if local is not None:
            link_checked(os.path.join(local, "db", name), os.path.join(dest, name), ref,
                         link=True)
        else:
            _fetch(ref, restore_dir, os.path.join(dest, name), "shared file", link=True)


def apply_changelog(db: Any, state: IncrementalState, restore_dir: str, folder: str,
                    local: str | None = None) -> None:
    """Ingest the changelog files of ``state`` into ``db`` (open, holding the
    materialization), oldest first: each one's entries shadow what is older,
    its tombstones delete. Each is a private copy (ingestion may write into
    the file it takes), moved in; with ``local``, copied from that local
    copy (as :func:`materialize`)."""
    if not state.changelog:
        return
    opts = require().IngestExternalFileOptions()
    opts.set_move_files(True)
    for i, ref in enumerate(state.changelog):
        path = os.path.join(folder, f"changelog-{i}.sst")
        if local is not None:
            link_checked(os.path.join(local, "log", ref.name), path, ref, link=False)
        else:
            _fetch(ref, restore_dir, path, "changelog file", link=False)
        try:
            db.ingest_external_file([path], opts)
        finally:
            try:
                os.remove(path)
            except OSError:
                pass


def _fetch(ref: SharedFile, restore_dir: str, target: str, what: str, link: bool) -> None:
    """The shared file ``ref`` of the checkpoint at ``restore_dir`` as the
    new local file ``target``: the checked file itself hard-linked
    (``link``, where possible) or copied; a regular file of its recorded
    size and CRC-32, or refused (:func:`lockgate.fs.checked.copy_checked`)."""
    source = fs.join(fs.parent(restore_dir), SHARED_DIR, ref.name)
    try:
        copy_checked(source, target, what, size=ref.size, crc32=ref.crc32, link=link)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(
            f"{what} {fs.redact(source)} of the checkpoint {fs.redact(restore_dir)} "
            "is missing: the checkpoint is damaged (a retained checkpoint needs its "
            "job folder's shared/ files; to move a job elsewhere, take a savepoint)"
        ) from None


def state_names(db: Any) -> dict[bytes, tuple[str, str]]:
    """State id -> (name, recorded kind), from a database's own entries."""
    out: dict[bytes, tuple[str, str]] = {}
    for k, v in prefix_items(db, KIND_PREFIX):
        name = k[len(KIND_PREFIX):].decode()
        out[state_id(name)] = (name, v.decode())
    return out


def export_blocks(db: Any, key_groups: range, serializer: StateSerializer,
                  filters: dict[str, Callable[[Any], Any]] | None = None
                  ) -> Iterator[tuple[int, bytes]]:
    """The canonical block of every non-empty key group of ``key_groups`` in
    ``db`` (what the heap backend writes: ``[kg, {name: [[key, value],
    ...]}]``, a map state's value a dict), ascending; ``filters`` (TTL) may
    drop or trim values."""
    loads = serializer.loads
    dumps = StateSerializer(serializer.allow_pickle).dumps
    names = state_names(db)
    filters = filters or {}
    for kg in key_groups:
        content: dict[str, list[list[Any]]] = {}
        group: tuple[bytes, bytes] | None = None
        entries: dict[Any, Any] = {}

        def add(name: str, key: Any, value: Any,
                content: dict[str, list[list[Any]]] = content) -> None:
            keep = filters.get(name)
            if keep is not None and (value := keep(value)) is None:
                return
            content.setdefault(name, []).append([key, value])

        for k, v in prefix_items(db, kg_bytes(kg)):
            info = names.get(k[2:6])
            if info is None:
                continue
            name, kind = info
            kb, start = split_key(k)
            if structure_kind(kind) == "map":
                if group != (k[2:6], kb):
                    if group is not None and entries:
                        add(names[group[0]][0], loads(group[1]), entries)
                    group, entries = (k[2:6], kb), {}
                entries[loads(k[start:])] = loads(v)
            else:
                add(name, loads(kb), loads(v))
        if group is not None and entries:
            add(names[group[0]][0], loads(group[1]), entries)
        if content:
            yield kg, dumps([kg, content])


def canonical_blocks(state: IncrementalState, data: bytes, restore_dir: str, wanted: range,
                     serializer: StateSerializer) -> list[bytes]:
    """The canonical blocks of the key groups of ``wanted`` in incremental
    ``state`` (with its state file's bytes ``data``): a RocksDB checkpoint
    restored into a heap backend, read out of a temporary database."""
    folder = tempfile.mkdtemp(prefix="lockgate-restore-")
    try:
        path = os.path.join(folder, "db")
        materialize(state, data, restore_dir, path)
        config = RocksDBStateBackend(local_dir=folder, memory_mb=64)
        if state.changelog:
            db = open_db(path, config)
            try:
                apply_changelog(db, state, restore_dir, folder)
            finally:
                db.close()
        db = open_db(path, config, read_only=True)
        try:
            lo = max(state.key_groups[0], wanted.start)
            hi = min(state.key_groups[1], wanted.stop)
            return [blob for _, blob in export_blocks(db, range(lo, hi), serializer)]
        finally:
            db.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def copy_range(source: Any, target: Any, start: int, stop: int, batch: Callable[[], Any],
               chunk: int = 20_000) -> None:
    """Copy every entry of key groups ``[start, stop)`` and the state kinds
    from ``source`` into ``target`` (byte for byte: state ids are the same in
    every database)."""
    wb, n = batch(), 0
    end = kg_bytes(stop) if stop < 0xFFFF else META
    it = source.iter()
    it.seek(kg_bytes(start))
    while it.valid():
        k = it.key()
        if k >= end:
            break
        wb.put(k, it.value())
        n += 1
        if n >= chunk:
            target.write(wb)
            wb, n = batch(), 0
        it.next()
    for k, v in prefix_items(source, KIND_PREFIX):
        wb.put(k, v)
    target.write(wb)
