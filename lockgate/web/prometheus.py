"""``GET /metrics``: the served jobs' figures in Prometheus' text exposition
format (version 0.0.4), hand-written, from the same :meth:`JobControl.metrics`
the dashboard reads.

Names follow Flink's metrics where Flink has one (``numRecordsIn``,
``busyTimeMsPerSecond``, ``numberOfCompletedCheckpoints``...), prefixed
``lockgate_job_`` (one series per job) or ``lockgate_task_`` (one per task,
labelled with its vertex, chained operators and subtask index). Counts that
only grow (records, restarts, checkpoints) are counters, named with
Prometheus' ``_total`` suffix (``lockgate_job_numRecordsIn_total``); the rest
are gauges. docs/dashboard.md lists them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["CONTENT_TYPE", "COUNTERS", "JOB_METRICS", "TASK_METRICS", "exposed_name", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

JOB_METRICS: list[tuple[str, str, str]] = [
    # (name, help, how to read it from the overview)
    ("uptime", "Milliseconds since the job started.", "uptime_ms"),
    ("numRestarts", "Restarts of the job (failed attempts).", "restarts"),
    ("numRecordsIn", "Records the job's sources read (exact across restarts, as of the "
     "latest acknowledgement).", "records_read"),
    ("numRecordsOut", "Records the job's sinks wrote (as of the latest acknowledgement).",
     "records_written"),
    ("numberOfCompletedCheckpoints", "Checkpoints completed.", "completed"),
    ("numberOfFailedCheckpoints", "Checkpoints and savepoints that failed or were declined.",
     "failed"),
    ("numberOfInProgressCheckpoints", "Checkpoints in progress.", "in_progress"),
    ("lastCheckpointDuration", "End-to-end milliseconds of the latest completed checkpoint.",
     "last_duration_ms"),
    ("lastCheckpointSize", "Bytes of the latest completed checkpoint.", "last_size"),
    ("lastCheckpointAlignmentTime", "Milliseconds of barrier alignment of the latest "
     "completed checkpoint (the longest of its tasks).", "last_alignment_ms"),
    ("lastCheckpointSyncDuration", "Milliseconds of the longest synchronous snapshot part "
     "of the latest completed checkpoint.", "last_sync_ms"),
    ("lastCheckpointAgeSeconds", "Seconds since the latest checkpoint completed.",
     "last_age"),
    ("lastCompletedCheckpointId", "Id of the latest completed checkpoint.", "last_id"),
    ("numAutoscalerDecisions", "Parallelism changes the autoscaler decided (one per vertex "
     "rescaled; only with an autoscaler).", "autoscaler_decisions"),
    ("numLocalRecoveryRestores", "Keyed state restores after a failure that read the "
     "task's local copy (local recovery; only with it on).", "local_restores"),
    ("numLocalRecoveryFallbacks", "Keyed state restores after a failure that looked for a "
     "local copy and read the checkpoint storage instead (missing, or failed a check).",
     "local_fallbacks"),
]

TASK_METRICS: list[tuple[str, str, str]] = [
    ("numRecordsIn", "Records into the task's chain (this attempt).", "records_in"),
    ("numRecordsOut", "Records out of the task's chain, or written by its sinks "
     "(this attempt).", "records_out"),
    ("numRecordsInPerSecond", "Records in per second.", "records_in_per_second"),
    ("numRecordsOutPerSecond", "Records out per second.", "records_out_per_second"),
    ("busyTimeMsPerSecond", "Milliseconds per second the task thread worked.",
     "busy_ms_per_second"),
    ("backPressuredTimeMsPerSecond", "Milliseconds per second it was blocked sending "
     "downstream.", "backpressured_ms_per_second"),
    ("idleTimeMsPerSecond", "Milliseconds per second it waited for input.",
     "idle_ms_per_second"),
    ("inPoolUsage", "Fill of the task's input queues, 0 to 1.", "queue_fill"),
    ("currentInputWatermark", "The task's current watermark (ms since the epoch).",
     "watermark"),
    ("watermarkLag", "Milliseconds between the wall clock and the task's watermark.",
     "watermark_lag_ms"),
    ("stateKeys", "Keys in the task's keyed state (the largest state).", "state_keys"),
    ("checkpointedStateSize", "Bytes of the task's state in its latest acknowledged "
     "checkpoint.", "state_bytes"),
    ("pendingRecords", "Records the task's source could read now and has not (Kafka's "
     "consumer lag, JetStream's pending messages), where the source knows.", "backlog"),
]


COUNTERS = frozenset({"numRestarts", "numRecordsIn", "numRecordsOut",
                      "numberOfCompletedCheckpoints", "numberOfFailedCheckpoints",
                      "numAutoscalerDecisions", "numLocalRecoveryRestores",
                      "numLocalRecoveryFallbacks"})
"""Metrics (of jobs and tasks) that only grow: Prometheus counters. A task's
counts start again at zero with each attempt (a restart), which Prometheus'
``rate()`` and ``increase()`` take as a counter reset."""


def exposed_name(level: str, name: str) -> tuple[str, str]:
    """The exposed name of metric ``name`` of ``level`` (``job``, ``task``)
    and its type: ``lockgate_<level>_<name>``, with ``_total`` for a counter."""
    if name in COUNTERS:
        return f"lockgate_{level}_{name}_total", "counter"
    return f"lockgate_{level}_{name}", "gauge"


def _label(value: Any) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs.items()) + "}"


def _number(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "+Inf" if value > 0 else "-Inf" if value < 0 else "NaN"
    return repr(value) if isinstance(value, float) else str(value)


def _job_values(o: dict[str, Any]) -> dict[str, Any]:
    job, chk = o["job"], o["checkpoints"]
    last = chk.get("last") or {}
    autoscaler = o.get("autoscaler") or {}
    local = o.get("local_recovery") or {}

    def ms(v: Any) -> Any:
        return None if v is None else v * 1000.0

    return {
        "uptime_ms": ms(job.get("uptime")), "restarts": job.get("restarts"),
        "records_read": job.get("records_read"), "records_written": job.get("records_written"),
        "completed": chk.get("completed"), "failed": chk.get("failed"),
        "in_progress": chk.get("in_progress"),
        "last_duration_ms": ms(last.get("end_to_end")), "last_size": last.get("bytes"),
        "last_alignment_ms": ms(last.get("alignment")),
        "last_sync_ms": ms(last.get("sync_duration")), "last_age": chk.get("last_age"),
        "last_id": last.get("id"),
        "autoscaler_decisions": autoscaler.get("decision_count")
        if autoscaler.get("enabled") else None,
        "local_restores": local.get("local"), "local_fallbacks": local.get("storage"),
    }


def render(jobs: Iterable[tuple[str, str, dict[str, Any]]]) -> str:
    """The exposition of ``(job id, job name, overview)`` for every job."""
    jobs = list(jobs)
    lines: list[str] = []
    for name, help_text, key in JOB_METRICS:
        metric, kind = exposed_name("job", name)
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for job_id, job_name, o in jobs:
            value = _number(_job_values(o).get(key))
            if value is not None:
                labels = {"job_id": job_id, "job_name": job_name,
                          "status": o["job"].get("status", "")}
                lines.append(f"{metric}{_labels(labels)} {value}")
    for name, help_text, key in TASK_METRICS:
        metric, kind = exposed_name("task", name)
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for job_id, job_name, o in jobs:
            for vertex in o["vertices"]:
                for task in vertex["tasks"]:
                    value = _number(task.get(key))
                    if value is None:
                        continue
                    labels = {"job_id": job_id, "job_name": job_name,
                              "task_name": vertex["name"], "vertex": vertex["id"],
                              "subtask_index": task["subtask"]}
                    lines.append(f"{metric}{_labels(labels)} {value}")
    return "\n".join(lines) + "\n"
