"""The job master: runs a job's attempts and decides restarts (in the driver).

One attempt = every task of the job, started by the launcher from the latest
completed checkpoint. Any task failure (exception, death, lost connection)
ends the attempt: all its tasks are killed before the next one starts, so no
zombie of an older attempt writes anything. Events from tasks arrive on one
queue and are handled one at a time.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockgate import fs
from lockgate.checkpoint import storage
from lockgate.checkpoint.coordinator import (
    AttemptPlan,
    CheckpointCoordinator,
    CheckpointFailureError,
    CompletedCheckpoint,
)
from lockgate.cluster.result import JobResult, Progress, end_to_end_guarantee
from lockgate.cluster.server import ControlServer, Event
from lockgate.config import CheckpointingMode, FixedDelayRestart, RestartStrategy, RestConfig
from lockgate.errors import (
    CheckpointCorruptError,
    JobFailedError,
    LockgateError,
    PipelineDefinitionError,
)
from lockgate.graph.jobgraph import JobGraph, build_job_graph
from lockgate.runtime.script_classes import script_classes, script_traceback
from lockgate.runtime.task import TaskSpec
from lockgate.web.serving import attach as serve_rest
from lockgate.web.serving import resolve_rest

if TYPE_CHECKING:
    from lockgate.api.pipeline import Pipeline
    from lockgate.cluster.client import JobClient

log = logging.getLogger("lockgate.driver")

TICK = 0.02  # seconds between coordinator ticks
ROOT_CAUSE_WAIT = 1.0
"""Seconds a failure seen as a broken channel waits for the failure that broke it."""
DEFAULT_RESTART = FixedDelayRestart(max_attempts=10, delay_s=0.0)
REPEAT_BACKOFF = 0.5
"""Seconds before the restart after a task reported the same error twice in a
row (whatever the restart strategy's delay), doubling with every further
repeat up to ``REPEAT_BACKOFF_MAX``."""
REPEAT_BACKOFF_MAX = 5.0
FATAL_ERRORS = frozenset({
    # deterministic: a restart would fail the same way
    "CheckpointCorruptError", "StateSerializationError", "StateTypeError",
    "SavepointMismatchError",
    "PipelineDefinitionError", "ConfigurationError", "OutputLostError",
})
"""Errors that fail the job at once. Falling back to an older checkpoint is
not done on purpose: its two-phase-commit sinks may already have committed
newer output, which replaying would duplicate."""


class AttemptFailed(Exception):
    def __init__(self, reason: str, task: int | None = None, error_type: str | None = None,
                 reported: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.task = task
        self.error_type = error_type
        self.reported = reported
        """A task reported an exception (with its traceback): it may fail the
        same way after a restart, unlike a process that died."""
        self.where: str | None = None
        """Which input the failing user function was processing."""


class JobEnds(Exception):
    """The job ends on request (stop with a savepoint, cancel), not by failure."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@dataclass
class Command:
    """A request from outside the event loop (REST API, JobClient)."""

    kind: str  # savepoint | stop | cancel
    args: dict[str, Any] = field(default_factory=dict)
    future: Future[dict[str, Any]] = field(default_factory=Future)


@dataclass
class RunOptions:
    launcher: str = "spark"
    from_checkpoint: str | None = None
    allow_non_replayable: bool = False
    fault_injection: list[dict[str, Any]] | None = None
    job_id: str | None = None
    on_progress: Callable[[Progress], None] | None = None
    allow_non_restored_state: bool = False
    bind_host: str = "127.0.0.1"
    """The host the control server binds: tasks on other machines must reach it."""
    rest: RestConfig | None = None
    """The REST API serving this job (None: not served)."""


def make_launcher(name: str, events: queue.Queue[Event]) -> Any:
    if name == "local":
        from lockgate.cluster.local import LocalLauncher

        return LocalLauncher(events)
    if name == "spark":
        from lockgate.cluster.spark_launcher import SparkLauncher

        return SparkLauncher(events)
    raise PipelineDefinitionError(f"unknown launcher {name!r}; use 'local' or 'spark'")


class JobMaster:
    def __init__(self, pipeline: Pipeline, graph: JobGraph, options: RunOptions) -> None:
        self.pipeline = pipeline
        self.graph = graph
        self.options = options
        self.config = pipeline.checkpoint
        self.job_id = options.job_id or f"{_slug(pipeline.name)}-{uuid.uuid4().hex[:8]}"
        self.job_dir = storage.prepare_job_dir(self.config.storage, self.job_id)
        self.secret = os.urandom(32)
        self.events: queue.Queue[Event] = queue.Queue()
        self.restart: RestartStrategy = pipeline.restart or DEFAULT_RESTART
        self.offsets = graph.task_offsets()
        self.task_operators = {
            self.offsets[v.id] + i: (v.id, i, [op.uid for op in v.operators])
            for v in graph.vertices for i in range(v.parallelism)
        }
        modes = {op.uid: ("union" if op.kind == "sink"
                          else getattr(op.fn, "operator_state_mode", "split"))
                 for op in graph.operators()}
        self.server = ControlServer(self.secret, self.job_id, self.events,
                                    host=options.bind_host)
        self.coordinator = CheckpointCoordinator(
            self.job_id, self.job_dir, self.config, graph.operator_parallelism(), modes,
            graph.max_parallelism, self._send, job_name=pipeline.name,
            locations=sink_locations(graph))
        self.attempt = 0
        self._user_code = [(op.fn, op.key_selector, op.watermarks) for op in graph.operators()]
        """What the pipeline's user code is made of: the roots of its script's
        classes (sent to the tasks) and functions (tracebacks)."""
        self.script_classes = script_classes(*self._user_code)
        self.launcher: Any = None
        self.records: dict[str, dict[int, int]] = {"read": {}, "written": {}}
        self.failures: list[str] = []
        self._reported = 0
        self._started = time.monotonic()
        self._started_wall = time.time()
        self._running: set[int] = set()
        self._failed_at: float | None = None
        self._started_from: CompletedCheckpoint | None = None
        """The checkpoint or savepoint the user started the job from."""
        self._finished: set[int] = set()
        self.recovery_times: list[float] = []
        """Seconds from detecting a failure until every task of the next attempt runs."""
        self.commands: queue.Queue[Command] = queue.Queue()
        self.state = "created"
        self._deferred: list[Command] = []
        self._savepoint_waiters: dict[int, Future[dict[str, Any]]] = {}
        self._stop_id: int | None = None
        """The savepoint a stop without drain waits for."""
        self._drain: Command | None = None
        self._end_futures: list[tuple[Future[dict[str, Any]], dict[str, Any]]] = []
        self.savepoint_path: str | None = None

    # --------------------------------------------------- control (any thread)
    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]:
        """Ask the running job for a ``savepoint`` (``dir``), a ``stop`` (``dir``,
        ``drain``) or a ``cancel``; the future resolves when it is done (a
        stop or a cancel: when the job has ended)."""
        if kind not in ("savepoint", "stop", "cancel"):
            raise ValueError(f"unknown command {kind!r}")
        cmd = Command(kind, args)
        if self.state not in ("created", "running"):
            cmd.future.set_exception(LockgateError(f"job {self.job_id} is {self.state}"))
        else:
            self.commands.put(cmd)
        return cmd.future

    def status(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "name": self.pipeline.name, "status": self.state,
            "attempt": self.attempt, "restarts": len(self.failures),
            "records_read": self._total("read"), "records_written": self._total("written"),
            "started_at": self._started_wall, "launcher": self.options.launcher,
            "parallelism": self.pipeline.parallelism, "guarantee": self.guarantee,
        }

    def checkpoint_history(self) -> list[dict[str, Any]]:
        return [{
            "id": r.checkpoint_id, "kind": r.kind, "status": r.status,
            "trigger_time": r.trigger_time, "duration": r.duration, "size": r.size,
            "alignment": r.alignment, "failure": r.failure,
            "ack_times": {str(t): v for t, v in sorted(r.ack_times.items())},
            "alignments": {str(t): v for t, v in sorted(r.alignments.items())},
        } for r in list(self.coordinator.history)]

    # ------------------------------------------------------------------ api
    guarantee: str | None = None
    """The end-to-end guarantee the job's parts allow (set when it runs)."""

    def run(self, guarantee: str) -> JobResult:
        started = self._started = time.monotonic()
        self.state = "running"
        status = "finished"
        if self._started_from is not None:  # loaded and checked by prepare_job
            self.coordinator.restored_from(self._started_from)
        self.guarantee = guarantee
        log.info("job %s starts: %d tasks, guarantee %s, checkpoints in %s",
                 self.job_id, self.graph.num_tasks, guarantee, fs.redact(self.job_dir))
        served = serve_rest(self, self.options.rest)  # never raises
        try:
            for op in self.graph.operators():  # once per job, never per attempt
                if op.kind == "source":
                    op.fn.prepare(str(self.job_dir), op.uid)
            while True:
                try:
                    self._run_attempt()
                    break
                except JobEnds as e:
                    status = e.status
                    break
                except (AttemptFailed, CheckpointFailureError) as e:
                    if isinstance(e, AttemptFailed):
                        e = self._root_cause(e)
                    self._failed_at = time.monotonic()
                    self._end_attempt()
                    self._fail_commands_on_failure()
                    reason = e.reason if isinstance(e, AttemptFailed) else str(e)
                    self.failures.append(reason)
                    if isinstance(e, AttemptFailed) and e.error_type in FATAL_ERRORS:
                        raise JobFailedError(
                            f"job {self.job_id} failed: {reason}.{self._other_job()} "
                            "Restarting cannot help; nothing committed was lost"
                        ) from None
                    delay = self.restart.delay(len(self.failures))
                    repeats = _repeats(self.failures)
                    if delay is not None and repeats > 1 and isinstance(e, AttemptFailed) \
                            and e.reported:
                        # a user function failing the same way again is most
                        # likely deterministic: back off instead of spinning
                        delay = max(delay, min(REPEAT_BACKOFF_MAX, REPEAT_BACKOFF * 2 ** (
                            repeats - 2)))
                    if delay is None:
                        raise JobFailedError(
                            f"job {self.job_id} failed after {len(self.failures)} failure(s) "
                            f"({len(self.failures) - 1} restarts); "
                            f"last: {reason}"
                        ) from None
                    if repeats > 1:  # the traceback and the input were printed already
                        log.warning("attempt %d failed the same way again (%d in a row): %s; "
                                    "restart %d of at most %s in %.2f s", self.attempt, repeats,
                                    reason, len(self.failures),
                                    getattr(self.restart, "max_attempts", "?"), delay)
                    else:
                        log.warning("attempt %d failed (%s); restarting in %.2f s from %s",
                                    self.attempt, reason, delay,
                                    fs.redact(self.coordinator.latest.path)
                                    if self.coordinator.latest else "the beginning")
                    time.sleep(delay)
                    self.attempt += 1
            self._end_attempt()
            if self._drain is not None:  # the final checkpoint was the savepoint
                final = [r for r in self.coordinator.savepoint_results.values()
                         if isinstance(r, str)]
                self.savepoint_path = final[-1] if final else None
                self._end_futures.append((self._drain.future, {"path": self.savepoint_path}))
            self.state = status
        except BaseException as e:
            self.state = "failed"
            for cmd in self._pending_commands():
                cmd.future.set_exception(LockgateError(f"the job failed: {e}"))
            raise
        finally:
            self.server.close()
            for future, value in self._end_futures:
                future.set_result(value)
            if served is not None:
                served.detach()
        latest = self.coordinator.latest
        for cmd in self._pending_commands():  # asked for while the job was ending
            cmd.future.set_exception(LockgateError(f"job {self.job_id} has ended ({status})"))
        for future in self._savepoint_waiters.values():  # in flight when a cancel ended it
            if not future.done():
                future.set_exception(LockgateError(
                    f"job {self.job_id} ended ({status}) before the savepoint completed"))
        return JobResult(
            job_id=self.job_id, status=status, guarantee=guarantee, savepoint=self.savepoint_path,
            restarts=len(self.failures), failures=list(self.failures),
            checkpoints=list(self.coordinator.history),
            latest_checkpoint=str(latest.path) if latest else None,
            records_in=self._total("read"),
            records_out=self._total("written"),
            duration=time.monotonic() - started,
            recovery_times=list(self.recovery_times),
        )

    # ------------------------------------------------------------ attempts
    def _specs(self) -> list[TaskSpec]:
        latest = self.coordinator.latest
        specs = []
        for v in self.graph.vertices:
            for i in range(v.parallelism):
                inputs = [
                    [self.offsets[e.upstream] + i] if e.partitioning == "forward"
                    else [self.offsets[e.upstream] + j for j in range(e.upstream_parallelism)]
                    for e in v.inputs
                ]
                outputs = [[self.offsets[e.downstream] + j for j in range(e.downstream_parallelism)]
                           for e in v.outputs]
                specs.append(TaskSpec(
                    job_id=self.job_id, task_id=self.offsets[v.id] + i, vertex=v, task_index=i,
                    max_parallelism=self.graph.max_parallelism, attempt=self.attempt,
                    aligned=self.config.mode == CheckpointingMode.EXACTLY_ONCE,
                    job_dir=str(self.job_dir), inputs=inputs, outputs=outputs,
                    restore_dir=str(latest.path) if latest else None,
                    restore_metadata=latest.metadata if latest else None,
                    continues_final=latest is not None and latest is self._started_from,
                    allow_pickle=self.pipeline.allow_pickle,
                    script_classes=self.script_classes,
                    batch_size=self.pipeline.batch_size,
                    faults=list(self.options.fault_injection or []),
                ))
        return specs

    def _run_attempt(self) -> None:
        n = self.graph.num_tasks
        self.records = {"read": {}, "written": {}}
        self._running = set()
        self.launcher = make_launcher(self.options.launcher, self.events)
        self.launcher.start(self._specs(), self.server.address, self.secret)
        registered: dict[int, list[Any]] = {}
        finished: set[int] = set()
        self._finished = finished
        self.exit_codes: dict[int, int | None] = {}
        running = False
        while len(finished) < n:
            try:
                ev = self.events.get(timeout=TICK)
            except queue.Empty:
                ev = None
            if ev is not None and ev.attempt == self.attempt:
                if ev.kind == "message":
                    assert ev.message is not None
                    self._on_message(ev.task, ev.message, registered, finished)
                    if not running and len(registered) == n:
                        self._start_tasks(registered)
                        running = True
                elif ev.task not in finished:
                    # A connected task's messages all arrive before its
                    # "disconnected" event: judge it then, not at its exit.
                    if ev.kind == "exited" and ev.task in registered:
                        self.exit_codes[ev.task] = ev.exit_code
                        continue
                    code = self.exit_codes.get(ev.task, ev.exit_code)
                    what = ("lost its connection to the coordinator" if code is None
                            else f"exited with code {code}")
                    raise AttemptFailed(f"task {self._task_name(ev.task)} {what}", ev.task)
            if running:
                # Commands first: a savepoint waiting for the pending
                # checkpoint must start before the next periodic one, or a
                # job whose checkpoints take longer than their interval
                # would never take it (and never stop).
                self._serve_commands()
                self.coordinator.tick()
            if self.coordinator.completed_count != self._reported:
                self._report_progress()

    def _other_job(self) -> str:
        return other_job(self._started_from.metadata if self._started_from else {},
                         self.pipeline.name)

    def _root_cause(self, failure: AttemptFailed) -> AttemptFailed:
        """A task that lost a channel most often only saw a peer die: the peer's
        own report (a user function's exception, ...) may be on its way through
        another connection. Wait for it a moment, and name it if it comes."""
        if failure.error_type != "ConnectionError":
            return failure
        reported = {failure.task}  # tasks that said why they failed: not silent deaths
        deadline = time.monotonic() + ROOT_CAUSE_WAIT
        while (left := deadline - time.monotonic()) > 0:
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                break
            if ev.attempt != self.attempt:
                continue
            msg = ev.message
            if ev.kind == "message" and msg is not None:
                if msg.get("t") != "failed":
                    continue
                reported.add(ev.task)
                if msg.get("error_type") != "ConnectionError":
                    try:
                        self._on_message(ev.task, msg, {}, set())
                    except AttemptFailed as cause:
                        return cause
            elif ev.kind == "disconnected" and ev.task not in self._finished | reported:
                # a task's report would have come before its disconnection: it died
                return AttemptFailed(
                    f"task {self._task_name(ev.task)} lost its connection to the coordinator "
                    f"(and {failure.reason})", ev.task)
        return failure

    # ------------------------------------------------- commands (event loop)
    def _pending_commands(self) -> list[Command]:
        cmds, self._deferred = self._deferred, []
        while True:
            try:
                cmds.append(self.commands.get_nowait())
            except queue.Empty:
                return cmds

    def _serve_commands(self) -> None:
        """Step 1. Resolve completed or failed savepoints (a stop's savepoint ends the job).
        Step 2. Start what was asked for: a savepoint waits for a pending checkpoint;
                a drain tells the sources to end their input, and the final
                checkpoint becomes the savepoint; a cancel ends the job now."""
        # Step 1.
        for n, future in list(self._savepoint_waiters.items()):
            res = self.coordinator.savepoint_results.get(n)
            if res is None:
                continue
            del self._savepoint_waiters[n]
            if isinstance(res, BaseException):
                future.set_exception(res)
                if n == self._stop_id:
                    self._stop_id = None  # the job goes on
            elif n == self._stop_id:
                self.savepoint_path = res
                self._end_futures.append((future, {"checkpoint_id": n, "path": res}))
                raise JobEnds("stopped")
            else:
                future.set_result({"checkpoint_id": n, "path": res})
        # Step 2.
        for cmd in self._pending_commands():
            if cmd.kind == "cancel":
                self._end_futures.append((cmd.future, {"status": "cancelled"}))
                raise JobEnds("cancelled")
            if self._stop_id is not None or self._drain is not None:
                cmd.future.set_exception(LockgateError(f"job {self.job_id} is stopping"))
                continue
            target = cmd.args.get("dir") or self.config.savepoint_dir
            if not target:
                cmd.future.set_exception(LockgateError(
                    "no savepoint folder: pass one (--dir D) or set "
                    "CheckpointConfig(savepoint_dir=...)"))
                continue
            target = fs.absolute(target)
            if cmd.kind == "stop" and cmd.args.get("drain"):
                self._drain = cmd
                self.coordinator.final_checkpoint_is_savepoint(target)
                for v in self.graph.vertices:
                    if v.is_source:
                        for i in range(v.parallelism):
                            self._send(self.attempt, self.offsets[v.id] + i, {"t": "drain"})
                continue
            n = self.coordinator.trigger(savepoint_dir=target)
            if n is None:  # a checkpoint is in progress: after it
                self._deferred.append(cmd)
                continue
            self._savepoint_waiters[n] = cmd.future
            if cmd.kind == "stop":
                self._stop_id = n

    def _fail_commands_on_failure(self) -> None:
        """A failed attempt aborts savepoints in progress and a drain."""
        for n, future in list(self._savepoint_waiters.items()):
            res = self.coordinator.savepoint_results.get(n)
            future.set_exception(res if isinstance(res, BaseException) else LockgateError(
                f"savepoint {n} failed: the attempt failed; the job restarts, ask again"))
        self._savepoint_waiters.clear()
        self._stop_id = None
        if self._drain is not None:
            self._drain.future.set_exception(LockgateError(
                "the job failed while it was draining; it restarts: ask to stop again"))
            self._drain = None
            self.coordinator._final_savepoint_dir = None

    def _start_tasks(self, registered: dict[int, list[Any]]) -> None:
        peers = {str(t): addr for t, addr in registered.items()}
        for t in registered:
            self._send(self.attempt, t, {"t": "start", "peers": peers})
        sources = [self.offsets[v.id] + i for v in self.graph.vertices if v.is_source
                   for i in range(v.parallelism)]
        self.coordinator.start_attempt(AttemptPlan(
            self.attempt, sources, sorted(registered), self.task_operators))

    def _on_message(self, task: int, msg: dict[str, Any], registered: dict[int, list[Any]],
                    finished: set[int]) -> None:
        t = msg["t"]
        if t == "register":
            registered[task] = [msg["host"], msg["port"]]
        elif t == "running":
            self._running.add(task)
            if len(self._running) == self.graph.num_tasks and self._failed_at is not None:
                self.recovery_times.append(time.monotonic() - self._failed_at)
                self._failed_at = None
        elif t == "ack":
            self._count(task, msg)
            self.coordinator.on_ack(task, msg["cp"], msg["handles"],
                                    (msg.get("read", 0), msg.get("written", 0)),
                                    bool(msg.get("finished")), float(msg.get("alignment", 0.0)))
        elif t == "decline":
            if msg.get("error_type") in FATAL_ERRORS:
                raise AttemptFailed(f"task {self._task_name(task)} cannot checkpoint: "
                                    f"{msg['reason']}", task, msg["error_type"])
            self.coordinator.on_decline(task, msg["cp"], msg["reason"])
        elif t == "end_of_data":
            self._count(task, msg)
            self.coordinator.on_end_of_data(task)
        elif t == "finished":
            self._count(task, msg)
            finished.add(task)
        elif t == "failed":
            reason = f"task {self._task_name(task)} failed: {msg['error']}"
            where = msg.get("where")
            if msg.get("error_type") == "ConnectionError":  # most often a peer's death
                log.warning("task %s: %s", self._task_name(task), msg["error"])
            elif self.failures and self.failures[-1] == reason:
                # the same failure again: its traceback was printed already
                log.debug("task %s failed:\n%s", self._task_name(task), msg.get("traceback", ""))
            else:
                log.error("task %s failed%s:\n%s", self._task_name(task),
                          f" at {where}" if where else "",
                          script_traceback(str(msg.get("traceback", "")), *self._user_code))
            failed = AttemptFailed(reason, task, msg.get("error_type"),
                                   reported=msg.get("error_type") != "ConnectionError")
            failed.where = where
            raise failed

    def _report_progress(self) -> None:
        self._reported = self.coordinator.completed_count
        if self.options.on_progress is None:
            return
        latest = self.coordinator.latest
        record = next((r for r in reversed(self.coordinator.history)
                       if r.status == "completed"), None)
        self.options.on_progress(Progress(
            job_id=self.job_id,
            records_read=self._total("read"),
            records_written=self._total("written"),
            checkpoints_completed=self._reported,
            last_checkpoint_id=(record.checkpoint_id if record  # a final savepoint too
                                else latest.checkpoint_id if latest else None),
            last_checkpoint_duration=record.duration if record else None,
            restarts=len(self.failures),
            elapsed=time.monotonic() - self._started,
        ))

    def _total(self, what: str) -> int:
        """Records since the job started: the restored checkpoint's count plus
        what this attempt's tasks last reported."""
        base = self.coordinator.baseline[0 if what == "read" else 1]
        return base + sum(self.records[what].values())

    def _count(self, task: int, msg: dict[str, Any]) -> None:
        """Progress: records read by sources and written by sinks (this attempt;
        after a restart, counts restart from the restored positions)."""
        if "read" in msg:
            self.records["read"][task] = msg["read"]
            self.records["written"][task] = msg["written"]

    def _end_attempt(self) -> None:
        self.coordinator.on_attempt_failed()
        if self.launcher is not None:
            self.launcher.stop()
            self.launcher = None
        self.server.drop_attempt(self.attempt)

    def _send(self, attempt: int, task: int, message: dict[str, Any]) -> None:
        self.server.send(attempt, task, message)

    def _task_name(self, task: int) -> str:
        v, i, uids = self.task_operators[task]
        return f"{'->'.join(uids)}[{i}] (task {task})"


def _check_picklable(graph: JobGraph) -> None:
    """Every operator's functions travel to the tasks pickled (cloudpickle):
    one that cannot be is named with the reason and the fix, before the job
    starts, instead of a raw ``TypeError`` from deep in the launcher."""
    import cloudpickle

    for op in graph.operators():
        for what, obj in (("function", op.fn), ("key selector", op.key_selector),
                          ("watermark strategy", op.watermarks)):
            if obj is None:
                continue
            try:
                cloudpickle.dumps(obj)
            except Exception as e:  # noqa: BLE001 - any reason it cannot travel
                raise PipelineDefinitionError(
                    f"the {what} of operator {op.uid!r} cannot be sent to the tasks: "
                    f"{type(e).__name__}: {e}. It (or a global it uses) holds something that "
                    "cannot be pickled, such as a lock, a connection or an open file: create "
                    "that in open() (KeyedProcessFunction) or inside the function, not at "
                    "module level") from None


def _repeats(failures: list[str]) -> int:
    """How many times in a row the last failure happened."""
    n = 0
    for reason in reversed(failures):
        if reason != failures[-1]:
            break
        n += 1
    return n


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name).strip("-") or "job"


def sink_locations(graph: JobGraph) -> dict[str, str]:
    """Where each sink uid of the job writes (a path or URL, secrets masked),
    for the sinks that say (``path``)."""
    return {op.uid: fs.redact(op.fn.path) for op in graph.operators()
            if op.kind == "sink" and isinstance(getattr(op.fn, "path", None), str)}


def other_job(meta: dict[str, Any], job_name: str | None) -> str:
    """`` It is a savepoint of job 'sums' (sums-1a2b3c4d); this job is
    'totals'.`` when ``_metadata`` (``meta``) is another job's, else ``""``."""
    name = meta.get("job_name")
    if not isinstance(name, str) or not job_name or name == job_name:
        return ""
    return (f" It is a {meta.get('kind', 'checkpoint')} of job {name!r} ({meta.get('job_id')}); "
            f"this job is {job_name!r}.")


def check_sink_locations(meta: dict[str, Any], graph: JobGraph, chk: str,
                         job_name: str | None) -> None:
    """Say so when a sink writes elsewhere than the one that took the
    checkpoint (a folder moved with its files is fine; otherwise its
    pre-committed output is in the old one and the restore refuses, the sink's
    ``recover`` raising :class:`SavepointMismatchError`): name both
    locations, both jobs, and how to go on."""
    kind = meta.get("kind", "checkpoint")
    for uid, location in sink_locations(graph).items():
        op = meta["operators"].get(uid)
        old = op.get("location") if isinstance(op, dict) else None
        if not isinstance(old, str) or old == location:
            continue
        log.warning(
            "sink %r wrote to %s when %s %s was taken, and now writes to %s.%s Unless the "
            "folder was moved there with its files, the restore fails: give the sink its old "
            "location, or a new uid and allow_non_restored_state=True "
            "(--allow-non-restored-state) to start it afresh", uid, old, kind, fs.redact(chk),
            location, other_job(meta, job_name))


def load_checkpoint(path: str, graph: JobGraph,
                    allow_non_restored_state: bool = False,
                    job_name: str | None = None, kind: str = "checkpoint") -> CompletedCheckpoint:
    """Read a checkpoint or savepoint a job starts from and check it fits the job.

    State of an operator uid the job no longer has is refused, unless
    ``allow_non_restored_state`` (then it is dropped, with a warning).
    Operators the job added start empty."""
    chk = fs.absolute(path)
    meta = storage.read_metadata(chk, kind)
    storage.verify_files(chk, meta)
    check_sink_locations(meta, graph, chk, job_name)
    old_name = meta.get("job_name")
    if isinstance(old_name, str) and job_name is not None and old_name != job_name:
        log.info("job %r restores %s of job %r", job_name, fs.redact(chk), old_name)
    known = {op.uid for op in graph.operators()}
    unknown = sorted(set(meta["operators"]) - known)
    kind = meta.get("kind", "checkpoint")
    if unknown and not allow_non_restored_state:
        raise CheckpointCorruptError(
            f"{kind} {fs.redact(chk)} holds state of operator uid(s) {unknown} that the job "
            f"does not have (its uids: {sorted(known)}); give the operators their old uids, or "
            "drop that state with allow_non_restored_state=True (--allow-non-restored-state)"
        )
    if unknown:
        log.warning("dropping the state of operator uid(s) %s from %s: the job has no such "
                    "operator (allow_non_restored_state)", unknown, fs.redact(chk))
        meta = {**meta, "operators": {u: o for u, o in meta["operators"].items()
                                      if u not in unknown}}
    added = sorted(known - set(meta["operators"]))
    if added:
        log.info("operator uid(s) %s have no state in %s: they start empty", added,
                 fs.redact(chk))
    if meta["max_parallelism"] != graph.max_parallelism:
        raise CheckpointCorruptError(
            f"checkpoint {chk} was taken with max_parallelism {meta['max_parallelism']}, the "
            f"job has {graph.max_parallelism}; it fixes the key groups: use the same value"
        )
    return CompletedCheckpoint(int(meta["checkpoint_id"]), chk, meta)


def run_pipeline(pipeline: Pipeline, **kwargs: Any) -> JobResult:
    """Run a job to its end in this thread (``Pipeline.run``)."""
    master, guarantee = prepare_job(pipeline, **kwargs)
    return master.run(guarantee)


def start_pipeline(pipeline: Pipeline, **kwargs: Any) -> JobClient:
    """Start a job in a background thread of the driver (``Pipeline.start``)."""
    from lockgate.cluster.client import JobClient

    master, guarantee = prepare_job(pipeline, **kwargs)
    return JobClient(master, guarantee)


def prepare_job(pipeline: Pipeline, *, launcher: str = "spark",
                from_checkpoint: str | None = None, from_savepoint: str | None = None,
                allow_non_restored_state: bool = False, allow_non_replayable: bool = False,
                fault_injection: list[dict[str, Any]] | None = None,
                job_id: str | None = None,
                on_progress: Callable[[Progress], None] | None = None,
                spark: Any = None, master: str | None = None,
                rest: RestConfig | bool | None = None) -> tuple[JobMaster, str]:
    """Check a pipeline and make its job master (nothing runs yet)."""
    if from_checkpoint and from_savepoint:
        raise PipelineDefinitionError("give from_checkpoint or from_savepoint, not both")
    graph = build_job_graph(pipeline)
    sources = [op for op in graph.operators() if op.kind == "source"]
    sinks = [op for op in graph.operators() if op.kind == "sink"]
    mode = pipeline.checkpoint.mode
    for op in sources + sinks:
        op.fn.validate()
    _check_picklable(graph)
    not_replayable = [op.uid for op in sources if not op.fn.replayable]
    if not_replayable and mode == CheckpointingMode.EXACTLY_ONCE and not allow_non_replayable:
        raise PipelineDefinitionError(
            f"source(s) {not_replayable} cannot be replayed, so the job cannot be exactly-once: "
            "after a failure their records in flight would be lost. Use a replayable source, "
            "or run with allow_non_replayable=True to accept at-most-once for those records"
        )
    guarantee = end_to_end_guarantee(
        [op.fn.replayable for op in sources], [op.fn.exactly_once for op in sinks], mode)
    if guarantee != "exactly_once":
        log.warning("job %s runs with end-to-end guarantee %s", pipeline.name,
                    guarantee.replace("_", "-").upper())
    options = RunOptions(launcher, from_checkpoint or from_savepoint, allow_non_replayable,
                         fault_injection, job_id, on_progress)
    options.allow_non_restored_state = allow_non_restored_state
    options.rest = resolve_rest(rest)
    if launcher != "spark" and (spark is not None or master is not None):
        raise PipelineDefinitionError(
            f"a Spark session or master was given with launcher={launcher!r}; "
            "use launcher='spark' (the default) or drop them")
    started_from = None
    if options.from_checkpoint:  # refused here, before anything starts or is created
        started_from = load_checkpoint(
            options.from_checkpoint, graph, allow_non_restored_state, job_name=pipeline.name,
            kind="savepoint" if from_savepoint else "checkpoint")
    if launcher == "spark":  # a SparkContext that can run every task at once, before anything
        from lockgate.cluster.spark_session import prepare_spark

        options.bind_host = prepare_spark(spark, master, graph.num_tasks)
        if options.bind_host != "127.0.0.1":
            _warn_unshared_paths(pipeline, sources, sinks)
    master = JobMaster(pipeline, graph, options)
    master._started_from = started_from
    return master, guarantee


def _warn_unshared_paths(pipeline: Pipeline, sources: list[Any], sinks: list[Any]) -> None:
    """On a cluster, a plain local path is most often a mistake: each executor
    would see its own folder. ``file://`` says "a shared mount" explicitly."""
    paths = [("checkpoint storage", pipeline.checkpoint.storage if pipeline.checkpoint else None)]
    paths += [(f"{op.kind} {op.uid!r}", getattr(op.fn, "path", None)) for op in sources + sinks]
    for what, path in paths:
        if isinstance(path, str) and not fs.is_url(path):
            log.warning("%s is the plain local path %s, but the job runs on a Spark cluster: "
                        "every executor must reach the same folder. Use s3://, hdfs://, or "
                        "file://%s if it is a shared mount", what, path, fs.absolute(path))
