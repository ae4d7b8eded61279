"""The RocksDB backend's snapshots, as the snapshot thread writes them:
a RocksDB checkpoint folder (without a changelog), written canonically or
incrementally; a changelog snapshot (:mod:`lockgate.state.rocksdb.changelog`),
written as the chain's next link or, for a savepoint, canonically from a
RocksDB checkpoint folder taken with it (not from a rocksdict ``Snapshot``:
its iterators read the live database, 0.3.29)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Protocol

from lockgate.errors import LockgateError
from lockgate.state.backend import KeyedBlocks
from lockgate.state.backends import IncrementalSnapshot, StateFileWriter
from lockgate.state.choice import RocksDBStateBackend
from lockgate.state.incremental import IncrementalState
from lockgate.state.rocksdb.changelog import (
    Chain,
    ChangelogHost,
    advance,
    handle,
    upload_folder,
    write_private,
)
from lockgate.state.rocksdb.io import export_blocks, open_db
from lockgate.state.ttl_config import SnapshotFilter

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from lockgate.state.serde import StateSerializer

__all__ = ["RocksDBSnapshot", "RocksDBIncrementalSnapshot", "RocksDBChangelogSnapshot",
           "READER"]

READER = RocksDBStateBackend(memory_mb=16)
"""Options of a database opened read-only to be read once (a snapshot being
written canonically, a rescale's source): a small cache."""


class SnapshotHost(ChangelogHost, Protocol):
    """What a snapshot uses of its backend (``state.rocksdb.RocksDBKeyedStateBackend``)."""

    chain: Chain
    serializer: StateSerializer


class RocksDBSnapshot:
    """A RocksDB checkpoint folder, written canonically by the snapshot thread."""

    def __init__(self, backend: SnapshotHost, path: str, kinds: dict[str, str],
                 filters: dict[str, SnapshotFilter]) -> None:
        self.backend = backend
        self.path = path
        self.kinds = kinds
        self.filters = filters

    def write(self, out: SupportsWrite[bytes]) -> KeyedBlocks:
        """One block per non-empty key group, ascending (the heap backend's
        format); offsets relative to the first byte written here."""
        try:
            db = open_db(self.path, READER, read_only=True)
            offsets: dict[int, tuple[int, int]] = {}
            pos = 0
            try:
                for kg, blob in export_blocks(db, self.backend.key_group_range,
                                              self.backend.serializer, self.filters):
                    out.write(blob)
                    offsets[kg] = (pos, len(blob))
                    pos += len(blob)
            finally:
                db.close()
            return KeyedBlocks(offsets, dict(self.kinds))
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    def discard(self) -> None:
        """Never to be written: its RocksDB checkpoint folder is deleted
        (nothing once written: the write deleted it)."""
        shutil.rmtree(self.path, ignore_errors=True)


class RocksDBIncrementalSnapshot(RocksDBSnapshot, IncrementalSnapshot):
    """A snapshot a checkpoint writes incrementally (a savepoint canonically)."""

    def write_incremental(self, out: StateFileWriter, checkpoint_id: int) -> IncrementalState:
        """Upload the SST files no earlier checkpoint uploaded, reference the
        others, write the private files into ``out`` (the state file)."""
        b = self.backend
        try:
            if b.copies is not None:
                b.copies.begin(checkpoint_id)
            shared, files = upload_folder(b, self.path, checkpoint_id)
            private = write_private(out, files)
            r = b.key_group_range
            state = IncrementalState("rocksdb", (r.start, r.stop), private, shared)
            if b.copies is not None:
                b.copies.finish(checkpoint_id, state)
            return state
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


class RocksDBChangelogSnapshot(IncrementalSnapshot):
    """A snapshot with a changelog: its log (and the materialization taken
    since the last snapshot, if any), and for a savepoint a RocksDB
    checkpoint folder (``frozen``) for its canonical write."""

    def __init__(self, backend: SnapshotHost, seq: int, cut: str | None,
                 epoch: int, log: dict[bytes, bytes | None], frozen: str | None,
                 kinds: dict[str, str], filters: dict[str, SnapshotFilter]) -> None:
        self.backend = backend
        self.seq = seq
        self.cut = cut
        self.epoch = epoch
        self.log = log
        self.frozen = frozen
        self.kinds = kinds
        self.filters = filters
        self.taken = False
        """Written (or being written), or discarded."""

    def discard(self) -> None:
        """Never to be written (its checkpoint was aborted after the
        synchronous part, or failed before this state): its changes go with
        the next checkpoint's, as a savepoint's. On the snapshot thread, in
        order with the writes; nothing once written."""
        if self.taken:
            return
        self.taken = True
        if self.frozen is not None:
            shutil.rmtree(self.frozen, ignore_errors=True)
        self.backend.chain.carry((self.seq, self.cut, self.epoch, self.log))

    def write_incremental(self, out: StateFileWriter, checkpoint_id: int) -> IncrementalState:
        """Upload the changes (and the materialization), reference the rest."""
        self.taken = True
        b = self.backend
        if self.frozen is not None:  # taken for a savepoint: not read
            shutil.rmtree(self.frozen, ignore_errors=True)
        if b.copies is not None:
            b.copies.begin(checkpoint_id)
        advance(b, b.chain, (self.seq, self.cut, self.epoch, self.log), checkpoint_id)
        state = handle(b, b.chain, out)
        if b.copies is not None:
            b.copies.finish(checkpoint_id, state)
        return state

    def write(self, out: SupportsWrite[bytes]) -> KeyedBlocks:
        """Canonically (a savepoint), from the RocksDB checkpoint taken with
        it; the chain goes on (the next checkpoint needs this snapshot's
        changes)."""
        self.taken = True
        b = self.backend
        try:
            if self.frozen is None:
                raise LockgateError(
                    "a savepoint's keyed state was captured as a checkpoint's (the task did "
                    "not tell the RocksDB backend): the savepoint is declined")
            offsets: dict[int, tuple[int, int]] = {}
            pos = 0
            db = open_db(self.frozen, READER, read_only=True)
            try:
                for kg, blob in export_blocks(db, b.key_group_range, b.serializer,
                                              self.filters):
                    out.write(blob)
                    offsets[kg] = (pos, len(blob))
                    pos += len(blob)
            finally:
                db.close()
        finally:
            if self.frozen is not None:
                shutil.rmtree(self.frozen, ignore_errors=True)
            b.chain.carry((self.seq, self.cut, self.epoch, self.log))
        return KeyedBlocks(offsets, dict(self.kinds))
