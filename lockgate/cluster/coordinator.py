"""The checkpoint coordinator (Flink's CheckpointCoordinator role), in the driver.

It decides when to trigger, collects acknowledgements, completes a checkpoint
by writing ``_metadata`` atomically, notifies every task, enforces timeouts
and retention, and runs the final checkpoint of a bounded job. It talks to
tasks only through the injected ``send`` function and reads time only from the
injected ``clock``, so tests drive it without processes or sleeps.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lockgate import fs
from lockgate.checkpoint import storage
from lockgate.checkpoint.history import CheckpointRecord, CheckpointStatus
from lockgate.checkpoint.kinds import BarrierKind, CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, Progress
from lockgate.checkpoint.pending import (
    AckResult,
    CheckpointAbortReason,
    PendingCheckpoint,
    build_metadata,
    checkpoints_to_discard,
)
from lockgate.config import CheckpointConfig
from lockgate.errors import LockgateError
from lockgate.fs.explain import explain
from lockgate.protocol import (
    ControlMessage,
    Finish,
    NotifyAborted,
    NotifyComplete,
    StateHandles,
    TriggerCheckpoint,
)
from lockgate.state.incremental import delete_unreferenced, referenced_shared

log = logging.getLogger("lockgate.checkpoint")


class CheckpointFailureError(LockgateError):
    """More consecutive checkpoints failed than the job tolerates."""


@dataclass
class CompletedCheckpoint:
    checkpoint_id: int
    path: str
    """The ``chk-<n>`` folder: a local path or a URL."""
    metadata: CheckpointMetadata
    savepoint: bool = False
    """A savepoint the tasks were told of (a stop's): failover restores it, and
    retention never deletes it."""
    sinks_committed: bool = False
    """A savepoint whose job ended after its sinks committed every transaction
    it names (:func:`~lockgate.checkpoint.storage.mark_committed`): a job
    restored from it does not send its write-ahead records again."""


@dataclass
class AttemptPlan:
    """Who takes part in checkpoints during one job attempt."""

    attempt: int
    source_tasks: list[int]
    all_tasks: list[int]
    task_operators: dict[int, tuple[int, int, list[str]]]


class CheckpointCoordinator:
    def __init__(
        self,
        job_id: str,
        job_dir: str | os.PathLike[str],
        config: CheckpointConfig,
        operator_parallelism: dict[str, int],
        operator_modes: dict[str, OperatorStateMode],
        max_parallelism: int,
        send: Callable[[int, int, ControlMessage], None],
        clock: Callable[[], float] = time.monotonic,
        job_name: str | None = None,
        locations: dict[str, str] | None = None,
        background_cleanup: bool = False,
    ) -> None:
        """``background_cleanup``: what retention drops is deleted by a
        thread of its own (Flink's checkpoint cleaner on its I/O executor),
        so that the next checkpoint never waits for it; :meth:`close` waits
        for it. Without it, deletion happens in :meth:`_complete`."""
        self.job_id = job_id
        self.job_dir = os.fspath(job_dir)
        """The job's checkpoint folder: a local path or a URL (:mod:`lockgate.fs`)."""
        self.config = config
        self.operator_parallelism = operator_parallelism
        self.operator_modes = operator_modes
        self.job_name = job_name
        self.locations = locations or {}
        """Where each sink uid writes (secrets masked), recorded in ``_metadata``."""
        self.max_parallelism = max_parallelism
        self.send = send
        self.clock = clock
        self.next_id = 1
        self.pending: PendingCheckpoint | None = None
        self.completed: list[CompletedCheckpoint] = []
        self.history: deque[CheckpointRecord] = deque(maxlen=config.history_size)
        self.plan: AttemptPlan | None = None
        self.consecutive_failures = 0
        self.last_trigger = clock()
        self.last_completion = clock()
        self.end_of_data: set[int] = set()
        self.finished = False
        """The final checkpoint of this attempt completed: its tasks may end."""
        self.savepoint_results: dict[int, str | BaseException] = {}
        """Per savepoint id: its folder once completed, or why it failed."""
        self.rescale_results: dict[int, str | BaseException] = {}
        """Per id of a rescale's checkpoint: its folder once completed, or why it failed."""
        self._final_savepoint_dir: str | None = None
        self.completed_count = 0
        self.failed_count = 0
        """Checkpoints and savepoints that failed (history keeps the newest only)."""
        self.baseline = Progress()
        """Records read and written before this attempt (from the restored checkpoint)."""
        self._cleaner = (ThreadPoolExecutor(1, thread_name_prefix="checkpoint-cleanup")
                         if background_cleanup else None)

    def close(self) -> None:
        """Wait until every deletion retention asked for is done (the job's
        folder is tidy when the job ends)."""
        if self._cleaner is not None:
            self._cleaner.shutdown(wait=True)
            self._cleaner = None

    # ------------------------------------------------------------ attempts
    def start_attempt(self, plan: AttemptPlan) -> None:
        if self.pending is not None:
            self._abort(CheckpointAbortReason.TASK_FAILURE, notify=False)
        self.plan = plan
        self.end_of_data = set()
        # The final checkpoint belongs to an attempt: a task may die after it
        # completed (before the job ended), and the next attempt, restored from
        # it, must take its own final checkpoint before its tasks may finish.
        self.finished = False
        self.last_trigger = self.clock()
        self.baseline = self.latest.metadata.progress if self.latest else Progress()

    def restored_from(self, completed: CompletedCheckpoint) -> None:
        """Start numbering after a checkpoint the job was started from."""
        self.next_id = max(self.next_id, completed.checkpoint_id + 1)
        if not self.completed:
            self.completed.append(completed)

    @property
    def latest(self) -> CompletedCheckpoint | None:
        return self.completed[-1] if self.completed else None

    # --------------------------------------------------------------- clock
    def tick(self) -> None:
        """Periodic work: expire the pending checkpoint, trigger the next one."""
        now = self.clock()
        if self.pending is not None:
            if self.pending.expired(now, self.config.timeout):
                self._abort(CheckpointAbortReason.EXPIRED)
            return
        if self.plan is None or self.finished:
            return
        if self._all_ended():
            self.trigger(final=True)
            return
        interval = self.config.interval
        if (interval is not None and now - self.last_trigger >= interval
                and now - self.last_completion >= self.config.min_pause):
            self.trigger()

    def next_trigger_in(self) -> float | None:
        """Seconds until :meth:`tick` would trigger the next periodic
        checkpoint (at most 0), or None: none is due while one is pending,
        without an interval, or after the job finished. The job master waits
        no longer than this for its next tick, so a checkpoint starts when its
        interval has passed, not up to a tick later."""
        interval = self.config.interval
        if interval is None or self.pending is not None or self.plan is None or self.finished:
            return None
        now = self.clock()
        return max(0.0, self.last_trigger + interval - now,
                   self.last_completion + self.config.min_pause - now)

    def _all_ended(self) -> bool:
        return self.plan is not None and self.end_of_data >= set(self.plan.all_tasks)

    @property
    def input_ended(self) -> bool:
        """Every source task of the attempt reported the end of its input:
        the job is finishing (its final checkpoint follows once every task
        has ended its input), and no stop, savepoint or rescale starts."""
        return self.plan is not None and self.end_of_data >= set(self.plan.source_tasks)

    def trigger(self, final: bool = False, savepoint_dir: str | None = None,
                stops: bool = False) -> int | None:
        """Start a checkpoint: ``trigger(n)`` to every source task. With
        ``savepoint_dir`` it is a savepoint: on completion its state goes to a
        self-contained folder there, and tasks are not told (an intermediate
        savepoint commits nothing; the next checkpoint commits its sinks' work).
        ``stops``: a stop's savepoint (barrier kind ``stop``): every task holds
        still after its snapshot; on completion the tasks are told, their
        sinks commit, and they end (:meth:`_complete`). Without
        ``savepoint_dir`` it is a rescale's checkpoint (barrier kind
        ``rescale``): the same, kept in the job's checkpoint folder as its
        latest completed checkpoint, its keyed state written as a periodic
        checkpoint's (incrementally on RocksDB). None: a checkpoint is
        pending, or the final one completed (the tasks were told to end:
        none would take a barrier)."""
        if self.pending is not None or self.plan is None or self.finished:
            return None
        if final and self._final_savepoint_dir is not None:
            savepoint_dir = self._final_savepoint_dir
        n = self.next_id
        self.next_id += 1
        now = self.clock()
        self.last_trigger = now
        self.pending = PendingCheckpoint(n, time.time(), now, frozenset(self.plan.all_tasks),
                                         is_final=final, savepoint_dir=savepoint_dir,
                                         stops=stops)
        kind = CheckpointKind.SAVEPOINT if savepoint_dir is not None else CheckpointKind.CHECKPOINT
        self.history.append(CheckpointRecord(n, kind, CheckpointStatus.IN_PROGRESS, time.time(),
                                             final=final))
        if self.pending.stops:
            barrier_kind = BarrierKind.STOP if savepoint_dir is not None else BarrierKind.RESCALE
        elif savepoint_dir is not None:
            barrier_kind = BarrierKind.SAVEPOINT
        elif final:
            barrier_kind = BarrierKind.FINAL
        else:
            barrier_kind = BarrierKind.CHECKPOINT
        for task in self.plan.source_tasks:
            self.send(self.plan.attempt, task, TriggerCheckpoint(n, barrier_kind))
        return n

    def rescaled(self, operator_parallelism: dict[str, int]) -> None:
        """The job's next attempts run at another parallelism (a rescale):
        their checkpoints record it."""
        self.operator_parallelism = dict(operator_parallelism)

    def final_checkpoint_is_savepoint(self, savepoint_dir: str | None) -> None:
        """Stop with a drain: the final checkpoint is a savepoint in
        ``savepoint_dir`` (None: it is not, any more: the drain failed)."""
        self._final_savepoint_dir = savepoint_dir

    # -------------------------------------------------------------- events
    def on_end_of_data(self, task: int) -> None:
        """Task ``task`` ended its input. The last source task to do so
        ends the job's input: a stop's or rescale's checkpoint in flight is
        aborted (its tasks go on; a source reads to its end before it takes
        a barrier, so its report always comes before its acknowledgement),
        and the job finishes with its final checkpoint: a stop either comes
        before the input's end or is refused, never a savepoint of a job
        whose input ended."""
        self.end_of_data.add(task)
        p = self.pending
        if p is not None and p.stops and not p.is_final and self.input_ended:
            self._abort(CheckpointAbortReason.INPUT_ENDED)
        if self._all_ended() and self.pending is None and not self.finished:
            self.trigger(final=True)

    def on_ack(self, task: int, checkpoint_id: int, handles: StateHandles,
               counts: tuple[int, int] = (0, 0), finished: bool = False,
               alignment: float = 0.0, sync_duration: float = 0.0,
               async_duration: float = 0.0) -> AckResult:
        p = self.pending
        if p is None or p.checkpoint_id != checkpoint_id:
            return AckResult.DISCARDED
        result = p.acknowledge(task, handles, self.clock(), counts, finished, alignment)
        if result is AckResult.SUCCESS:
            self._record(checkpoint_id).task_durations(sync_duration, async_duration)
        if result is AckResult.SUCCESS and p.fully_acknowledged:
            self._complete(p)
        return result

    def on_decline(self, task: int, checkpoint_id: int, reason: str) -> None:
        p = self.pending
        if p is not None and p.checkpoint_id == checkpoint_id:
            log.warning("task %d declined checkpoint %d: %s", task, checkpoint_id, reason)
            self._abort(CheckpointAbortReason.DECLINED, detail=reason)

    def on_attempt_failed(self) -> None:
        """A task failed: the attempt's tasks are gone, its pending checkpoint with them."""
        self._end_attempt(CheckpointAbortReason.TASK_FAILURE)

    def on_attempt_ended(self) -> None:
        """The attempt's tasks ended, or were ended, without a failure (the
        job finished, stopped, rescales or was cancelled): a checkpoint still
        pending (a cancel's) is aborted for that reason, not a task's failure."""
        self._end_attempt(CheckpointAbortReason.ATTEMPT_ENDED)

    def _end_attempt(self, reason: CheckpointAbortReason) -> None:
        if self.pending is not None:
            self._abort(reason, notify=False)
        self.plan = None

    # ------------------------------------------------------------- outcome
    def _complete(self, p: PendingCheckpoint) -> None:
        """Step 1. write _metadata atomically (now the checkpoint exists);
        Step 2. notify every task; Step 3. discard old checkpoints.

        A stop's savepoint and a drain's final one are announced like a final
        checkpoint (sinks commit, then the tasks end), and become the latest
        completed checkpoint: a failure before the job ended restores them,
        never an older checkpoint whose rewind would write again what their
        sinks committed."""
        assert self.plan is not None
        chk = storage.checkpoint_dir(self.job_dir, p.checkpoint_id)
        metadata = build_metadata(self.job_id, p, self.plan.task_operators,
                                  self.operator_parallelism, self.operator_modes,
                                  self.max_parallelism, self.baseline,
                                  job_name=self.job_name, locations=self.locations)
        # Step 1.
        path = chk
        writing = self.clock()
        if p.savepoint_dir is not None:
            try:
                target = storage.write_savepoint(chk, p.savepoint_dir, self.job_id,
                                                 p.checkpoint_id, metadata)
            except OSError as e:
                self._abort(CheckpointAbortReason.WRITE_FAILED,
                            detail=f"the savepoint could not be written: {e}")
                return
            self.savepoint_results[p.checkpoint_id] = target
            log.info("savepoint %d completed: %s", p.checkpoint_id, fs.redact(target))
            path = target
        else:
            try:
                fs.makedirs(chk)
                storage.write_metadata(chk, metadata)
            except OSError as e:  # disk full, permissions, a flaky object store
                # the checkpoint never existed: declined, counted, the job goes on
                self._abort(CheckpointAbortReason.WRITE_FAILED,
                            detail=f"its _metadata could not be written: {explain(e, chk)}")
                return
            if p.stops:  # a rescale's checkpoint: its request waits for it
                self.rescale_results[p.checkpoint_id] = chk
        self.pending = None
        now = self.clock()
        self.last_completion = now
        self.consecutive_failures = 0
        record = self._record(p.checkpoint_id)
        record.completed(p, now)
        record.metadata_duration = now - writing
        ends = p.is_final or p.stops
        if p.savepoint_dir is not None and not ends:
            # Step 2 (savepoint). Nobody is told: sinks keep their pending
            # transactions for the next checkpoint, and failover never goes
            # back to a savepoint (a later failure rolls back past it).
            return
        self.completed.append(CompletedCheckpoint(p.checkpoint_id, path, metadata,
                                                  savepoint=p.savepoint_dir is not None))
        self.completed_count += 1
        log.info("checkpoint %d completed in %.3f s (%d bytes)", p.checkpoint_id,
                 record.duration, record.size)
        # Step 2.
        for task in self.plan.all_tasks:
            self.send(self.plan.attempt, task, NotifyComplete(p.checkpoint_id))
        if ends:
            self.finished = True
            for task in self.plan.all_tasks:
                self.send(self.plan.attempt, task, Finish())
        # Step 3.
        if self.completed:
            self._retain()

    def _retain(self) -> None:
        """Drop what retention no longer keeps: decided here, deleted by
        :meth:`_delete` (in the background with ``background_cleanup``: a
        deletion is never on the path of the next checkpoint; one thread, so
        deletions stay in order)."""
        keep = checkpoints_to_discard([c.checkpoint_id for c in self.completed],
                                      self.config.retained)
        doomed = set(keep)
        savepoints = {c.checkpoint_id for c in self.completed if c.savepoint}
        self.completed = [c for c in self.completed if c.checkpoint_id not in doomed]
        latest = self.completed[-1].checkpoint_id
        referenced = referenced_shared(
            h.incremental for c in self.completed for _, h in c.metadata.state_files())
        discard = sorted(doomed - savepoints)  # a savepoint is the user's: never deleted
        if self._cleaner is None:
            self._delete(discard, referenced, latest)
            return
        self._cleaner.submit(self._delete, discard, referenced, latest)

    def _delete(self, discard: list[int], referenced: set[str], latest: int) -> None:
        """Delete the checkpoints ``discard``, then the shared files of
        incremental checkpoints that no retained ``_metadata`` names any more
        (``referenced``; their checkpoints' ``_metadata`` went first), then
        the folders of failed checkpoints older than ``latest``, the newest
        completed one. Never raises: what is left behind the next call (or
        the job's end) deletes."""
        try:
            for n in discard:
                self._discard(n)
            delete_unreferenced(self.job_dir, referenced, latest)
            try:
                folders = storage.checkpoint_folders(self.job_dir)
            except OSError as e:
                log.warning("cannot list %s to clean up failed checkpoints: %s",
                            fs.redact(self.job_dir), e)
                return
            for n, completed in folders.items():
                if not completed and n < latest:
                    self._discard(n)
        except Exception:
            log.exception("deleting checkpoints retention dropped failed (left behind)")

    def _discard(self, n: int) -> None:
        """Delete checkpoint ``n``; a failure (a flaky store, something else
        in the way) leaves it behind with a warning and never fails the job."""
        chk = storage.checkpoint_dir(self.job_dir, n)
        try:
            storage.discard(chk)
        except OSError as e:
            log.warning("could not delete %s (left behind): %s", fs.redact(chk), e)

    def _abort(self, reason: CheckpointAbortReason, detail: str | None = None,
               notify: bool = True) -> None:
        p = self.pending
        assert p is not None
        p.abort(reason)
        self.pending = None
        self.last_completion = self.clock()
        record = self._record(p.checkpoint_id)
        record.status = CheckpointStatus.FAILED
        record.failure = f"{reason.value}: {detail}" if detail else reason.value
        self.failed_count += 1
        # As Flink's CheckpointFailureManager: only periodic checkpoints that
        # expire, are declined or cannot be written count towards failing the
        # job; a failed savepoint fails the savepoint request, and nothing else.
        counts = p.savepoint_dir is None and reason in (CheckpointAbortReason.EXPIRED,
                                                        CheckpointAbortReason.DECLINED,
                                                        CheckpointAbortReason.WRITE_FAILED)
        if counts:
            # the user must see these: enough in a row fail the job
            log.warning("checkpoint %d failed (%d in a row, %d tolerated): %s", p.checkpoint_id,
                        self.consecutive_failures + 1, self.config.tolerable_failed_checkpoints,
                        record.failure)
        elif p.savepoint_dir is not None:
            log.warning("savepoint %d failed: %s", p.checkpoint_id, record.failure)
        else:
            log.info("checkpoint %d aborted: %s", p.checkpoint_id, record.failure)
        if p.savepoint_dir is not None:
            self.savepoint_results[p.checkpoint_id] = LockgateError(
                f"savepoint {p.checkpoint_id} failed: {record.failure}")
        elif p.stops:
            self.rescale_results[p.checkpoint_id] = LockgateError(
                f"checkpoint {p.checkpoint_id} failed: {record.failure}")
        if notify and self.plan is not None:
            for task in self.plan.all_tasks:
                self.send(self.plan.attempt, task, NotifyAborted(p.checkpoint_id))
        if counts:
            self.consecutive_failures += 1
            if self.consecutive_failures > self.config.tolerable_failed_checkpoints:
                raise CheckpointFailureError(
                    f"{self.consecutive_failures} checkpoints failed in a row (last: "
                    f"{record.failure}); tolerable_failed_checkpoints is "
                    f"{self.config.tolerable_failed_checkpoints}"
                )

    def _record(self, checkpoint_id: int) -> CheckpointRecord:
        for r in reversed(self.history):
            if r.checkpoint_id == checkpoint_id:
                return r
        raise KeyError(checkpoint_id)
