"""A reusable base for two-phase-commit (transactional) sink writers.

The base does the bookkeeping of Flink's ``TwoPhaseCommitSinkFunction``:

* a transaction is begun lazily, on the first non-empty ``write_batch``;
* ``snapshot_state(n)`` pre-commits it (if it wrote anything), remembers its
  handle as pending for checkpoint ``n`` and returns every not-yet-committed
  handle as operator state;
* ``notify_checkpoint_complete(n)`` commits, in order, the handles of every
  checkpoint ``<= n``; an aborted checkpoint keeps its handles (a later
  completed checkpoint commits them);
* ``restore(state)`` hands every restored handle to ``recover``, which commits
  the ones this task is responsible for and cleans up everything else it owns.

Subclasses implement ``begin_transaction``, ``write``, ``pre_commit``,
``commit`` (idempotent), ``abort`` and ``recover``.

State entries are the handle dicts returned by ``pre_commit``, augmented with
``"checkpoint_id"`` and ``"task_index"`` (both keys are reserved). The runtime
restores a 2PC sink with the UNION of the entries of all its tasks, so that a
change of parallelism can never lose a transaction; each writer is responsible
for exactly the entries with ``entry["task_index"] % parallelism == task_index``
(see :meth:`TwoPhaseCommitSinkWriter.is_responsible`).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Generic, TypeVar

from lockgate.connectors.base import SinkWriter, TaskInfo
from lockgate.errors import LockgateError

TxnT = TypeVar("TxnT")

__all__ = ["TwoPhaseCommitSinkWriter", "RESERVED_HANDLE_KEYS"]

RESERVED_HANDLE_KEYS = ("checkpoint_id", "task_index")
"""Keys the base adds to every handle; ``pre_commit`` must not use them."""


class TwoPhaseCommitSinkWriter(SinkWriter[Any], Generic[TxnT]):
    """Base of transactional sink writers (begin / write / pre-commit / commit).

    Attributes:
        info: the identity of this task.
    """

    def __init__(self, info: TaskInfo) -> None:
        """Create the writer for task ``info``; no transaction is begun yet."""
        self.info = info
        self._txn: TxnT | None = None
        self._txn_written = False
        self._pending: dict[int, list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def begin_transaction(self) -> TxnT:
        """Start a new transaction (called lazily, on the first write after a
        snapshot)."""

    @abstractmethod
    def write(self, txn: TxnT, batch: list[Any]) -> None:
        """Write ``batch`` (never empty) into ``txn``."""

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> dict[str, Any]:
        """Make ``txn`` durable and return a msgpack-able handle that lets
        ``commit`` (possibly in another process, after a failure) commit it."""

    @abstractmethod
    def commit(self, handle: dict[str, Any]) -> None:
        """Commit a pre-committed transaction. MUST be idempotent: it is called
        again after recovery for handles that may already be committed."""

    @abstractmethod
    def abort(self, handle_or_txn: Any) -> None:
        """Abort an open transaction or a pre-committed handle; its data is
        replayed by the sources."""

    @abstractmethod
    def recover(self, handles: list[dict[str, Any]]) -> None:
        """Called from ``restore`` (also on a fresh start, with ``[]``).

        ``handles`` holds the entries of ALL tasks of this sink in the restored
        checkpoint. Commit every handle this task is responsible for
        (:meth:`is_responsible`), then delete or abort everything else this
        task owns that no handle (of any task) names.
        """

    def on_finish(self) -> None:
        """Called by ``finish``; the default does nothing (the final checkpoint
        pre-commits what is left)."""

    # ------------------------------------------------------------- helpers

    def is_responsible(self, entry: dict[str, Any]) -> bool:
        """Whether this task commits restored ``entry`` (task index modulo the
        current parallelism)."""
        return int(entry["task_index"]) % self.info.parallelism == self.info.task_index

    def responsible_handles(self, handles: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries of ``handles`` this task commits, ordered by checkpoint id
        (stable, so the order within one checkpoint is kept)."""
        mine = [h for h in handles if self.is_responsible(h)]
        return sorted(mine, key=lambda h: int(h["checkpoint_id"]))

    @property
    def pending_checkpoints(self) -> list[int]:
        """Ids of the checkpoints whose handles are not committed yet, ascending."""
        return sorted(self._pending)

    @property
    def has_open_transaction(self) -> bool:
        """Whether a transaction was begun and not yet pre-committed."""
        return self._txn is not None

    # ------------------------------------------------------- SinkWriter API

    def restore(self, state: list[Any]) -> None:
        """Recover from the restored checkpoint.

        Step 1. Validate that every entry is a handle dict carrying
                ``checkpoint_id`` and ``task_index``.
        Step 2. Hand all entries (the union of every task's) to ``recover``.
        """
        # Step 1. Validate the entries.
        handles: list[dict[str, Any]] = []
        for entry in state:
            if not isinstance(entry, dict) or any(k not in entry for k in RESERVED_HANDLE_KEYS):
                raise LockgateError(
                    f"sink {self.info.uid!r}: restored state entry {entry!r} is not a "
                    "two-phase-commit handle (a dict with 'checkpoint_id' and 'task_index'); "
                    "the checkpoint was written by another sink type: restore it with the "
                    "sink that wrote it or start without state"
                )
            handles.append(dict(entry))
        # Step 2. Commit ours, clean up the rest.
        self.recover(handles)

    def write_batch(self, batch: list[Any]) -> None:
        """Write ``batch`` into the current transaction.

        Step 1. Ignore empty batches (they never begin a transaction).
        Step 2. Begin a transaction if none is open.
        Step 3. Write the batch into it.
        """
        # Step 1. Nothing to write.
        if not batch:
            return
        # Step 2. Lazily begin.
        if self._txn is None:
            self._txn = self.begin_transaction()
            self._txn_written = False
        # Step 3. Write.
        self.write(self._txn, batch)
        self._txn_written = True

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit the current transaction and return all uncommitted handles.

        Step 1. If the open transaction wrote anything, pre-commit it and keep its
                handle (augmented with ``checkpoint_id`` and ``task_index``) as
                pending for ``checkpoint_id``; begin nothing until the next write.
        Step 2. Return every pending handle, of this and earlier (aborted or not
                yet completed) checkpoints, ordered by checkpoint id.
        """
        # Step 1. Pre-commit.
        if self._txn is not None and self._txn_written:
            handle = self.pre_commit(self._txn)
            self._txn = None
            self._txn_written = False
            clash = [k for k in RESERVED_HANDLE_KEYS if k in handle]
            if clash:
                raise LockgateError(
                    f"{type(self).__name__}.pre_commit returned a handle with the reserved "
                    f"key(s) {clash}; rename them in the handle"
                )
            entry = dict(handle)
            entry["checkpoint_id"] = checkpoint_id
            entry["task_index"] = self.info.task_index
            self._pending.setdefault(checkpoint_id, []).append(entry)
        # Step 2. Every not-yet-committed handle is state.
        return [dict(e) for cid in sorted(self._pending) for e in self._pending[cid]]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the handles of every checkpoint ``<= checkpoint_id``.

        Step 1. Take the pending checkpoint ids ``<= checkpoint_id`` in ascending order.
        Step 2. For each, commit its handles in order, then forget the checkpoint
                (if a commit raises, the rest stays pending and the task fails;
                recovery commits them again, idempotently).
        """
        # Step 1. Which checkpoints are now complete.
        done = [cid for cid in sorted(self._pending) if cid <= checkpoint_id]
        # Step 2. Commit them in order.
        for cid in done:
            for entry in self._pending[cid]:
                self.commit(entry)
            del self._pending[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Keep the handles of ``checkpoint_id``: a later completed checkpoint
        (whose state still names them) commits them."""

    def finish(self) -> None:
        """No more input: call ``on_finish``; the final checkpoint pre-commits
        what is left."""
        self.on_finish()

    def close(self) -> None:
        """Abort the open transaction if it was never pre-committed (its records
        are replayed from the last checkpoint). Pending handles are kept: they
        are in a checkpoint, and recovery commits or discards them."""
        if self._txn is not None:
            txn = self._txn
            self._txn = None
            self._txn_written = False
            self.abort(txn)
