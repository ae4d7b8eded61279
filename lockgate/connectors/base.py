"""The contracts between the runtime and connectors (sources and sinks).

A connector object (``Source``/``Sink``) lives in the user's pipeline and is
shipped to every task inside its ``TaskSpec``; there it creates one reader or
writer per task. Everything a reader or writer returns from
``snapshot_state`` is *operator state*: a list of entries, each made of plain
msgpack types (None, bool, int, float, str, bytes, list, dict, tuple), stored
in the checkpoint without pickle and handed back to ``restore`` after a
failure. Entries are the unit of redistribution when parallelism changes
(round-robin), so one entry should describe one split / one transaction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lockgate.checkpoint.kinds import OperatorStateMode

T = TypeVar("T")

__all__ = ["TaskInfo", "Source", "SourceReader", "Sink", "SinkWriter"]


@dataclass(frozen=True)
class TaskInfo:
    """Identity of one parallel instance of an operator in one job attempt."""

    job_id: str
    uid: str
    task_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    """The attempt (epoch) number; it grows with every restart of the job."""


class SourceReader(ABC, Generic[T]):
    """Reads one task's share of a source. All methods run on the task thread."""

    last_split: Any = None
    """A reader that reads several splits in turn sets this, in ``poll``, to
    the id of the split the returned records come from, and answers
    ``unfinished_splits``: the task then keeps a watermark per split and
    emits the smallest of the unfinished splits' (per-split watermarks, as
    Flink's FLIP-27 sources), so that reading splits in turn makes no record
    late. ``None``: one watermark for all the reader's records."""

    def unfinished_splits(self) -> list[Any]:
        """The ids of the splits not read to their end (see ``last_split``)."""
        return []

    @abstractmethod
    def restore(self, state: list[Any] | None) -> None:
        """Called once before the first ``poll``: ``state`` holds the entries this
        task received from the restored checkpoint (possibly none, e.g. when
        parallelism grew beyond the number of splits), or is ``None`` on a fresh
        start (no checkpoint, or one that does not know this source)."""

    @abstractmethod
    def poll(self, max_records: int) -> list[T] | None:
        """Return up to ``max_records`` records; ``[]`` if none is available now;
        ``None`` once the reader's input is exhausted (bounded sources only)."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Position after the last record returned by ``poll`` (split + offset)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` (and every earlier one) is complete:
        e.g. tell the system read from how far the job got (for monitoring;
        a replayable source never reads it back)."""

    def backlog(self) -> int | None:
        """The records this reader could read now and has not yet (Kafka's
        consumer lag, records due from a rate-limited source), or None when
        it cannot tell. The autoscaler adds its growth to the source's input
        rate. Called about once a second from the task's metrics thread, not
        the task thread: return what ``poll`` keeps up to date, never call a
        client here."""
        return None

    def close(self) -> None:
        """Release resources. Always called, also on failure."""


class Source(ABC, Generic[T]):
    """A pipeline source. ``replayable`` sources can rewind to a checkpointed
    position, which exactly-once requires."""

    replayable: bool = True
    bounded: bool = True
    operator_state_mode: OperatorStateMode = OperatorStateMode.SPLIT

    def validate(self) -> None:
        """Called in the driver before the job starts: raise a LockgateError
        naming the problem and the fix if the source cannot work (fail fast)."""
    """How state entries are redistributed on restore: ``"split"`` (each task
    gets its own entries back; round-robin when parallelism changed) or
    ``"union"`` (every task gets every entry and keeps those it owns)."""

    def prepare(self, job_dir: str, uid: str) -> None:
        """Called once per job in the driver, after ``validate`` and before the
        first attempt (never again on restarts): e.g. stage the input under
        the job's checkpoint folder ``job_dir`` (a path or URL) for this source's
        ``uid``. Whatever it sets on ``self`` reaches the tasks."""

    def size_hint(self) -> int | None:
        """Optional: the number of records the source reads in all, when it
        knows (a bounded source), for the progress bar and its ETA; None if not."""
        return None

    def task_modules(self) -> tuple[str, ...]:
        """Modules this source's readers import on first use in a task (its
        client library, say), beyond its own module: a task host that forks
        tasks (the local launcher's fork server) imports them once, before
        it forks the job's tasks, so that no task pays for them. A fork
        keeps only the forking thread: a module that starts threads at its
        import (pyarrow starts its allocator's) must not need them in the
        forked tasks. Empty by default."""
        return ()

    @abstractmethod
    def create_reader(self, info: TaskInfo) -> SourceReader[T]: ...


def _no_fault(point: str) -> None:
    """No fault injection: every protocol point passes."""


class SinkWriter(ABC, Generic[T]):
    """Writes one task's share of a sink. All methods run on the task thread,
    in this order: ``restore`` once, then ``write_batch`` and the checkpoint
    calls interleaved, then ``finish`` (bounded end, drained) and ``close``."""

    fault: Callable[[str], None] = staticmethod(_no_fault)
    """Called at the sink's own named protocol points (``table_commit``,
    ``table_committed``); the task sets it to its fault injector's ``hit``
    (tests kill the task there)."""

    accepts_arrow = False
    """``write_batch`` takes a ``pyarrow.RecordBatch`` as it is; False: an
    Arrow batch is turned into rows (dicts) first."""

    @abstractmethod
    def restore(self, state: list[Any]) -> None:
        """Called once before any write, with this task's entries of the restored
        checkpoint (empty on a fresh start). Two-phase-commit writers commit the
        transactions recorded there and clean up anything else they own."""

    def restore_sent(self, state: list[Any]) -> None:
        """Instead of :meth:`restore`, when the restored savepoint's output
        was all committed (its job ended after the commits: a stop's or a
        drain's). The default restores as usual (committing again is
        idempotent); a write-ahead writer sends nothing."""
        self.restore(state)

    @abstractmethod
    def write_batch(self, batch: list[T]) -> None: ...

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit: make everything written so far durable and return the
        handles needed to commit it (or to recover it after a failure)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` (and every earlier one) is complete."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def finish(self) -> None:
        """No more records will come (bounded input drained). Flush; the next
        checkpoint pre-commits what is left."""

    def close(self) -> None:
        """Release resources. Always called, also on failure."""


class Sink(ABC, Generic[T]):
    """A pipeline sink. ``exactly_once`` sinks are transactional or idempotent."""

    exactly_once: bool = False

    def validate(self) -> None:
        """Called in the driver before the job starts: raise a LockgateError
        naming the problem and the fix if the sink cannot work (fail fast)."""

    def task_modules(self) -> tuple[str, ...]:
        """Modules this sink's writers import on first use in a task, beyond
        its own module (as :meth:`Source.task_modules`). Empty by default."""
        return ()

    @abstractmethod
    def create_writer(self, info: TaskInfo) -> SinkWriter[T]: ...
