"""What a running job shows: :class:`JobMetrics`, the one source of the
dashboard (``/ui`` through ``GET /jobs/<id>/metrics``) and of the Prometheus
exposition (``/metrics``, :mod:`lockgate.web.prometheus`).

The job master feeds it from its own loop: each task's
:class:`~lockgate.protocol.TaskMetrics` (about once a second), the state bytes
of each task's acknowledgements, restarts with their cause, what local
recovery did at each restore. REST threads read
:meth:`JobMetrics.snapshot`, a JSON-ready copy taken under a lock. Rates
(records per second, busy/backpressured/idle milliseconds per second, Flink's
``busyTimeMsPerSecond``...) are the difference of a task's last two reports
over the time between them.

:class:`ProgressReports` calls ``RunOptions.on_progress`` after completed
checkpoints, from the same loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.api.plan import OperatorKind
from lockgate.api.result import LocalRestoreRecord, Progress
from lockgate.checkpoint import metadata
from lockgate.graph.jobgraph import JobGraph
from lockgate.protocol import TaskMetrics
from lockgate.state.backends import RocksDBStateBackend

if TYPE_CHECKING:
    from lockgate.api.pipeline import Pipeline
    from lockgate.checkpoint.history import CheckpointRecord
    from lockgate.cluster.coordinator import CheckpointCoordinator

__all__ = ["JobMetrics", "ProgressReports", "describe_graph", "history_entry", "overview",
           "size_hint"]

log = logging.getLogger("lockgate.driver")

MAX_RESTARTS_SHOWN = 100
"""Restarts kept for the dashboard (the count is exact beyond it)."""


@dataclass
class _Sample:
    at: float
    figures: TaskMetrics


@dataclass
class _TaskView:
    last: _Sample | None = None
    previous: _Sample | None = None
    state_bytes: int = 0


def describe_graph(graph: JobGraph) -> list[dict[str, Any]]:
    """The job's vertices (operators chained into tasks) and their edges."""
    offsets = graph.task_offsets()
    return [{
        "id": v.id, "name": v.name, "parallelism": v.parallelism,
        "first_task": offsets[v.id], "source": v.is_source,
        "operators": [{"uid": op.uid, "kind": str(op.kind)} for op in v.operators],
        "outputs": [{"to": e.downstream, "partitioning": str(e.partitioning), "tag": e.tag}
                    for e in v.outputs],
    } for v in graph.vertices]


def _rate(last: _Sample, previous: _Sample | None, field: str, scale: float = 1.0) -> float:
    if previous is None:
        return 0.0
    dt = last.at - previous.at
    if dt <= 0:
        return 0.0
    delta = float(getattr(last.figures, field)) - float(getattr(previous.figures, field))
    return max(0.0, delta * scale / dt)


class JobMetrics:
    """Every figure of one job the dashboard and ``/metrics`` show."""

    def __init__(self, graph: JobGraph, clock: Callable[[], float] = time.monotonic) -> None:
        self.graph = graph
        self.vertices = describe_graph(graph)
        self.clock = clock
        self._lock = threading.Lock()
        self._tasks: dict[int, _TaskView] = {}
        self.restarts: list[dict[str, Any]] = []
        self.restart_count = 0
        self.local_restores: list[LocalRestoreRecord] = []
        """What local recovery did at each restore of a keyed operator."""

    # ----------------------------------------------------- job master's loop
    def use_graph(self, graph: JobGraph) -> None:
        """The job was rescaled: its next attempts run ``graph``."""
        with self._lock:
            self.graph = graph
            self.vertices = describe_graph(graph)
            self._tasks = {}

    def start_attempt(self) -> None:
        """A new attempt: its tasks count from zero (as Flink's)."""
        with self._lock:
            self._tasks = {}

    def on_task_metrics(self, task: int, figures: TaskMetrics) -> None:
        with self._lock:
            view = self._tasks.setdefault(task, _TaskView())
            view.previous, view.last = view.last, _Sample(self.clock(), figures)

    def on_state_bytes(self, task: int, size: int) -> None:
        """The bytes of ``task``'s state in its latest acknowledged checkpoint."""
        with self._lock:
            self._tasks.setdefault(task, _TaskView()).state_bytes = size

    def on_restart(self, attempt: int, cause: str, task: int | None,
                   task_name: Callable[[int], str]) -> None:
        """Attempt ``attempt`` failed by ``cause``, in ``task`` (None: not a task's)."""
        operator = None if task is None else task_name(task)
        with self._lock:
            self.restart_count += 1
            self.restarts.append({"time": time.time(), "attempt": attempt, "cause": cause,
                                  "task": task, "operator": operator})
            del self.restarts[:-MAX_RESTARTS_SHOWN]

    def on_local_restores(self, attempt: int, task: int, reports: list[list[Any]],
                          name: str) -> None:
        """Record and log what ``task``'s (named ``name``) keyed operators did
        about their local copies as they restored (checked by the protocol)."""
        for uid, checkpoint_id, local, reason in reports:
            record = LocalRestoreRecord(attempt, task, uid, checkpoint_id, local, reason)
            self.local_restores.append(record)
            if local:
                log.info("task %s, operator %s: restored from local copy of checkpoint %d",
                         name, uid, checkpoint_id)
            else:  # a copy that failed a check is worth a look at the disk
                log.log(logging.INFO if reason == "none on this host" else logging.WARNING,
                        "task %s, operator %s: local copy of checkpoint %d unusable (%s): "
                        "downloading", name, uid, checkpoint_id, reason)

    # ------------------------------------------------------- any thread
    def snapshot(self) -> dict[str, Any]:
        """The vertices with their tasks' figures, the restarts: JSON-ready."""
        now = self.clock()
        wall_ms = time.time() * 1000
        with self._lock:
            tasks = {t: (v.last, v.previous, v.state_bytes) for t, v in self._tasks.items()}
            restarts = [dict(r) for r in self.restarts]
            restart_count = self.restart_count
        vertices = []
        for vertex in self.vertices:
            rows = []
            for i in range(vertex["parallelism"]):
                task = vertex["first_task"] + i
                last, previous, state_bytes = tasks.get(task, (None, None, 0))
                rows.append(_task_row(task, i, last, previous, state_bytes, now, wall_ms))
            vertices.append({**vertex, "tasks": rows, **_aggregate(rows)})
        return {"vertices": vertices, "restarts": restarts, "restart_count": restart_count}


def _task_row(task: int, index: int, last: _Sample | None, previous: _Sample | None,
              state_bytes: int, now: float, wall_ms: float) -> dict[str, Any]:
    row: dict[str, Any] = {"task": task, "subtask": index, "state_bytes": state_bytes,
                           "reported": last is not None}
    if last is None:
        return row
    f = last.figures
    row.update({
        "records_in": f.records_in, "records_out": f.records_out,
        "records_in_per_second": _rate(last, previous, "records_in"),
        "records_out_per_second": _rate(last, previous, "records_out"),
        "busy_ms_per_second": min(1000.0, _rate(last, previous, "busy", 1000.0)),
        "backpressured_ms_per_second": min(1000.0, _rate(last, previous, "backpressured",
                                                         1000.0)),
        "idle_ms_per_second": min(1000.0, _rate(last, previous, "idle", 1000.0)),
        "queue_fill": f.queue_fill, "watermark": f.watermark,
        "watermark_lag_ms": None if f.watermark is None else max(0.0, wall_ms - f.watermark),
        "state_keys": f.state_keys, "backlog": f.backlog, "age": now - last.at,
    })
    return row


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A vertex's figures from its tasks': sums of counts and rates, the mean
    share of time (the dashboard's colour), the smallest watermark."""
    reported = [r for r in rows if r["reported"]]
    n = len(reported) or 1
    marks = [r["watermark"] for r in reported]
    known = [m for m in marks if m is not None]

    def total(key: str) -> float:
        return sum(r.get(key) or 0 for r in reported)

    return {
        "records_in": int(total("records_in")), "records_out": int(total("records_out")),
        "records_in_per_second": total("records_in_per_second"),
        "records_out_per_second": total("records_out_per_second"),
        "busy_ms_per_second": total("busy_ms_per_second") / n,
        "backpressured_ms_per_second": total("backpressured_ms_per_second") / n,
        "idle_ms_per_second": total("idle_ms_per_second") / n,
        "queue_fill": max((r["queue_fill"] for r in reported), default=0.0),
        "watermark": min(known) if known and len(known) == len(marks) else None,
        "state_bytes": sum(r["state_bytes"] for r in rows),
        "state_keys": int(total("state_keys")),
    }


def history_entry(r: CheckpointRecord) -> dict[str, Any]:
    """One checkpoint of the history as the REST API, the CLI and the
    dashboard show it (the older keys kept: ``kind``, ``duration``, ``size``)."""
    return {
        "id": r.checkpoint_id, "kind": r.label, "trigger": r.label, "status": r.status,
        "trigger_time": r.trigger_time, "completed_time": r.completed_time,
        "duration": r.duration, "end_to_end": r.duration,
        "sync_duration": r.sync_duration, "async_duration": r.async_duration,
        "metadata_duration": r.metadata_duration,
        "size": r.size, "bytes": r.size, "in_flight": r.in_flight,
        "alignment": r.alignment, "failure": r.failure,
        "ack_times": {str(t): v for t, v in sorted(r.ack_times.items())},
        "alignments": {str(t): v for t, v in sorted(r.alignments.items())},
    }


class MonitoredJob(Protocol):
    """What the metrics overview reads of the job master."""

    @property
    def graph(self) -> JobGraph: ...

    @property
    def monitor(self) -> JobMetrics: ...

    @property
    def coordinator(self) -> CheckpointCoordinator: ...

    def status(self) -> dict[str, Any]: ...

    def checkpoint_history(self) -> list[dict[str, Any]]: ...

    def autoscaler(self) -> dict[str, Any]: ...

    @property
    def pipeline(self) -> Pipeline: ...


def overview(master: MonitoredJob) -> dict[str, Any]:
    """``GET /jobs/<id>/metrics``: the job, its vertices and tasks, its
    checkpoints in short, restarts, savepoints and the autoscaler's
    decisions — one read per poll."""
    status = master.status()
    live = master.monitor.snapshot()
    history = master.checkpoint_history()
    completed = [h for h in history if h["status"] == "completed"]
    last = completed[-1] if completed else None
    savepoints = []
    for h in history:
        if h["kind"] in ("savepoint", "final savepoint"):
            result = master.coordinator.savepoint_results.get(h["id"])
            savepoints.append({"id": h["id"], "status": h["status"], "time": h["trigger_time"],
                               "path": result if isinstance(result, str) else None,
                               "failure": h["failure"]})
    sources = [v for v in live["vertices"] if v["source"]]
    return {
        "job": {**status, "uptime": time.time() - status["started_at"],
                "records_in_per_second": sum(v["records_out_per_second"] for v in sources),
                "size_hint": size_hint(master.graph)},
        "vertices": live["vertices"],
        "checkpoints": {
            "completed": master.coordinator.completed_count,
            "failed": master.coordinator.failed_count,
            "in_progress": sum(1 for h in history if h["status"] == "in_progress"),
            "last": last,
            "last_age": time.time() - last["completed_time"]
            if last and last["completed_time"] else None,
        },
        "restarts": live["restarts"], "savepoints": savepoints,
        "autoscaler": master.autoscaler(),
        "local_recovery": local_recovery(master),
    }


def local_recovery(master: MonitoredJob) -> dict[str, int] | None:
    """Keyed state restores that read their task's local copy and those that
    read the checkpoint storage instead; None when the job keeps no copies
    (not RocksDB, or ``local_recovery=False``)."""
    backend = master.pipeline.state_backend
    if not (isinstance(backend, RocksDBStateBackend) and backend.keeps_local_copies):
        return None
    records = list(master.monitor.local_restores)
    local = sum(1 for r in records if r.local)
    return {"local": local, "storage": len(records) - local}


def size_hint(graph: JobGraph) -> int | None:
    """The records the job's sources will read in all, when every source
    knows (``Source.size_hint()``, e.g. a bounded sequence); else None."""
    total = 0
    for op in graph.operators():
        if op.kind != OperatorKind.SOURCE:
            continue
        hint = getattr(op.fn, "size_hint", None)
        size = hint() if callable(hint) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        total += size
    return total


class ProgressReports:
    """``RunOptions.on_progress``: called from the job master's loop when
    checkpoints completed since the last call, with the job's figures then."""

    def __init__(self, job_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id = job_id
        self.clock = clock
        self.reported = 0
        """The count of completed checkpoints at the last report."""
        self.started = clock()

    def start(self) -> None:
        """The job runs: elapsed time counts from now."""
        self.started = self.clock()

    def update(self, coordinator: CheckpointCoordinator, totals: Callable[[], metadata.Progress],
               restarts: int, call: Callable[[Progress], None] | None) -> None:
        """Report to ``call`` if checkpoints completed since the last report
        (``totals``: the job's records read and written so far; ``restarts``:
        its count)."""
        if coordinator.completed_count == self.reported:
            return
        self.reported = coordinator.completed_count
        if call is None:
            return
        latest = coordinator.latest
        record = next((r for r in reversed(coordinator.history)
                       if r.status == "completed"), None)
        counts = totals()
        call(Progress(
            job_id=self.job_id,
            records_read=counts.read,
            records_written=counts.written,
            checkpoints_completed=self.reported,
            last_checkpoint_id=(record.checkpoint_id if record  # a final savepoint too
                                else latest.checkpoint_id if latest else None),
            last_checkpoint_duration=record.duration if record else None,
            restarts=restarts,
            elapsed=self.clock() - self.started,
        ))
