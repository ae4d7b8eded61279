"""A reusable base for two-phase-commit (transactional) sink writers.

The base does the bookkeeping of Flink's ``TwoPhaseCommitSinkFunction``:

* a transaction is begun lazily, on the first non-empty ``write_batch``;
* ``snapshot_state(n)`` pre-commits it (if it wrote anything), remembers its
  handle as pending for checkpoint ``n`` and returns every not-yet-committed
  handle as operator state;
* ``notify_checkpoint_complete(n)`` commits, in order, the handles of every
  checkpoint ``<= n``; an aborted checkpoint keeps its handles (a later
  completed checkpoint commits them);
* ``restore(state)`` decodes every restored entry into a handle (each sink's
  ``decode_handle`` checks it: a checkpoint is untrusted input) and hands
  them all to ``recover``, which commits the ones this task is responsible
  for and cleans up everything else it owns.

Subclasses implement ``begin_transaction``, ``write``, ``pre_commit``,
``commit`` (idempotent), ``abort``, ``decode_handle`` and ``recover``.

A handle is a frozen dataclass of the sink's own (:class:`TxnHandle`: what
``commit`` needs, with ``to_state`` giving its checkpoint form); the base
keeps it as a :class:`Precommitted` with the checkpoint and the task that
pre-committed it. In the checkpoint an entry is the handle's ``to_state()``
dict with ``"checkpoint_id"`` and ``"task_index"`` added (both keys are
reserved). The runtime restores a 2PC sink with the UNION of the entries of
all its tasks, so that a change of parallelism can never lose a
transaction; each writer is responsible for exactly the entries with
``task_index % parallelism == task_index`` (see
:meth:`TwoPhaseCommitSinkWriter.is_responsible`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from lockgate.connectors.base import SinkWriter, TaskInfo
from lockgate.errors import CheckpointCorruptError, LockgateError

__all__ = ["TwoPhaseCommitSinkWriter", "TxnHandle", "Precommitted", "RESERVED_HANDLE_KEYS",
           "decode_precommitted"]

RESERVED_HANDLE_KEYS = ("checkpoint_id", "task_index")
"""Keys the base adds to every handle's entry; ``to_state`` must not use them."""


class TxnHandle(Protocol):
    """A pre-committed transaction's handle: a frozen dataclass of the sink's
    own, holding what ``commit`` needs (possibly in another process, after a
    failure)."""

    def to_state(self) -> dict[str, Any]:
        """Its checkpoint form: msgpack types only, no reserved key."""
        ...


TxnT = TypeVar("TxnT")
H = TypeVar("H", bound=TxnHandle)
H_co = TypeVar("H_co", bound=TxnHandle, covariant=True)


@dataclass(frozen=True, slots=True)
class Precommitted(Generic[H_co]):
    """A handle with the checkpoint it was pre-committed for and the task
    that pre-committed it (one entry of the sink's union state)."""

    checkpoint_id: int
    task_index: int
    handle: H_co

    def to_state(self) -> dict[str, Any]:
        """The checkpoint entry: the handle's form with the two reserved keys."""
        entry = self.handle.to_state()
        clash = [k for k in RESERVED_HANDLE_KEYS if k in entry]
        if clash:
            raise LockgateError(
                f"{type(self.handle).__name__}.to_state gave the reserved key(s) {clash}; "
                "rename them in the handle")
        entry["checkpoint_id"] = self.checkpoint_id
        entry["task_index"] = self.task_index
        return entry


def _ids(entry: Any, uid: str) -> tuple[int, int]:
    """The checkpoint id and task index of a restored (untrusted) entry."""
    if not isinstance(entry, dict) or any(k not in entry for k in RESERVED_HANDLE_KEYS):
        raise LockgateError(
            f"sink {uid!r}: restored state entry {str(entry)[:200]} is not a "
            "two-phase-commit handle (a dict with 'checkpoint_id' and 'task_index'); "
            "the checkpoint was written by another sink type: restore it with the "
            "sink that wrote it or start without state")
    cid, task = entry["checkpoint_id"], entry["task_index"]
    if type(cid) is not int or type(task) is not int or cid < 0 or task < 0:
        raise CheckpointCorruptError(
            f"sink {uid!r}: a restored handle's checkpoint_id and task_index are "
            f"{cid!r:.40} and {task!r:.40}, not counts: the checkpoint or savepoint is "
            "damaged or was crafted; it is not restored")
    return cid, task


def decode_precommitted(entry: Any, uid: str, decode_handle: Callable[[dict[str, Any]], H]
                        ) -> Precommitted[H]:
    """A restored (untrusted) entry of sink ``uid``'s state, decoded: a dict
    with its checkpoint id and task index checked here, the rest by
    ``decode_handle``."""
    cid, task = _ids(entry, uid)
    return Precommitted(cid, task, decode_handle(entry))


class TwoPhaseCommitSinkWriter(SinkWriter[Any], Generic[TxnT, H]):
    """Base of transactional sink writers (begin / write / pre-commit / commit):
    ``TxnT`` is the sink's open transaction, ``H`` its handle (:class:`TxnHandle`).

    Attributes:
        info: the identity of this task.
    """

    def __init__(self, info: TaskInfo) -> None:
        """Create the writer for task ``info``; no transaction is begun yet."""
        self.info = info
        self._txn: TxnT | None = None
        self._txn_written = False
        self._pending: dict[int, list[Precommitted[H]]] = {}

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def begin_transaction(self) -> TxnT:
        """Start a new transaction (called lazily, on the first write after a
        snapshot)."""

    @abstractmethod
    def write(self, txn: TxnT, batch: list[Any]) -> None:
        """Write ``batch`` (never empty) into ``txn``."""

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> H:
        """Make ``txn`` durable and return the handle that lets ``commit``
        (possibly in another process, after a failure) commit it."""

    @abstractmethod
    def commit(self, entry: Precommitted[H]) -> None:
        """Commit a pre-committed transaction. MUST be idempotent: it is called
        again after recovery for handles that may already be committed."""

    @abstractmethod
    def abort(self, txn: TxnT) -> None:
        """Abort an open transaction (never pre-committed); its data is
        replayed by the sources."""

    @abstractmethod
    def decode_handle(self, entry: dict[str, Any]) -> H:
        """The handle of a restored entry (a dict read back from a checkpoint:
        untrusted), every field checked; ``CheckpointCorruptError`` naming the
        field when it is not one of this sink's handles. ``checkpoint_id`` and
        ``task_index`` are checked already."""

    @abstractmethod
    def recover(self, handles: list[Precommitted[H]]) -> None:
        """Called from ``restore`` (also on a fresh start, with ``[]``).

        ``handles`` holds the entries of ALL tasks of this sink in the restored
        checkpoint, decoded. Commit every handle this task is responsible for
        (:meth:`is_responsible`), then delete or abort everything else this
        task owns that no handle (of any task) names.
        """

    def on_finish(self) -> None:
        """Called by ``finish``; the default does nothing (the final checkpoint
        pre-commits what is left)."""

    # ------------------------------------------------------------- helpers

    def is_responsible(self, entry: Precommitted[H]) -> bool:
        """Whether this task commits restored ``entry`` (task index modulo the
        current parallelism)."""
        return entry.task_index % self.info.parallelism == self.info.task_index

    def responsible_handles(self, handles: list[Precommitted[H]]) -> list[Precommitted[H]]:
        """The entries of ``handles`` this task commits, ordered by checkpoint id
        (stable, so the order within one checkpoint is kept)."""
        mine = [h for h in handles if self.is_responsible(h)]
        return sorted(mine, key=lambda h: h.checkpoint_id)

    def decode_entry(self, entry: Any) -> Precommitted[H]:
        """A restored (untrusted) entry of this sink's state, decoded: its
        checkpoint id and task index checked here, the rest by
        :meth:`decode_handle` (:func:`decode_precommitted`)."""
        return decode_precommitted(entry, self.info.uid, self.decode_handle)

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

        Step 1. Decode every entry: a dict with ``checkpoint_id`` and
                ``task_index``, the rest a handle of this sink
                (``decode_handle``); one bad entry and nothing is done.
        Step 2. Hand all handles (the union of every task's) to ``recover``.
        """
        # Step 1. Decode the entries.
        handles = [self.decode_entry(entry) for entry in state]
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
                handle as pending for ``checkpoint_id``; begin nothing until the
                next write.
        Step 2. Return every pending handle, of this and earlier (aborted or not
                yet completed) checkpoints, ordered by checkpoint id, in their
                checkpoint form (:meth:`Precommitted.to_state`).
        """
        # Step 1. Pre-commit.
        if self._txn is not None and self._txn_written:
            handle = self.pre_commit(self._txn)
            self._txn = None
            self._txn_written = False
            entry = Precommitted(checkpoint_id, self.info.task_index, handle)
            entry.to_state()  # a reserved key fails here, not in the snapshot
            self._pending.setdefault(checkpoint_id, []).append(entry)
        # Step 2. Every not-yet-committed handle is state.
        return [e.to_state() for cid in sorted(self._pending) for e in self._pending[cid]]

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
