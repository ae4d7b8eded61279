"""Savepoint, stop, rescale and cancel: requests from outside the job master's event
loop (the REST API, a ``JobClient``), served by the loop between its ticks so
that the coordinator stays single-threaded."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lockgate import fs
from lockgate.api.result import JobStatus
from lockgate.checkpoint import storage
from lockgate.cluster.coordinator import CheckpointCoordinator
from lockgate.cluster.failures import JobEnds
from lockgate.errors import ConfigurationError, LockgateError


class CommandKind(StrEnum):
    SAVEPOINT = "savepoint"
    STOP = "stop"
    RESCALE = "rescale"
    CANCEL = "cancel"


@dataclass
class Command:
    """A request: ``savepoint`` (``dir``), ``stop`` (``dir``, ``drain``),
    ``rescale`` (``graph``: the job graph at the new parallelism, checked) or
    ``cancel``."""

    kind: CommandKind
    args: dict[str, Any] = field(default_factory=dict)
    future: Future[dict[str, Any]] = field(default_factory=Future)


class Commands:
    """The queue of requests and the savepoints, stop and drain they started."""

    def __init__(self, job_id: str, coordinator: CheckpointCoordinator,
                 savepoint_dir: str | None, drain_sources: Callable[[], None]) -> None:
        self.job_id = job_id
        self.coordinator = coordinator
        self.savepoint_dir = savepoint_dir
        self.drain_sources = drain_sources
        """Sends :class:`~lockgate.protocol.Drain` to every source task of the attempt."""
        self.queue: queue.Queue[Command] = queue.Queue()
        self._deferred: list[Command] = []
        self._savepoint_waiters: dict[int, Future[dict[str, Any]]] = {}
        self._stop_id: int | None = None
        """The savepoint a stop without drain waits for."""
        self.drain: Command | None = None
        self.end_futures: list[tuple[Future[dict[str, Any]], dict[str, Any]]] = []
        """Answered when the job has ended (a stop's, a cancel's)."""
        self.savepoint_path: str | None = None
        """The savepoint the job stopped with."""
        self.stopped: tuple[Future[dict[str, Any]], dict[str, Any]] | None = None
        """A stop's savepoint completed: its request, answered when the tasks
        have committed and ended (:meth:`attempt_ended`)."""
        self.rescale: Command | None = None
        """The rescale in progress: its checkpoint is pending or completed
        (then the attempt's tasks commit and end; the next attempt runs at
        the new parallelism)."""
        self._rescale_id: int | None = None
        self.rescale_checkpoint: int | None = None
        """The id of the rescale's checkpoint, once completed."""
        self.rescaling: Command | None = None
        """A rescale whose attempt is starting: answered when its tasks all
        run (:meth:`rescale_ran`)."""

    def submit(self, kind: CommandKind, args: dict[str, Any], accepting: bool,
               status: str) -> Future[dict[str, Any]]:
        cmd = Command(kind, args)
        if not accepting:
            cmd.future.set_exception(LockgateError(f"job {self.job_id} is {status}"))
        else:
            self.queue.put(cmd)
        return cmd.future

    def pending(self) -> list[Command]:
        """Take every command not served yet."""
        cmds, self._deferred = self._deferred, []
        while True:
            try:
                cmds.append(self.queue.get_nowait())
            except queue.Empty:
                return cmds

    def serve(self) -> None:
        """Step 1. Resolve completed or failed savepoints (a stop's savepoint ends the job).
        Step 2. Start what was asked for: a savepoint waits for a pending checkpoint;
                a drain tells the sources to end their input, and the final
                checkpoint becomes the savepoint; a cancel ends the job now.
                A savepoint folder that is a file, or inside a checkpoint
                folder or a savepoint, is refused first
                (:func:`~lockgate.checkpoint.storage.savepoint_target_problem`)."""
        # Step 1.
        for n, future in list(self._savepoint_waiters.items()):
            res = self.coordinator.savepoint_results.get(n)
            if res is None:
                continue
            del self._savepoint_waiters[n]
            if isinstance(res, BaseException):
                if n == self._stop_id:
                    self._stop_id = None  # the job goes on
                    if self.coordinator.input_ended:  # aborted: the job finishes
                        res = LockgateError(self._finishing(CommandKind.STOP))
                future.set_exception(res)
            elif n == self._stop_id:
                # Synchronous, as Flink's: the coordinator told the tasks, their
                # sinks commit, then they end; the attempt ends with them.
                self.stopped = (future, {"checkpoint_id": n, "path": res})
            else:
                future.set_result({"checkpoint_id": n, "path": res})
        if self._rescale_id is not None:
            res = self.coordinator.rescale_results.get(self._rescale_id)
            if isinstance(res, BaseException) and self.rescale is not None:
                # the tasks go on at the old parallelism
                self.rescale.future.set_exception(LockgateError(
                    self._finishing(CommandKind.RESCALE) if self.coordinator.input_ended
                    else f"the rescale did not happen: {res}; the job goes on at its "
                         "parallelism: ask again"))
                self.rescale = None
                self._rescale_id = None
            elif res is not None:
                self.rescale_checkpoint = self._rescale_id
                self._rescale_id = None
        # Step 2.
        for cmd in self.pending():
            if cmd.kind == CommandKind.CANCEL:
                self.end_futures.append((cmd.future, {"status": JobStatus.CANCELLED.value}))
                raise JobEnds(JobStatus.CANCELLED)
            if self._stop_id is not None or self.drain is not None:
                cmd.future.set_exception(LockgateError(f"job {self.job_id} is stopping"))
                continue
            if self.rescale is not None:
                cmd.future.set_exception(LockgateError(
                    f"job {self.job_id} is rescaling: ask again when the rescale is done"))
                continue
            if self.coordinator.finished or self.coordinator.input_ended:
                # Every source read to its end: the final checkpoint follows
                # (or completed: every task was told to end, its sinks
                # committed, and no task would take a barrier). A savepoint
                # now would hold a job with nothing left to read.
                cmd.future.set_exception(LockgateError(self._finishing(cmd.kind)))
                continue
            if cmd.kind == CommandKind.RESCALE:
                self._start_rescale(cmd)
                continue
            target = cmd.args.get("dir") or self.savepoint_dir
            if not target:
                cmd.future.set_exception(LockgateError(
                    "no savepoint folder: pass one (--dir D) or set "
                    "CheckpointConfig(savepoint_dir=...)"))
                continue
            target = fs.absolute(target)
            problem = storage.savepoint_target_problem(target, self.coordinator.job_dir)
            if problem is not None:  # refused before anything runs; the job goes on
                cmd.future.set_exception(ConfigurationError(problem))
                continue
            if cmd.kind == CommandKind.STOP and cmd.args.get("drain"):
                self.drain = cmd
                self.coordinator.final_checkpoint_is_savepoint(target)
                self.drain_sources()
                continue
            started = self.coordinator.trigger(savepoint_dir=target,
                                               stops=cmd.kind == CommandKind.STOP)
            if started is None:  # a checkpoint is in progress: after it
                self._deferred.append(cmd)
                continue
            self._savepoint_waiters[started] = cmd.future
            if cmd.kind == CommandKind.STOP:
                self._stop_id = started

    def _finishing(self, kind: CommandKind) -> str:
        """Why a request cannot be served by a job whose input ended."""
        what = {CommandKind.SAVEPOINT: "no savepoint is taken",
                CommandKind.STOP: "it is not stopped and no savepoint is taken",
                CommandKind.RESCALE: "it is not rescaled"}[kind]
        final = ("completed (all its output is committed)" if self.coordinator.finished
                 else "follows (it commits all its output)")
        return (f"job {self.job_id} is finishing: its input ended and its final checkpoint "
                f"{final}, so {what}; the job ends finished")

    def _start_rescale(self, cmd: Command) -> None:
        """A synchronous checkpoint in the job's folder (barrier kind ``stop``):
        on completion the sinks commit and the tasks end (:meth:`rescaled`)."""
        started = self.coordinator.trigger(stops=True)
        if started is None:  # a checkpoint is in progress: after it
            self._deferred.append(cmd)
            return
        self.rescale = cmd
        self._rescale_id = started
        self.rescale_checkpoint = None

    def busy(self) -> str | None:
        """Why the job cannot take a rescale now (one in progress, a stop, a
        drain), or None."""
        if self.rescale is not None:
            return "a rescale is in progress"
        if self._stop_id is not None or self.stopped is not None or self.drain is not None:
            return "the job is stopping"
        if any(c.kind == CommandKind.RESCALE for c in self._deferred):
            return "a rescale is waiting for a checkpoint"
        return None

    def rescaled(self) -> Command | None:
        """The attempt's tasks all ended: the rescale that ended them, if any
        (the next attempt runs at its parallelism)."""
        if self.rescale is None or self.rescale_checkpoint is None:
            return None
        cmd, self.rescale = self.rescale, None
        self.rescaling = cmd
        return cmd

    def rescale_ran(self, value: dict[str, Any]) -> None:
        """Every task of an attempt runs: the rescale that started it (if
        any) is done; its request gets ``value`` and the seconds it took."""
        cmd, self.rescaling = self.rescaling, None
        if cmd is None or cmd.future.done():
            return
        cmd.future.set_result({**value, "seconds": time.time() - cmd.args["requested"]})

    def drained(self) -> None:
        """The job ends after its tasks all ended: a drain's final checkpoint
        was its savepoint, answered with its folder (None if it failed)."""
        if self.drain is None:
            return
        final = [r for r in self.coordinator.savepoint_results.values() if isinstance(r, str)]
        self.savepoint_path = final[-1] if final else None
        self.end_futures.append((self.drain.future, {"path": self.savepoint_path}))

    def serve_cancel(self) -> None:
        """While an attempt starts (its tasks not all registered): a cancel
        ends the job now (Ctrl-C during a slow start); every other request
        waits for :meth:`serve`."""
        cmds = self.pending()
        cancel = next((c for c in cmds if c.kind == CommandKind.CANCEL), None)
        self._deferred = [c for c in cmds if c is not cancel]
        if cancel is not None:
            self.end_futures.append((cancel.future, {"status": JobStatus.CANCELLED.value}))
            raise JobEnds(JobStatus.CANCELLED)

    def attempt_ended(self) -> bool:
        """The attempt's tasks all ended: whether a stop ended them (then the
        job is stopped, with its savepoint)."""
        if self.stopped is None:
            return False
        future, value = self.stopped
        self.savepoint_path = value["path"]
        self.end_futures.append((future, value))
        return True

    def attempt_failed(self) -> Command | None:
        """A failed attempt aborts savepoints in progress, a drain, and a stop
        whose tasks had not all ended (its savepoint exists: the job restarts
        from it). A rescale in progress is returned: the next attempt runs at
        its parallelism, from the latest completed checkpoint (any checkpoint
        restores at any parallelism)."""
        if self.stopped is not None:
            future, value = self.stopped
            self.stopped = None
            future.set_exception(LockgateError(
                f"the job failed while it was stopping (after savepoint {value['path']} "
                "completed); it restarts from that savepoint: ask to stop again"))
        for n, future in list(self._savepoint_waiters.items()):
            res = self.coordinator.savepoint_results.get(n)
            future.set_exception(res if isinstance(res, BaseException) else LockgateError(
                f"savepoint {n} failed: the attempt failed; the job restarts, ask again"))
        self._savepoint_waiters.clear()
        self._stop_id = None
        self._rescale_id = None
        if self.drain is not None:
            self.drain.future.set_exception(LockgateError(
                "the job failed while it was draining; it restarts: ask to stop again"))
            self.drain = None
            self.coordinator.final_checkpoint_is_savepoint(None)
        cmd, self.rescale = self.rescale, None
        if cmd is not None:
            self.rescaling = cmd
        return cmd

    def job_ended(self, status: str, error: BaseException | None) -> None:
        """Answer everything still open: the end futures with their values, and
        every other request with why it cannot be done."""
        if error is not None:
            for cmd in self.pending():
                cmd.future.set_exception(LockgateError(f"the job failed: {error}"))
        for future, value in self.end_futures:
            future.set_result(value)
        for cmd in self.pending():  # asked for while the job was ending
            cmd.future.set_exception(LockgateError(f"job {self.job_id} has ended ({status})"))
        for future in self._savepoint_waiters.values():  # in flight when a cancel ended it
            if not future.done():
                future.set_exception(LockgateError(
                    f"job {self.job_id} ended ({status}) before the savepoint completed"))
        if self.rescale is not None and not self.rescale.future.done():
            self.rescale.future.set_exception(LockgateError(
                f"job {self.job_id} ended ({status}) before the rescale completed"))
        if self.rescaling is not None and not self.rescaling.future.done():
            self.rescaling.future.set_exception(LockgateError(
                f"job {self.job_id} ended ({status}) before the rescaled tasks ran"))
