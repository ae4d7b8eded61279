"""What the CLI uses to talk to a running job's driver: :func:`call` (one
request, its JSON answer) and :func:`wait_for` (poll an asynchronous
operation). Jobs are found with :mod:`lockgate.web.discovery`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from lockgate.errors import LockgateError
from lockgate.web.discovery import JobEndpoint

__all__ = ["ENDED", "RestRequestError", "call", "wait_for", "await_operation"]

ENDED = frozenset({"finished", "stopped", "cancelled", "failed"})
"""The statuses of a job that has ended."""


class RestRequestError(LockgateError):
    """The REST API answered with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def call(job: JobEndpoint, method: str, path: str, body: dict[str, Any] | None = None,
         timeout: float = 30.0) -> Any:
    """One request to ``job``'s driver; its JSON answer. Errors become
    :class:`RestRequestError` (an answer) or :class:`LockgateError` (no answer)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(job.url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {job.token}", "Content-Type": "application/json",
        "Accept": "application/json"})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        try:
            errors = json.loads(e.read()).get("errors") or [e.reason]
        except (ValueError, AttributeError, OSError):
            errors = [str(e.reason)]
        raise RestRequestError(e.code, "; ".join(str(x) for x in errors)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise LockgateError(
            f"cannot reach the driver of job {job.job_id} (pid {job.pid}) at {job.url}: "
            f"{reason}. Is it still running? `lockgate list` shows the running jobs") from None
    return json.loads(raw) if raw.strip() else {}


def wait_for(poll: Callable[[], Any | None], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Call ``poll`` until it returns something other than None (a deadline,
    not a sleep as synchronization: the REST API has no push)."""
    deadline = time.monotonic() + timeout
    while True:
        value = poll()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise LockgateError(f"{what} did not finish within {timeout:.0f} s; it may still "
                                "complete: check with `lockgate checkpoints JOB`, or wait "
                                "longer with --timeout")
        time.sleep(interval)


def await_operation(job: JobEndpoint, path: str, timeout: float, what: str) -> dict[str, Any]:
    """Poll the asynchronous operation at ``path`` (a savepoint, stop or
    rescale request) until it completed; its ``operation``, or a
    ``LockgateError`` with its failure's cause (``what`` names it: "the
    savepoint of job ...")."""

    def poll() -> dict[str, Any] | None:
        answer: dict[str, Any] = call(job, "GET", path)
        return answer if answer["status"]["id"] == "COMPLETED" else None

    operation: dict[str, Any] = wait_for(poll, timeout, what)["operation"]
    failure = operation.get("failure-cause")
    if failure:
        raise LockgateError(f"{what} failed: {failure['message']}")
    return operation
