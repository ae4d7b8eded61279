"""Keyed state of one operator on its way into a state file and back, for
either backend and either format.

* :func:`write_keyed`: a snapshot's keyed part into the task's state file —
  incremental files (a RocksDB checkpoint) or one block per key group (a
  savepoint, the heap backend, ``incremental=False``).
* :func:`restore_keyed`: the task's key groups from a checkpoint or
  savepoint: canonical blocks into any backend; incremental handles into a
  RocksDB backend (materialized, rescaled by key-group ranges), or, for a
  heap backend, read out of a temporary database as canonical blocks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from lockgate.checkpoint.incremental import IncrementalState
from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.checkpoint.restore import plan_keyed_restore
from lockgate.state.backend import KeyedBlocks
from lockgate.state.backends import (
    IncrementalSnapshot,
    KeyedSnapshot,
    KeyedStateBackend,
    RocksDBStateBackend,
)
from lockgate.state.keygroups import key_group_range


def write_keyed(snap: KeyedSnapshot, out: Any, checkpoint_id: int,
                savepoint: bool) -> tuple[KeyedBlocks, IncrementalState | None]:
    """Write ``snap`` into ``out`` (a ``ChecksumWriter``): incrementally when
    it can be and this is no savepoint, else canonically."""
    if not savepoint and isinstance(snap, IncrementalSnapshot):
        state = snap.write_incremental(out, checkpoint_id)
        return KeyedBlocks({}, dict(getattr(snap, "kinds", {}))), state
    return snap.write(out), None


def restore_keyed(backend: KeyedStateBackend, op_meta: OperatorMetadata, task_index: int,
                  parallelism: int, max_parallelism: int, restore_dir: str,
                  data_of: Callable[[StateHandle], bytes]) -> None:
    """Give ``backend`` the state of its key groups from ``op_meta``."""
    plan = plan_keyed_restore(op_meta, task_index, parallelism, max_parallelism)
    for block, offset, length in plan.blocks:
        backend.restore_block(data_of(block)[offset:offset + length], plan.states)
    wanted = key_group_range(task_index, parallelism, max_parallelism)
    parts = [(h.incremental, data_of(h)) for h in op_meta.subtasks
             if h is not None and h.incremental is not None
             and h.incremental.key_groups[0] < wanted.stop
             and h.incremental.key_groups[1] > wanted.start]
    if not parts:
        return
    restore = getattr(backend, "restore_incremental", None)
    if restore is not None:
        restore(restore_dir, parts)
        return
    states = {n: k for h in op_meta.subtasks if h is not None and h.incremental is not None
              for n, k in h.states.items()}
    for state, data in parts:
        for blob in incremental_blocks(state, data, restore_dir, wanted, backend):
            backend.restore_block(blob, states)


def incremental_blocks(state: IncrementalState, data: bytes, restore_dir: str, wanted: range,
                       backend: KeyedStateBackend) -> list[bytes]:
    """The canonical blocks of the key groups of ``wanted`` in incremental
    ``state`` (a RocksDB checkpoint restored into a heap backend)."""
    from lockgate.state.rocksdb_io import apply_changelog, export_blocks, materialize, open_db

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
            return [blob for _, blob in export_blocks(db, range(lo, hi), backend.serializer)]
        finally:
            db.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
