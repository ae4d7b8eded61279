"""A task's state on its way to and from checkpoint storage.

* :func:`restore_operators`: give each operator of the chain its state from
  the checkpoint the attempt starts from (keyed state: the key-group blocks of
  the task's range, :func:`plan_keyed_restore`; operator state: split or
  union, :func:`distribute_operator_state`).
* :class:`SnapshotWriter`: the asynchronous part of a snapshot. The task
  thread captures the operators' state (``StreamOperator.snapshot``) and hands
  it over; one background thread serializes it, writes
  ``chk-<n>/<uid>-<subtask>.state`` durably, and acknowledges with the state
  handles (:class:`~lockgate.protocol.Ack`), or declines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lockgate import fs
from lockgate.checkpoint.metadata import CHANNEL_STATE_KEY, StateHandle
from lockgate.checkpoint.restore import distribute_operator_state
from lockgate.checkpoint.storage import (
    ChecksumWriter,
    checkpoint_dir,
    read_state_file,
    write_state,
)
from lockgate.protocol import Ack, ControlMessage, Decline
from lockgate.redact import redact
from lockgate.runtime.channel_state import InFlight, write_channel_state
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.keyed_state import restore_keyed, write_keyed
from lockgate.runtime.operators import OperatorSnapshot, StreamOperator
from lockgate.runtime.spec import TaskSpec
from lockgate.state.backend import KeyedBlocks
from lockgate.state.incremental import IncrementalState
from lockgate.state.rocksdb.recovery import LocalRestore
from lockgate.state.serde import StateSerializer

log = logging.getLogger("lockgate.task")


def restore_operators(spec: TaskSpec, ops: list[StreamOperator], serializer: StateSerializer,
                      local: list[tuple[str, LocalRestore]] | None = None) -> set[str]:
    """Restore every operator's state; returns the uids of the operators
    restored as finished (FLIP-147), which read nothing and do not run
    ``end_input``/``finish`` again. ``local`` receives, per keyed operator
    that looked for a local copy of its state (local recovery), what it did."""
    meta = spec.restore_metadata
    files: dict[str, bytes] = {}
    skipped: set[str] = set()

    def data_of(handle: StateHandle) -> bytes:
        if handle.file not in files:
            assert spec.restore_dir is not None
            files[handle.file] = read_state_file(spec.restore_dir, handle)
        return files[handle.file]

    for op in ops:
        op_meta = meta.operators.get(op.uid) if meta else None
        if op_meta is None:
            op.restore_operator_state(None)
            continue
        assert meta is not None
        if op_meta.finished and not (meta.final and spec.continues_final):
            skipped.add(op.uid)
        p = spec.vertex.parallelism
        if op.keyed and op.backend is not None:
            note = restore_keyed(op.backend, op_meta, spec.task_index, p, spec.max_parallelism,
                                 spec.restore_dir or "", data_of, meta.checkpoint_id)
            if note is not None and local is not None:
                local.append((op.uid, note))
        per_subtask: list[list[Any]] = []
        for handle in op_meta.subtasks:
            if handle and handle.op_state:
                off, length = handle.op_state
                per_subtask.append(serializer.loads(data_of(handle)[off:off + length]))
            else:
                per_subtask.append([])
        op.restore_operator_state(distribute_operator_state(
            per_subtask, op_meta.operator_state_mode, spec.task_index, p),
            committed=spec.restore_committed)  # a sink: what it restores was committed
    return skipped


class SnapshotWriter:
    """Writes snapshots in the background, one at a time and in order, and
    sends each one's :class:`Ack` (or :class:`Decline`) through ``send``."""

    def __init__(self, spec: TaskSpec, serializer: StateSerializer, faults: FaultInjector,
                 send: Callable[[ControlMessage], None]) -> None:
        self.spec = spec
        self.serializer = StateSerializer(serializer.allow_pickle)
        """The writer thread's own: a serializer's packer holds a buffer, and
        the task thread packs with the task's (RocksDB values, channel state)
        while this thread writes."""
        self.faults = faults
        self.send = send
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="snapshot")

    def submit(self, checkpoint_id: int, snaps: list[tuple[StreamOperator, OperatorSnapshot]],
               *, read: int, written: int, finished: bool, alignment: float,
               final: bool, sync_duration: float = 0.0, savepoint: bool = False,
               in_flight: InFlight | None = None) -> None:
        """Write ``snaps`` (captured by the task thread in ``sync_duration``
        seconds) and acknowledge. ``savepoint``: keyed state is written
        canonically; ``in_flight``: an unaligned checkpoint's in-flight data,
        written beside the state files (``<head uid>-<subtask>.channels``)."""
        self._pool.submit(self._write, checkpoint_id, snaps, read, written, finished, alignment,
                          "final_snapshot" if final else "snapshot", sync_duration,
                          time.monotonic(), savepoint, in_flight)

    def discard(self, snaps: list[tuple[StreamOperator, OperatorSnapshot]]) -> None:
        """Snapshots that will never be written (an unaligned checkpoint
        aborted after its synchronous part): handed back to their backends
        on the snapshot thread, in order with the writes (a RocksDB
        changelog's changes then go with the next checkpoint's)."""
        self._pool.submit(_discard, snaps)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _write(self, checkpoint_id: int, snaps: list[tuple[StreamOperator, OperatorSnapshot]],
               read: int, written: int, finished: bool, alignment: float,
               fault_point: str, sync_duration: float = 0.0,
               submitted: float = 0.0, savepoint: bool = False,
               in_flight: InFlight | None = None) -> None:
        try:
            chk = checkpoint_dir(self.spec.job_dir, checkpoint_id)
            fs.makedirs(chk, private=True)
            handles = {op.uid: self._write_state_file(chk, op.uid, snap, checkpoint_id,
                                                      savepoint)
                       for op, snap in snaps}
            if in_flight is not None:
                handles[CHANNEL_STATE_KEY] = write_channel_state(chk, self.spec, in_flight,
                                                                 self.faults)
            self.faults.hit(fault_point)  # before the ack: never races it
            self.send(Ack(checkpoint_id, handles, read, written, finished, alignment,
                          sync_duration, time.monotonic() - submitted if submitted else 0.0))
            self.faults.hit("acked")
        except Exception as e:
            log.exception("snapshot %d failed", checkpoint_id)
            _discard(snaps)  # those it did not reach
            reason = redact(f"writing the snapshot failed: {type(e).__name__}: {e}")
            try:
                self.send(Decline(checkpoint_id, reason[:4000], type(e).__name__))
            except Exception:
                log.exception("could not decline snapshot %d", checkpoint_id)

    def _write_state_file(self, chk: str, uid: str, snap: OperatorSnapshot,
                          checkpoint_id: int = 0, savepoint: bool = False
                          ) -> StateHandle | None:
        """Write one operator's state file (durable: fsynced locally, one
        completed object on an object store) and return its handle; state
        of at most the spec's ``inline_threshold`` bytes is no file but
        kept in the handle, for ``_metadata``."""
        if snap.keyed is None and not snap.operator_state:
            return None
        name = f"{uid}-{self.spec.task_index}.state"
        keyed = KeyedBlocks()
        op_state: tuple[int, int] | None = None
        incremental: IncrementalState | None = None

        def write(out: ChecksumWriter) -> None:
            nonlocal keyed, op_state, incremental
            if snap.keyed is not None:
                keyed, incremental = write_keyed(snap.keyed, out, checkpoint_id, savepoint)
            if snap.operator_state:
                blob = self.serializer.dumps(snap.operator_state)
                op_state = (out.tell(), len(blob))
                out.write(blob)

        size, crc, inline = write_state(chk, name, write, self.spec.inline_threshold)
        return StateHandle(name, size, crc, 0, keyed.key_groups, keyed.states, op_state,
                           incremental, inline)


def _discard(snaps: list[tuple[StreamOperator, OperatorSnapshot]]) -> None:
    """Hand back the keyed snapshots of ``snaps`` that were not written
    (``KeyedSnapshot.discard``; written ones ignore it)."""
    for op, snap in snaps:
        if snap.keyed is not None:
            try:
                snap.keyed.discard()
            except Exception:
                log.exception("could not hand back the snapshot of %s", op.uid)
