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

from collections.abc import Callable

from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.checkpoint.restore import plan_keyed_restore
from lockgate.state.backend import KeyedBlocks
from lockgate.state.backends import (
    IncrementalSnapshot,
    KeyedSnapshot,
    KeyedStateBackend,
    StateFileWriter,
)
from lockgate.state.incremental import IncrementalState
from lockgate.state.keygroups import key_group_range
from lockgate.state.rocksdb.recovery import LocalRestore


def write_keyed(snap: KeyedSnapshot, out: StateFileWriter,
                checkpoint_id: int, savepoint: bool) -> tuple[KeyedBlocks, IncrementalState | None]:
    """Write ``snap`` into ``out`` (a ``ChecksumWriter``): incrementally when
    it can be and this is no savepoint, else canonically."""
    if not savepoint and isinstance(snap, IncrementalSnapshot):
        state = snap.write_incremental(out, checkpoint_id)
        return KeyedBlocks({}, dict(snap.kinds)), state
    return snap.write(out), None


def restore_keyed(backend: KeyedStateBackend, op_meta: OperatorMetadata, task_index: int,
                  parallelism: int, max_parallelism: int, restore_dir: str,
                  data_of: Callable[[StateHandle], bytes],
                  checkpoint_id: int | None = None) -> LocalRestore | None:
    """Give ``backend`` the state of its key groups from ``op_meta`` (of
    checkpoint ``checkpoint_id``); returns what a RocksDB backend did about
    its local copy (None: it looked for none)."""
    plan = plan_keyed_restore(op_meta, task_index, parallelism, max_parallelism)
    for block, offset, length in plan.blocks:
        backend.restore_block(data_of(block)[offset:offset + length], plan.states)
    wanted = key_group_range(task_index, parallelism, max_parallelism)
    parts = [(h.incremental, data_of(h)) for h in op_meta.subtasks
             if h is not None and h.incremental is not None
             and h.incremental.key_groups[0] < wanted.stop
             and h.incremental.key_groups[1] > wanted.start]
    if not parts:
        return None
    states = {n: k for h in op_meta.subtasks if h is not None and h.incremental is not None
              for n, k in h.states.items()}
    return backend.restore_incremental(restore_dir, parts, states, checkpoint_id)
