"""The job master: runs a job's attempts (in the driver), composed of small
collaborators (docs/architecture.md, *The job master*).

One attempt = every task of the job, started by the launcher from the latest
completed checkpoint. Any task failure (exception, death, lost connection)
ends the attempt: all its tasks are killed before the next one starts, so no
zombie of an older attempt writes anything. Events from tasks
(:mod:`lockgate.cluster.events`) arrive on one queue and are handled one at a
time, with the requests from outside (:mod:`lockgate.cluster.commands`)
between them; the checkpoint coordinator is only ever called from this loop.
Why an attempt failed and how long to wait are pure decisions
(:mod:`lockgate.cluster.failures`), taken by its ``Restarts``
(:mod:`lockgate.cluster.restarts`); checking a job before it runs is
:mod:`lockgate.cluster.submission`.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from lockgate import fs
from lockgate.api.plan import OperatorKind
from lockgate.api.result import (
    Guarantee,
    JobResult,
    JobStatus,
)
from lockgate.checkpoint import metadata, storage
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.cluster import resume
from lockgate.cluster.attempt import AttemptTasks, TaskLayout
from lockgate.cluster.autoscaling import AutoscaleDriver
from lockgate.cluster.commands import Command, CommandKind, Commands
from lockgate.cluster.coordinator import (
    AttemptPlan,
    CheckpointCoordinator,
    CheckpointFailureError,
    CompletedCheckpoint,
)
from lockgate.cluster.events import TaskDisconnected, TaskEvent, TaskExited, TaskMessage
from lockgate.cluster.failures import (
    AttemptFailed,
    JobEnds,
    exit_text,
    failure_reason,
    reported_failure,
)
from lockgate.cluster.launcher import Launcher, end_job, make_launcher
from lockgate.cluster.metrics import JobMetrics, ProgressReports, history_entry, overview
from lockgate.cluster.options import RunOptions
from lockgate.cluster.provenance import other_job, sink_locations
from lockgate.cluster.rescale import available_slots, submit_rescale
from lockgate.cluster.restarts import EXIT_WAIT, ROOT_CAUSE_WAIT, Restarts
from lockgate.cluster.server import ControlServer
from lockgate.cluster.spark.naming import dashboard_of
from lockgate.cluster.specs import task_specs
from lockgate.cluster.startup import StartupLog
from lockgate.config import CheckpointingMode, FailureRateRestart, RestartStrategy
from lockgate.graph.jobgraph import JobGraph
from lockgate.graph.rescale import describe
from lockgate.protocol import (
    Ack,
    ControlMessage,
    Decline,
    Drain,
    Failed,
    Finished,
    InputEnded,
    Register,
    Running,
    Start,
    TaskMetrics,
    ToDriver,
)
from lockgate.state.factory import remove_local_copies
from lockgate.state.script_classes import script_classes
from lockgate.web.serving import attach as serve_rest
from lockgate.web.serving import resolve_rest

if TYPE_CHECKING:
    from lockgate.api.pipeline import Pipeline

log = logging.getLogger("lockgate.driver")

TICK = 0.02  # seconds between coordinator ticks
DEFAULT_RESTART = FailureRateRestart(max_failures_per_interval=10, interval_s=600.0)
"""A job without a restart strategy restarts at once, for ever, unless it
fails more than 10 times in 10 minutes (Flink's default for a checkpointed
job forgets old failures too): a broker's blip once a week never uses it up,
a crash loop (whose delays back off, ``failures.restart_delay``) fails the job."""


class JobMaster:
    """One job's attempts, its event loop and its collaborators: the tasks
    (``layout``, ``tasks``), ``coordinator``, ``commands``, ``restarts``,
    ``monitor``, ``progress``, ``startup`` and ``autoscaling``."""

    def __init__(self, pipeline: Pipeline, graph: JobGraph, options: RunOptions,
                 guarantee: Guarantee, started_from: CompletedCheckpoint | None = None) -> None:
        self.pipeline = pipeline
        self.graph = graph
        self.options = options
        self.guarantee = guarantee
        """The end-to-end guarantee the job's parts allow."""
        self.config = pipeline.checkpoint
        self.rest = resolve_rest(options.rest)
        self.job_id = options.job_id or f"{_slug(pipeline.name)}-{uuid.uuid4().hex[:8]}"
        self.job_dir = storage.prepare_job_dir(self.config.storage, self.job_id)
        self.secret = os.urandom(32)
        self.events: queue.Queue[TaskEvent] = queue.Queue()
        self._use_graph(graph)
        modes = {op.uid: OperatorStateMode(
            OperatorStateMode.UNION if op.kind == OperatorKind.SINK
            else getattr(op.fn, "operator_state_mode", OperatorStateMode.SPLIT))
            for op in graph.operators()}
        self.server = ControlServer(self.secret, self.job_id, self.events,
                                    host=options.bind_host, encrypt=self.config.encrypt_traffic)
        self.coordinator = CheckpointCoordinator(
            self.job_id, self.job_dir, self.config, graph.operator_parallelism(), modes,
            graph.max_parallelism, self._send, job_name=pipeline.name,
            locations=sink_locations(graph), background_cleanup=True)
        self.commands = Commands(self.job_id, self.coordinator, self.config.savepoint_dir,
                                 self._drain_sources)
        self.attempt = 0
        self._user_code = [(op.fn, op.key_selector, op.watermarks) for op in graph.operators()]
        """What the pipeline's user code is made of: the roots of its script's
        classes (sent to the tasks) and functions (tracebacks)."""
        self.script_classes = script_classes(*self._user_code)
        self._started_from = started_from
        """The checkpoint or savepoint the user started the job from."""
        restart: RestartStrategy = pipeline.restart or DEFAULT_RESTART
        self.restarts = Restarts(self.job_id, restart, self._task_name, self._user_code,
                                 other_job(started_from.metadata if started_from else None,
                                           pipeline.name))
        """Failures, the restart strategy's decisions, recovery times."""
        self.launcher: Launcher | None = None
        self.tasks = AttemptTasks(graph.num_tasks)
        """The tasks of the attempt running (or of the last one)."""
        self._started_wall = time.time()
        self.progress = ProgressReports(self.job_id)
        """``on_progress`` after completed checkpoints."""
        self.state = JobStatus.CREATED
        self.startup = StartupLog()
        """When each start-up step of each attempt happened (cold start, recoveries)."""
        self.monitor = JobMetrics(graph)
        """The figures of the dashboard and of ``/metrics`` (:meth:`metrics`)."""
        self.dashboard: tuple[str, str] | None = None
        """The dashboard's URL and the token it needs, while the job is served."""
        self.autoscaling: AutoscaleDriver | None = None
        """The autoscaler (``Pipeline(autoscale=...)``), or None."""
        if pipeline.autoscale is not None:
            self.autoscaling = AutoscaleDriver(
                pipeline.autoscale, graph, self.submit,
                lambda: available_slots(self.options.launcher))

    def _use_graph(self, graph: JobGraph) -> None:
        """Run the next attempts with ``graph`` (the first, or a rescale's)."""
        self.graph = graph
        self.layout = TaskLayout(graph)

    # --------------------------------------------------- control (any thread)
    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]:
        """Ask the running job for a ``savepoint`` (``dir``), a ``stop`` (``dir``,
        ``drain``), a ``rescale`` (``parallelism``, ``vertices``: uid -> N) or
        a ``cancel``; the future resolves when it is done (a stop or a cancel:
        when the job has ended; a rescale: when the tasks at the new
        parallelism run). A rescale is checked here, before anything happens
        (:func:`~lockgate.cluster.rescale.submit_rescale`)."""
        try:
            command = CommandKind(kind)
        except ValueError:
            raise ValueError(f"unknown command {kind!r}") from None
        if command == CommandKind.RESCALE:  # on a Spark cluster: once the slots are there
            return submit_rescale(self, args.get("parallelism"), args.get("vertices"),
                                  lambda rescale: self._hand_over(command, rescale))
        return self._hand_over(command, args)

    def _hand_over(self, command: CommandKind, args: dict[str, Any]) -> Future[dict[str, Any]]:
        return self.commands.submit(
            command, args, self.state in (JobStatus.CREATED, JobStatus.RUNNING), self.state)

    def status(self) -> dict[str, Any]:
        totals = self._totals()
        return {
            "job_id": self.job_id, "name": self.pipeline.name, "status": self.state.value,
            "attempt": self.attempt, "restarts": len(self.restarts.failures),
            "records_read": totals.read, "records_written": totals.written,
            "started_at": self._started_wall, "launcher": self.options.launcher,
            "parallelism": max(v.parallelism for v in self.graph.vertices),
            "vertex_parallelism": describe(self.graph), "guarantee": self.guarantee,
        }

    def checkpoint_history(self) -> list[dict[str, Any]]:
        return [history_entry(r) for r in list(self.coordinator.history)]

    def metrics(self) -> dict[str, Any]:
        """The dashboard's and ``/metrics``' figures (``GET /jobs/<id>/metrics``)."""
        return overview(self)

    def autoscaler(self) -> dict[str, Any]:
        """The autoscaler's settings, state, evaluations and decisions
        (``GET /jobs/<id>/autoscaler``); ``{"enabled": False}`` without one."""
        if self.autoscaling is None:
            return {"enabled": False}
        return self.autoscaling.snapshot()

    # ------------------------------------------------------------------ run
    def run(self) -> JobResult:
        started = time.monotonic()
        self.progress.start()
        self.state = JobStatus.RUNNING
        status = JobStatus.FINISHED
        if self._started_from is not None:  # loaded and checked by prepare_job
            self.coordinator.restored_from(self._started_from)
        log.info("job %s starts: %d tasks, guarantee %s, checkpoints in %s",
                 self.job_id, self.graph.num_tasks, self.guarantee, fs.redact(self.job_dir))
        served = serve_rest(self, self.rest)  # never raises
        self.dashboard = dashboard_of(self.job_id, self.pipeline.name, served and served.server)
        error: BaseException | None = None
        try:
            for op in self.graph.operators():  # once per job, never per attempt
                if op.kind == OperatorKind.SOURCE:
                    op.fn.prepare(str(self.job_dir), op.uid)
            status = self._run_attempts()
            self._end_attempt(failed=False)
            self.commands.drained()
            self._mark_committed()
            self.state = status
        except BaseException as e:
            self.state = status = JobStatus.FAILED
            error = e
            raise
        finally:
            if self.launcher is not None:  # the job failed in an attempt
                self.launcher.stop()
                self.launcher = None
            end_job(self.options.launcher, self.job_id)
            remove_local_copies(self.pipeline.state_backend, self.job_id)  # local recovery's
            self.coordinator.close()  # retention's deletions, before the folder is tidied
            self._leave_job_dir()
            self.server.close()
            self.commands.job_ended(status, error)
            if served is not None:
                served.detach()
        latest, totals = self.coordinator.latest, self._totals()
        return JobResult(
            job_id=self.job_id, status=status, guarantee=self.guarantee,
            savepoint=self.commands.savepoint_path,
            restarts=len(self.restarts.failures), failures=list(self.restarts.failures),
            checkpoints=list(self.coordinator.history),
            latest_checkpoint=str(latest.path) if latest else None,
            records_in=totals.read,
            records_out=totals.written,
            duration=time.monotonic() - started,
            recovery_times=list(self.restarts.recovery_times),
            local_restores=list(self.monitor.local_restores),
        )

    def _leave_job_dir(self) -> None:
        """The job ended (no task runs): checkpoints that never completed are
        deleted, and a stop's savepoint is recorded for the next run of the
        job to resume from (:mod:`lockgate.cluster.resume`)."""
        resume.drop_incomplete(str(self.job_dir))
        latest = self.coordinator.latest
        if self.commands.savepoint_path and latest is not None and latest.savepoint:
            resume.record_stop(str(self.job_dir), str(latest.path), latest.checkpoint_id)

    def _run_attempts(self) -> JobStatus:
        """Run attempts until one ends the job; returns how it ended."""
        while True:
            try:
                self._run_attempt()
                rescale = self.commands.rescaled()
                if rescale is not None:
                    self._end_attempt(failed=False)
                    self._rescale_to(rescale)
                    continue
                return JobStatus.STOPPED if self.commands.attempt_ended() else JobStatus.FINISHED
            except JobEnds as e:
                return JobStatus(e.status)
            except (AttemptFailed, CheckpointFailureError) as e:
                self.startup.mark("failed")
                if isinstance(e, AttemptFailed):
                    window = _EventWindow(self.events, self.attempt,
                                          EXIT_WAIT if e.exit_pending else ROOT_CAUSE_WAIT)
                    e = self.restarts.root_cause(e, window, self.tasks.finished,
                                                 functools.partial(window.extend, EXIT_WAIT),
                                                 self.tasks.exit_codes)
                self.startup.mark("cause")
                self.restarts.detected()
                self._end_attempt(failed=True)
                self.startup.mark("stopped")
                rescale = self.commands.attempt_failed()
                self._restart_after(e)
                if rescale is not None:
                    self._rescale_to(rescale, next_attempt=False)

    # ------------------------------------------------------------ attempts
    def _run_attempt(self) -> None:
        self.tasks = tasks = AttemptTasks(self.graph.num_tasks)
        self.monitor.start_attempt()
        if self.autoscaling is not None:
            self.autoscaling.start_attempt()
        self.launcher = make_launcher(self.options.launcher, self.events)
        latest = self.coordinator.latest
        specs = task_specs(
            self.graph, self.job_id, self.job_dir, self.attempt, self.pipeline,
            aligned=self.config.mode == CheckpointingMode.EXACTLY_ONCE, restore=latest,
            continues_final=latest is not None and latest is self._started_from,
            script_classes=self.script_classes, faults=self.options.fault_injection or [])
        self.startup.begin(self.attempt)
        self.launcher.start(specs, self.server.address, self.secret)
        start_deadline = time.monotonic() + self.options.start_timeout
        running = False
        while not tasks.all_finished:
            try:
                event: TaskEvent | None = self.events.get(timeout=self._tick_wait(running))
            except queue.Empty:
                event = None
            if event is not None and event.attempt == self.attempt:
                self._on_event(event)
                if not running and tasks.all_registered:
                    self._start_tasks()
                    running = True
            if not running and time.monotonic() > start_deadline:
                raise self._stalled()
            if running:
                # Commands first: a savepoint waiting for the pending
                # checkpoint must start before the next periodic one, or a
                # job whose checkpoints take longer than their interval
                # would never take it (and never stop).
                self.commands.serve()
                self.coordinator.tick()
                if self.autoscaling is not None:
                    self.autoscaling.tick(self.commands.busy())
            else:
                self.commands.serve_cancel()
            self.progress.update(self.coordinator, self._totals, len(self.restarts.failures),
                                 self.options.on_progress)

    def _tick_wait(self, running: bool) -> float:
        """Seconds to wait for the next event: a tick, or less when the next
        periodic checkpoint is due sooner."""
        due = self.coordinator.next_trigger_in() if running else None
        return TICK if due is None else min(TICK, max(due, 0.001))

    def _on_event(self, event: TaskEvent) -> None:
        match event:
            case TaskMessage(task=task, message=message):
                self._on_message(task, message)
            case TaskExited(task=task) | TaskDisconnected(task=task) if task in self.tasks.finished:
                pass
            case TaskExited(task=task, exit_code=code) if task in self.tasks.registered:
                # A connected task's messages all arrive before its
                # disconnection: judge it then, not at its exit.
                self.tasks.exit_codes[task] = code
            case TaskExited(task=task, exit_code=code):  # not connected, or not heard yet
                failure = self._gone(task, code)
                failure.early_exit = True  # its own report may still come
                raise failure
            case TaskDisconnected(task=task):
                code = self.tasks.exit_codes.get(task)
                failure = self._gone(task, code)
                failure.exit_pending = code is None  # how it ended may still come
                raise failure

    def _stalled(self) -> AttemptFailed:
        """The start-up watchdog: the attempt's tasks did not all register
        within ``start_timeout`` (a task or a host that never came up). The
        launcher drops what the attempt ran on (Spark: its stage)."""
        missing = self.tasks.missing()
        names = ", ".join(self._task_name(t) for t in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        assert self.launcher is not None
        self.launcher.stalled()
        return AttemptFailed(
            f"attempt {self.attempt} did not start: {len(missing)} of {self.graph.num_tasks} "
            f"task(s) not registered {self.options.start_timeout:g} s after the launch "
            f"({names}{more}); start_timeout sets the limit", missing[0])

    def _gone(self, task: int, exit_code: int | None) -> AttemptFailed:
        what = ("lost its connection to the coordinator" if exit_code is None
                else exit_text(exit_code))
        return AttemptFailed(f"task {self._task_name(task)} {what}", task)

    def _on_message(self, task: int, msg: ToDriver) -> None:
        match msg:
            case Register(host, port):
                self.tasks.registered[task] = (host, port)
            case Running(steps, local_restores):
                self.monitor.on_local_restores(self.attempt, task, local_restores,
                                               self._task_name(task))
                self.tasks.running.add(task)
                everyone = self.tasks.all_running
                self.startup.task_running(task, steps, everyone,
                                          getattr(self.launcher, "steps", None))
                if everyone:
                    self._all_running()
            case Ack():
                self.tasks.count(task, msg.read, msg.written)
                self.coordinator.on_ack(task, msg.checkpoint_id, msg.handles,
                                        (msg.read, msg.written), msg.finished, msg.alignment,
                                        msg.sync_duration, msg.async_duration)
                self.monitor.on_state_bytes(task, sum(h.size for h in msg.handles.values() if h))
            case TaskMetrics():
                self.monitor.on_task_metrics(task, msg)
                if self.autoscaling is not None:
                    self.autoscaling.on_metrics(task, msg)
            case Decline(checkpoint_id, reason, error_type):
                failure = AttemptFailed(f"task {self._task_name(task)} cannot checkpoint: "
                                        f"{reason}", task, error_type)
                if failure.fatal:
                    raise failure
                self.coordinator.on_decline(task, checkpoint_id, reason)
            case InputEnded(read, written):
                self.tasks.count(task, read, written)
                self.coordinator.on_end_of_data(task)
                if self.autoscaling is not None and task in self.layout.source_tasks:
                    self.autoscaling.input_ended()
            case Finished(read, written):
                self.tasks.count(task, read, written)
                self.tasks.finished.add(task)
            case Failed():
                failure = reported_failure(task, msg, self._task_name(task))
                self.restarts.log_report(failure)
                raise failure

    def _rescale_to(self, cmd: Command, next_attempt: bool = True) -> None:
        """The rescale's checkpoint completed and its tasks committed and
        ended (or the attempt failed during the rescale): the next attempt
        runs at the new parallelism, from the latest completed checkpoint."""
        graph: JobGraph = cmd.args["graph"]
        before = describe(self.graph)
        latest = self.coordinator.latest
        if next_attempt and latest is not None:
            latest.sinks_committed = True  # every task committed, then ended
        self._use_graph(graph)
        self.coordinator.rescaled(graph.operator_parallelism())
        self.monitor.use_graph(graph)
        if self.autoscaling is not None:
            self.autoscaling.use_graph(graph)
        if next_attempt:
            self.attempt += 1
        log.info("job %s rescales from %s to %s (attempt %d, from %s)", self.job_id, before,
                 describe(graph), self.attempt,
                 fs.redact(latest.path) if latest else "the beginning")

    def _all_running(self) -> None:
        """Every task of the attempt runs: a rescale that started it is done,
        the autoscaler watches the new tasks, a recovery is over."""
        if self.commands.rescaling is not None:
            latest = self.coordinator.latest
            self.commands.rescale_ran({
                "parallelism": max(v.parallelism for v in self.graph.vertices),
                "vertices": describe(self.graph), "attempt": self.attempt,
                "checkpoint_id": self.commands.rescale_checkpoint,
                "restored": latest.checkpoint_id if latest else None})
        if self.autoscaling is not None:
            self.autoscaling.running()
        self.restarts.all_running()

    def _start_tasks(self) -> None:
        self.startup.mark("registered")
        peers = dict(self.tasks.registered)
        for t in peers:
            self._send(self.attempt, t, Start(peers))
        self.coordinator.start_attempt(AttemptPlan(
            self.attempt, self.layout.source_tasks, sorted(peers), self.layout.task_operators))

    def _drain_sources(self) -> None:
        for t in self.layout.source_tasks:
            self._send(self.attempt, t, Drain())

    def _mark_committed(self) -> None:
        """A stop or a drain ended after every task committed: say so in the
        savepoint, so that a job resumed from it sends nothing again."""
        latest = self.coordinator.latest
        path = self.commands.savepoint_path
        if path is None or latest is None or not latest.savepoint or latest.path != path:
            return
        try:
            storage.mark_committed(path, latest.checkpoint_id)
        except OSError as e:  # the savepoint is whole; a resumed job sends again (ids dedup)
            log.warning("could not mark savepoint %s as committed: %s", fs.redact(path), e)

    def _totals(self) -> metadata.Progress:
        """Records read and written since the job started."""
        return self.tasks.totals(self.coordinator.baseline)

    def _restart_after(self, e: Exception) -> None:
        """Fail the job, or wait for the restart strategy and count the attempt."""
        reason = failure_reason(e)
        self.monitor.on_restart(self.attempt, reason, getattr(e, "task", None), self._task_name)
        latest = self.coordinator.latest
        delay = self.restarts.restart_delay(e, reason, self.attempt,
                                            self.coordinator.completed_count,
                                            latest.path if latest else None)
        time.sleep(delay)
        self.attempt += 1

    def _end_attempt(self, failed: bool) -> None:
        """Kill what is left of the attempt; its checkpoint in flight (if
        any) ends for a task's failure only if one ``failed``."""
        if failed:
            self.coordinator.on_attempt_failed()
        else:
            self.coordinator.on_attempt_ended()
        if self.launcher is not None:
            self.launcher.stop()
            self.launcher = None
        self.server.drop_attempt(self.attempt)

    def _send(self, attempt: int, task: int, message: ControlMessage) -> None:
        self.server.send(attempt, task, message)

    def _task_name(self, task: int) -> str:
        return self.layout.name(task)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name).strip("-") or "job"


class _EventWindow:
    """An attempt's events as they come, until a deadline ``seconds`` away,
    which :meth:`extend` can push back."""

    def __init__(self, events: queue.Queue[TaskEvent], attempt: int, seconds: float) -> None:
        self._events = events
        self._attempt = attempt
        self._deadline = time.monotonic() + seconds

    def extend(self, seconds: float) -> None:
        """Wait at least ``seconds`` more from now."""
        self._deadline = max(self._deadline, time.monotonic() + seconds)

    def __iter__(self) -> Iterator[TaskEvent]:
        while (left := self._deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                return
            if event.attempt == self._attempt:
                yield event
