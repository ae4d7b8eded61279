"""A write-ahead sink base: records kept in the checkpoint, sent after it completes.

For systems with neither transactions nor keys (an HTTP endpoint, a NATS
subject, a message queue), the design's *sink-side buffering*:

* ``write_batch`` only keeps the records (after ``encode``) in memory;
* ``snapshot_state(n)`` moves them into checkpoint ``n``'s entry, and returns
  every entry not sent yet as operator state: the records themselves are in
  the checkpoint, serialized with the safe state serializer (msgpack without
  pickle), so **encoded records must be msgpack types** (None, bool, int,
  float, str, bytes, lists, dicts, tuples; ``encode`` turns records into
  such values, e.g. ``bytes``);
* ``notify_checkpoint_complete(n)`` sends the entries of every checkpoint
  ``<= n`` (``send``), in order, then forgets them; an aborted checkpoint's
  records stay and go with the next completed one;
* ``restore`` sends the restored checkpoint's entries again: the checkpoint
  completed, but whether they were sent before the failure is unknown.

Alone that is **at-least-once** (a record may be sent twice around a
failure). Each record has a de-duplication id, the same every time it is
sent: ``<job>/<uid>/<task>/<checkpoint>/<n>`` (the checkpoint's origin is
kept in its entry, so a job restored under another id sends the same ids).
A system that drops repeated ids (JetStream's ``Nats-Msg-Id`` within its
duplicate window, an HTTP endpoint with an idempotency key) makes it
**exactly-once**: such a sink sets ``exactly_once = True``.

What it costs: a checkpoint's records are held in memory and written into
the checkpoint, and reach the target a checkpoint interval late. As with the
two-phase-commit sinks, entries are UNION state (every task gets every
entry on restore and sends those with ``task_index % parallelism`` equal to
its own), so a change of parallelism never drops one.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from lockgate.connectors.base import SinkWriter, TaskInfo
from lockgate.errors import LockgateError

__all__ = ["WriteAheadSinkWriter", "WriteAheadEntry", "dedup_ids"]

MAX_ORIGIN = 1024
"""Longest origin string accepted from a checkpoint (untrusted input)."""


def dedup_ids(origin: str, count: int) -> list[str]:
    """The de-duplication ids of the ``count`` records of the entry ``origin``."""
    return [f"{origin}/{i}" for i in range(count)]


@dataclass(frozen=True, slots=True)
class WriteAheadEntry:
    """One checkpoint's records of one task, kept until they are sent."""

    checkpoint_id: int
    task_index: int
    origin: str
    """``<job>/<uid>/<task>/<checkpoint>`` where the records were first
    checkpointed: their de-duplication ids start with it."""
    records: list[Any]
    """Encoded (msgpack types)."""

    def to_state(self) -> dict[str, Any]:
        return {"task_index": self.task_index, "checkpoint_id": self.checkpoint_id,
                "origin": self.origin, "records": self.records}


def _entry(entry: Any, uid: str) -> WriteAheadEntry:
    """A restored entry, validated (checkpoints are untrusted input)."""
    ok = (isinstance(entry, dict)
          and type(entry.get("task_index")) is int and entry["task_index"] >= 0
          and type(entry.get("checkpoint_id")) is int
          and isinstance(entry.get("origin"), str) and 0 < len(entry["origin"]) <= MAX_ORIGIN
          and isinstance(entry.get("records"), list))
    if not ok:
        raise LockgateError(
            f"sink {uid!r}: restored state entry {str(entry)[:200]} is not a write-ahead "
            "entry (task_index, checkpoint_id, origin, records); the checkpoint was written "
            "by another sink type: restore it with the sink that wrote it, or give this sink "
            "a new uid")
    return WriteAheadEntry(entry["checkpoint_id"], entry["task_index"], entry["origin"],
                           entry["records"])


class WriteAheadSinkWriter(SinkWriter[Any]):
    """Base of write-ahead sink writers: implement :meth:`send` (and
    optionally :meth:`encode`, :meth:`close`).

    Attributes:
        info: the identity of this task.
        sent: records sent so far by this writer (repeats included).
    """

    def __init__(self, info: TaskInfo) -> None:
        self.info = info
        self._buffer: list[Any] = []
        self._pending: dict[int, WriteAheadEntry] = {}
        self.sent = 0

    # ------------------------------------------------------------------ hooks

    def encode(self, record: Any) -> Any:
        """The value kept for ``record`` in the checkpoint and given to
        ``send``: msgpack types only. Default: the record itself."""
        return record

    @abstractmethod
    def send(self, records: list[Any], ids: list[str]) -> None:
        """Write ``records`` (encoded, never empty) to the target and return
        once it has them; ``ids[i]`` is the de-duplication id of
        ``records[i]``, the same each time that record is sent. Raise if it
        cannot: the task fails, and recovery sends them again."""

    # ------------------------------------------------------- SinkWriter API

    def restore(self, state: list[Any]) -> None:
        """Send every restored entry this task is responsible for.

        Step 1. Validate the entries (untrusted).
        Step 2. Send the entries of the tasks ``task_index % parallelism`` names
                this one, in checkpoint order (some may have been sent before the
                failure: their ids are the same).
        """
        # Step 1. Validate.
        entries = [_entry(e, self.info.uid) for e in state]
        # Step 2. Send ours again.
        mine = [e for e in entries
                if e.task_index % self.info.parallelism == self.info.task_index]
        for entry in sorted(mine, key=lambda e: e.checkpoint_id):
            self._send_entry(entry)

    def restore_sent(self, state: list[Any]) -> None:
        """Restore from a savepoint whose job sent every entry before it ended
        (a stop's or a drain's, :func:`~lockgate.checkpoint.storage.mark_committed`):
        validate the entries, send none."""
        for entry in state:
            _entry(entry, self.info.uid)

    def write_batch(self, batch: list[Any]) -> None:
        """Keep ``batch``, encoded, until the next snapshot."""
        encode = self.encode
        if type(self).encode is WriteAheadSinkWriter.encode:
            self._buffer.extend(batch)
        else:
            self._buffer.extend(encode(r) for r in batch)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """The records since the last snapshot become checkpoint
        ``checkpoint_id``'s entry; return every entry not sent yet."""
        if self._buffer:
            info = self.info
            self._pending[checkpoint_id] = WriteAheadEntry(
                checkpoint_id, info.task_index,
                f"{info.job_id}/{info.uid}/{info.task_index}/{checkpoint_id}", self._buffer)
            self._buffer = []
        return [self._pending[cid].to_state() for cid in sorted(self._pending)]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Send the entries of every checkpoint ``<= checkpoint_id``, in order,
        and forget each once sent (if ``send`` raises, the rest stays pending
        and the task fails; recovery sends them again)."""
        for cid in [c for c in sorted(self._pending) if c <= checkpoint_id]:
            self._send_entry(self._pending[cid])
            del self._pending[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Keep the records: the next completed checkpoint names and sends them."""

    @property
    def pending_checkpoints(self) -> list[int]:
        """Ids of the checkpoints whose records are not sent yet, ascending."""
        return sorted(self._pending)

    def _send_entry(self, entry: WriteAheadEntry) -> None:
        records = entry.records
        if records:
            self.send(records, dedup_ids(entry.origin, len(records)))
            self.sent += len(records)
