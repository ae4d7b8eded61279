"""The REST paths (Flink's, JSON everywhere) onto the served jobs::

    GET   /jobs                              {"jobs": [{"id", "name", "status", "guarantee"}]}
    GET   /jobs/<id>                         the job's status
    GET   /jobs/<id>/checkpoints             {"counts": {...}, "history": [...]}
    POST  /jobs/<id>/savepoints              {"target-directory": D|null} -> {"request-id"}
    GET   /jobs/<id>/savepoints/<request-id> {"status": {"id": "IN_PROGRESS"|"COMPLETED"},
                                              "operation": {"location"} | {"failure-cause"}}
    POST  /jobs/<id>/stop                    {"targetDirectory": D|null, "drain": bool}
                                             -> {"request-id"} (polled like a savepoint)
    PATCH /jobs/<id>?mode=cancel             202; the job ends
    PATCH /jobs/<id>                         {"parallelism": N|null, "vertices": {uid: N}}
                                             (or ?parallelism=N) -> {"request-id"}: a rescale,
                                             polled at /jobs/<id>/rescales/<request-id>
    GET   /jobs/<id>/metrics                 the dashboard's figures: job, vertices and
                                             tasks, checkpoints, restarts, savepoints
    GET   /jobs/<id>/vertices                {"vertices": [...]} (graph, tasks' figures)
    GET   /jobs/<id>/exceptions              {"restarts": [...]} (cause, failing operator)
    GET   /jobs/<id>/savepoints              {"savepoints": [...]} (taken by this job)
    GET   /jobs/<id>/autoscaler              {"enabled", "config", "state", "vertices": [...],
                                              "decisions": [{"time", "vertex", "from", "to",
                                              "why", "inputs", "status"}]}
    GET   /metrics                           every job's figures, Prometheus text format
    GET   /ui, /ui/<file>                    the dashboard (static; no token: it holds no
                                             data, its script sends the token)

Errors are :class:`RouteError` (answered as ``{"errors": [...]}``): 400 (bad
input), 404 (unknown job or path), 405, 409 (the job is not running). Reads
copy the job's state; actions are commands the job serves
(:meth:`JobControl.submit`); a route never waits for the job.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from lockgate.errors import ConfigurationError
from lockgate.web import prometheus
from lockgate.web.control import JobControl

__all__ = ["JobTable", "Raw", "RouteError", "ServedJob", "Trigger", "parse_json_object",
           "route"]


@dataclass(frozen=True)
class Raw:
    """An answer that is not JSON (the Prometheus exposition, a dashboard file)."""

    content_type: str
    data: bytes


class RouteError(Exception):
    """A request answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Trigger:
    """One savepoint or stop request, polled by its id."""

    kind: str
    future: Future[dict[str, Any]]
    delivered: threading.Event = field(default_factory=threading.Event)
    """A client fetched its final state."""


@dataclass
class ServedJob:
    master: JobControl
    triggers: dict[str, Trigger] = field(default_factory=dict)
    ended: bool = False


class JobTable:
    """The jobs a server serves, by id (shared by its worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, ServedJob] = {}

    def get(self, job_id: str) -> ServedJob | None:
        with self.lock:
            return self.jobs.get(job_id)

    def all(self) -> list[ServedJob]:
        with self.lock:
            return list(self.jobs.values())


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body: empty -> ``{}``, else a JSON object (400 otherwise)."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RouteError(400, f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RouteError(400, "the request body must be a JSON object")
    return body


def route(table: JobTable, method: str, target: str,
          body: Callable[[], dict[str, Any]]) -> tuple[int, Any]:
    """The status and JSON answer of ``method target``; ``body()`` reads the
    request's body (only routes that take one call it)."""
    parts = urlsplit(target)
    seg = [unquote(s) for s in parts.path.strip("/").split("/") if s]
    query = parse_qs(parts.query)
    if seg == ["metrics"]:
        _allow(method, "GET")
        return 200, Raw(prometheus.CONTENT_TYPE, prometheus.render(
            (j.master.job_id, j.master.pipeline.name, j.master.metrics())
            for j in table.all()).encode())
    if not seg or seg[0] != "jobs":
        raise RouteError(404, f"no such path {target!r}; the API starts at /jobs")
    if len(seg) == 1:
        _allow(method, "GET")
        return 200, {"jobs": [{"id": j.master.job_id, "name": j.master.pipeline.name,
                               "status": j.master.state,
                               "guarantee": j.master.guarantee} for j in table.all()]}
    job = table.get(seg[1])
    if job is None:
        with table.lock:
            known = sorted(table.jobs)
        raise RouteError(404, f"no job {seg[1]!r} in this driver (its jobs: "
                         f"{', '.join(known) or 'none'}); `lockgate list` shows running jobs")
    master = job.master
    tail = seg[2:]
    if not tail:
        if method == "PATCH" and "mode" not in query:
            return _rescale(table, job, query, body())
        if method == "PATCH":
            mode = query.get("mode", [""])[0]
            if mode != "cancel":
                raise RouteError(400, f"PATCH /jobs/<id> needs ?mode=cancel (or a rescale: "
                                 f"?parallelism=N), got mode={mode!r}")
            _raise_if_refused(master.submit("cancel"))
            return 202, {"status": "cancelling"}
        _allow(method, "GET", "PATCH")
        return 200, {"id": master.job_id, **master.status()}
    if tail == ["checkpoints"]:
        _allow(method, "GET")
        history = master.checkpoint_history()
        counts = {s: sum(1 for h in history if h["status"] == s)
                  for s in ("completed", "failed", "in_progress")}
        return 200, {"counts": {**counts, "total": len(history)}, "history": history}
    if tail in (["metrics"], ["vertices"], ["exceptions"], ["autoscaler"]) or (
            tail == ["savepoints"] and method == "GET"):
        _allow(method, "GET")
        overview = master.metrics()
        if tail == ["metrics"]:
            return 200, overview
        if tail == ["autoscaler"]:
            return 200, overview.get("autoscaler") or {"enabled": False}
        key = {"vertices": "vertices", "exceptions": "restarts"}.get(tail[0], tail[0])
        return 200, {key: overview[key]}
    if tail == ["savepoints"] or tail == ["stop"]:
        _allow(method, "POST")
        fields = body()
        if tail == ["stop"]:
            _check_keys(fields, {"targetDirectory", "drain"})
            target_dir = _optional_str(fields, "targetDirectory")
            drain = fields.get("drain", False)
            if not isinstance(drain, bool):
                raise RouteError(400, f"'drain' must be true or false, got {drain!r}")
            future = master.submit("stop", dir=target_dir, drain=drain)
        else:
            _check_keys(fields, {"target-directory"})
            future = master.submit("savepoint", dir=_optional_str(fields, "target-directory"))
        _raise_if_refused(future)
        request_id = uuid.uuid4().hex
        with table.lock:
            job.triggers[request_id] = Trigger(tail[0], future)
        return 202, {"request-id": request_id}
    if len(tail) == 2 and tail[0] in ("savepoints", "rescales"):
        _allow(method, "GET")
        with table.lock:
            trigger = job.triggers.get(tail[1])
        if trigger is None or (trigger.kind == "rescale") != (tail[0] == "rescales"):
            what = "rescale" if tail[0] == "rescales" else "savepoint or stop"
            raise RouteError(404, f"no {what} request {tail[1]!r} for job {master.job_id}")
        return 200, _trigger_state(job, trigger)
    raise RouteError(404, f"no such path {target!r}")


def _rescale(table: JobTable, job: ServedJob, query: dict[str, list[str]],
             fields: dict[str, Any]) -> tuple[int, Any]:
    """``PATCH /jobs/<id>``: rescale the job (checked at once: a bad
    parallelism or too few slots in local mode is a 400, a job not running a
    409; on a Spark cluster too few slots are waited for, then fail the request)."""
    _check_keys(fields, {"parallelism", "vertices"})
    _check_keys(query, {"parallelism"})
    parallelism = fields.get("parallelism")
    if "parallelism" in query:
        text = query["parallelism"][0]
        if not text.isdigit():
            raise RouteError(400, f"?parallelism must be a positive integer, got {text!r}")
        parallelism = int(text)
    vertices = fields.get("vertices")
    future = job.master.submit("rescale", parallelism=parallelism, vertices=vertices)
    if future.done() and future.exception() is not None:
        error = future.exception()
        raise RouteError(400 if isinstance(error, ConfigurationError) else 409, str(error))
    request_id = uuid.uuid4().hex
    with table.lock:
        job.triggers[request_id] = Trigger("rescale", future)
    return 202, {"request-id": request_id}


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise RouteError(405, f"{method} is not allowed here; use {' or '.join(allowed)}")


def _check_keys(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RouteError(400, f"unknown field(s) {unknown}; this request takes "
                         f"{sorted(allowed)}")


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise RouteError(400, f"{key!r} must be a folder (a non-empty string) or null, "
                         f"got {value!r}")
    return value


def _raise_if_refused(future: Future[dict[str, Any]]) -> None:
    """The job refuses at once what a job that is not running cannot do."""
    if future.done() and future.exception() is not None:
        raise RouteError(409, str(future.exception()))


def _trigger_state(job: ServedJob, trigger: Trigger) -> dict[str, Any]:
    future = trigger.future
    if not future.done():
        if not job.ended:
            return {"status": {"id": "IN_PROGRESS"}}
        failure: dict[str, Any] = {
            "class": "LockgateError",
            "message": f"job {job.master.job_id} ended ({job.master.state}) before the "
                       f"{trigger.kind} completed"}
    elif future.exception() is not None:
        e = future.exception()
        failure = {"class": type(e).__name__, "message": str(e)}
    else:
        trigger.delivered.set()
        result = future.result()
        if trigger.kind == "rescale":
            return {"status": {"id": "COMPLETED"}, "operation": result}
        operation = {"location": result.get("path")}
        if result.get("checkpoint_id") is not None:
            operation["checkpoint-id"] = result["checkpoint_id"]
        return {"status": {"id": "COMPLETED"}, "operation": operation}
    trigger.delivered.set()
    return {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": failure}}
