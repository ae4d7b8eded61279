"""The driver's REST API: job control while a job runs, and how clients find it.

One HTTP server per driver process serves every job of that process (Flink's
REST paths, JSON everywhere)::

    GET   /jobs                              {"jobs": [{"id", "name", "status", "guarantee"}]}
    GET   /jobs/<id>                         the job's status
    GET   /jobs/<id>/checkpoints             {"counts": {...}, "history": [...]}
    POST  /jobs/<id>/savepoints              {"target-directory": D|null} -> {"request-id"}
    GET   /jobs/<id>/savepoints/<request-id> {"status": {"id": "IN_PROGRESS"|"COMPLETED"},
                                              "operation": {"location"} | {"failure-cause"}}
    POST  /jobs/<id>/stop                    {"targetDirectory": D|null, "drain": bool}
                                             -> {"request-id"} (polled like a savepoint)
    PATCH /jobs/<id>?mode=cancel             202; the job ends

Every request carries ``Authorization: Bearer <token>`` (401 otherwise). The
server listens on 127.0.0.1 and a free port unless told otherwise
(:class:`lockgate.config.RestConfig`). Errors are ``{"errors": [...]}`` with
400 (bad input), 401, 404 (unknown job or path), 405, 409 (the job is not
running).

Discovery: while a job runs, its driver keeps
``<LOCKGATE_HOME or ~/.local/state/lockgate>/jobs/<job-id>.json`` (mode 0600,
folder 0700) with its pid, URL and token; readers skip and delete the files
of dead processes. The ``lockgate`` CLI (``list``, ``savepoint``, ``stop``,
``cancel``, ``checkpoints``) finds jobs there.

The server never slows or breaks a job: it runs on its own threads, reads the
job master's state and hands requests to it as commands (``JobMaster.submit``);
its own failures are logged and answered, never raised into the job.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from lockgate.config import RestConfig
from lockgate.errors import ConfigurationError, LockgateError

if TYPE_CHECKING:
    from lockgate.cluster.jobmaster import JobMaster

log = logging.getLogger("lockgate.rest")

LINGER = 10.0
"""Seconds an ended job stays served while a client has not yet fetched the
result of its savepoint or stop request (so ``lockgate stop`` learns the
savepoint's path even though the driver ends with the job)."""
MAX_BODY = 64 * 1024
ENDED = frozenset({"finished", "stopped", "cancelled", "failed"})

__all__ = [
    "JobEndpoint",
    "RestRequestError",
    "Registration",
    "attach",
    "call",
    "discover",
    "find_job",
    "jobs_dir",
    "resolve_rest",
]


# ------------------------------------------------------------ configuration
def resolve_rest(rest: RestConfig | bool | None) -> RestConfig | None:
    """The REST settings of a run: ``False`` -> off, a :class:`RestConfig` as
    given, ``None``/``True`` -> from the environment (``LOCKGATE_REST=0`` turns
    it off; ``LOCKGATE_REST_HOST``, ``LOCKGATE_REST_PORT``, ``LOCKGATE_REST_TOKEN``)."""
    if rest is False:
        return None
    if isinstance(rest, RestConfig):
        return rest
    if rest is not None and rest is not True:
        raise ConfigurationError(
            f"rest must be True, False or a RestConfig, got {type(rest).__name__}")
    if os.environ.get("LOCKGATE_REST", "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    port_text = os.environ.get("LOCKGATE_REST_PORT", "0").strip() or "0"
    try:
        port = int(port_text)
        return RestConfig(host=os.environ.get("LOCKGATE_REST_HOST", "127.0.0.1").strip(),
                          port=port, token=os.environ.get("LOCKGATE_REST_TOKEN") or None)
    except ValueError as e:
        raise ConfigurationError(
            f"bad REST setting in the environment ({e}); fix LOCKGATE_REST_PORT / "
            "LOCKGATE_REST_TOKEN, or turn the REST API off with LOCKGATE_REST=0") from None


def state_home() -> Path:
    """``$LOCKGATE_HOME``, else ``$XDG_STATE_HOME/lockgate``, else ``~/.local/state/lockgate``."""
    home = os.environ.get("LOCKGATE_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "lockgate"


def jobs_dir() -> Path:
    """The folder of the discovery files."""
    return state_home() / "jobs"


# ------------------------------------------------------------------ server
@dataclass
class _Trigger:
    """One savepoint or stop request, polled by its id."""

    kind: str
    future: Future[dict[str, Any]]
    delivered: threading.Event = field(default_factory=threading.Event)
    """A client fetched its final state."""


@dataclass
class _Job:
    master: JobMaster
    triggers: dict[str, _Trigger] = field(default_factory=dict)
    ended: bool = False


class RestServer:
    """The HTTP server of this driver process (see the module)."""

    def __init__(self, config: RestConfig) -> None:
        self.config = config
        self.token = config.token or secrets.token_urlsafe(32)
        self.jobs: dict[str, _Job] = {}
        self.lock = threading.Lock()
        self.httpd = _HTTPServer((config.host, config.port), _Handler)
        self.httpd.rest = self
        host, port = self.httpd.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        self.url = f"http://{shown}:{port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={
            "poll_interval": 0.2}, daemon=True, name="lockgate-rest")
        self._thread.start()
        log.info("REST API on %s", self.url)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def job(self, job_id: str) -> _Job | None:
        with self.lock:
            return self.jobs.get(job_id)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    rest: RestServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("REST request from %s failed", client_address, exc_info=True)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "lockgate"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("%s %s", self.address_string(), format % args)

    # -- plumbing ---------------------------------------------------------
    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self.close_connection = True  # an unread request body must not be taken for the next
        self._send(status, {"errors": [message]}, headers)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        expected = f"Bearer {self.server.rest.token}".encode()
        return hmac.compare_digest(header.encode("utf-8", "replace"), expected)

    def _body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _BadRequest(400, "bad Content-Length header") from None
        if length > MAX_BODY:
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise _BadRequest(400, f"the request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "the request body must be a JSON object")
        return body

    def _handle(self, method: str) -> None:
        try:
            if not self._authorized():
                self._error(401, "missing or wrong token: send 'Authorization: Bearer <token>'; "
                            "the token is in the job's discovery file "
                            "(<LOCKGATE_HOME or ~/.local/state/lockgate>/jobs/<job-id>.json)",
                            {"WWW-Authenticate": 'Bearer realm="lockgate"'})
                return
            parts = urlsplit(self.path)
            segments = [unquote(s) for s in parts.path.strip("/").split("/") if s]
            query = parse_qs(parts.query)
            status, body = self._route(method, segments, query)
            self._send(status, body)
        except _BadRequest as e:
            self._error(e.status, str(e))
        except Exception as e:  # noqa: BLE001 - answered and logged, never raised into the job
            log.warning("REST %s %s failed", method, self.path, exc_info=True)
            try:
                self._error(500, f"internal error: {type(e).__name__}: {e}")
            except OSError:
                pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    # -- routes -----------------------------------------------------------
    def _route(self, method: str, seg: list[str],
               query: dict[str, list[str]]) -> tuple[int, Any]:
        rest = self.server.rest
        if not seg or seg[0] != "jobs":
            raise _BadRequest(404, f"no such path {self.path!r}; the API starts at /jobs")
        if len(seg) == 1:
            _allow(method, "GET")
            with rest.lock:
                jobs = list(rest.jobs.values())
            return 200, {"jobs": [{"id": j.master.job_id, "name": j.master.pipeline.name,
                                   "status": j.master.state,
                                   "guarantee": j.master.guarantee} for j in jobs]}
        job = rest.job(seg[1])
        if job is None:
            with rest.lock:
                known = sorted(rest.jobs)
            raise _BadRequest(404, f"no job {seg[1]!r} in this driver (its jobs: "
                              f"{', '.join(known) or 'none'}); `lockgate list` shows running jobs")
        master = job.master
        tail = seg[2:]
        if not tail:
            if method == "PATCH":
                mode = query.get("mode", [""])[0]
                if mode != "cancel":
                    raise _BadRequest(400, f"PATCH /jobs/<id> needs ?mode=cancel, got "
                                      f"mode={mode!r}")
                future = master.submit("cancel")
                _raise_if_refused(future)
                return 202, {"status": "cancelling"}
            _allow(method, "GET", "PATCH")
            return 200, {"id": master.job_id, **master.status()}
        if tail == ["checkpoints"]:
            _allow(method, "GET")
            history = master.checkpoint_history()
            counts = {s: sum(1 for h in history if h["status"] == s)
                      for s in ("completed", "failed", "in_progress")}
            return 200, {"counts": {**counts, "total": len(history)}, "history": history}
        if tail == ["savepoints"] or tail == ["stop"]:
            _allow(method, "POST")
            body = self._body()
            if tail == ["stop"]:
                _check_keys(body, {"targetDirectory", "drain"})
                target = _optional_str(body, "targetDirectory")
                drain = body.get("drain", False)
                if not isinstance(drain, bool):
                    raise _BadRequest(400, f"'drain' must be true or false, got {drain!r}")
                future = master.submit("stop", dir=target, drain=drain)
            else:
                _check_keys(body, {"target-directory"})
                future = master.submit("savepoint", dir=_optional_str(body, "target-directory"))
            _raise_if_refused(future)
            request_id = uuid.uuid4().hex
            with rest.lock:
                job.triggers[request_id] = _Trigger(tail[0], future)
            return 202, {"request-id": request_id}
        if len(tail) == 2 and tail[0] == "savepoints":
            _allow(method, "GET")
            trigger = job.triggers.get(tail[1])
            if trigger is None:
                raise _BadRequest(404, f"no savepoint or stop request {tail[1]!r} for job "
                                  f"{master.job_id}")
            return 200, _trigger_state(job, trigger)
        raise _BadRequest(404, f"no such path {self.path!r}")


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise _BadRequest(405, f"{method} is not allowed here; use {' or '.join(allowed)}")


def _check_keys(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _BadRequest(400, f"unknown field(s) {unknown}; this request takes "
                          f"{sorted(allowed)}")


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise _BadRequest(400, f"{key!r} must be a folder (a non-empty string) or null, "
                          f"got {value!r}")
    return value


def _raise_if_refused(future: Future[dict[str, Any]]) -> None:
    """The job master refuses at once what a job that is not running cannot do."""
    if future.done() and future.exception() is not None:
        raise _BadRequest(409, str(future.exception()))


def _trigger_state(job: _Job, trigger: _Trigger) -> dict[str, Any]:
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
        operation = {"location": result.get("path")}
        if result.get("checkpoint_id") is not None:
            operation["checkpoint-id"] = result["checkpoint_id"]
        return {"status": {"id": "COMPLETED"}, "operation": operation}
    trigger.delivered.set()
    return {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": failure}}


# ------------------------------------------------------------ registration
_lock = threading.Lock()
_server: RestServer | None = None
_closing: threading.Thread | None = None


@dataclass
class Registration:
    """A job served by this process's REST server, with its discovery file."""

    server: RestServer
    job: _Job
    discovery: Path | None

    @property
    def url(self) -> str:
        return self.server.url

    def detach(self) -> None:
        """The job ended: drop its discovery file; keep serving it while a
        client has not fetched a savepoint/stop result (at most ``LINGER`` s,
        on a thread that keeps the process alive that long), then forget it."""
        try:
            if self.discovery is not None:
                self.discovery.unlink(missing_ok=True)
            with self.server.lock:
                self.job.ended = True
                waiting = [t for t in self.job.triggers.values() if not t.delivered.is_set()]
            if waiting:
                threading.Thread(target=self._linger, args=(waiting,), daemon=False,
                                 name="lockgate-rest-linger").start()
            else:
                self._forget(background=True)
        except Exception:  # noqa: BLE001 - never break the job
            log.warning("REST: could not end serving job %s", self.job.master.job_id,
                        exc_info=True)

    def _linger(self, waiting: list[_Trigger]) -> None:
        deadline = time.monotonic() + LINGER
        for t in waiting:
            t.delivered.wait(max(0.0, deadline - time.monotonic()))
        self._forget(background=False)

    def _forget(self, background: bool) -> None:
        global _server, _closing
        with _lock:
            with self.server.lock:
                self.server.jobs.pop(self.job.master.job_id, None)
                idle = not self.server.jobs
            if not idle or _server is not self.server:
                return
            _server = None  # the next job starts a new one, once this one is closed
            # shutdown() waits for the serve loop's next poll: not in the job's thread
            closing = _closing = threading.Thread(target=self.server.close, daemon=True,
                                                  name="lockgate-rest-close")
            closing.start()
        if not background:
            closing.join()


def attach(master: JobMaster, config: RestConfig | None) -> Registration | None:
    """Serve ``master``'s job (starting this process's server if needed) and
    write its discovery file. Never raises: a REST API that cannot start is
    logged, and the job runs without it."""
    global _server
    if config is None:
        return None
    try:
        with _lock:
            if _closing is not None:
                _closing.join(5)
            if _server is None:
                _server = RestServer(config)
            elif config != _server.config:
                log.warning("job %s asked for REST settings %s, but this process already "
                            "serves %s; it is served there", master.job_id, config,
                            _server.url)
            server = _server
            job = _Job(master)
            with server.lock:
                server.jobs[master.job_id] = job
        discovery = None
        try:
            discovery = _write_discovery(master, server)
        except OSError as e:
            log.warning("job %s: cannot write its discovery file (%s); the `lockgate` "
                        "commands will not find it (REST API on %s). Set LOCKGATE_HOME to "
                        "a writable folder", master.job_id, e, server.url)
        return Registration(server, job, discovery)
    except Exception as e:  # noqa: BLE001 - the job runs anyway
        log.warning("job %s runs without its REST API: %s: %s (set another port with "
                    "LOCKGATE_REST_PORT / RestConfig(port=...), or turn it off with "
                    "rest=False / LOCKGATE_REST=0)", master.job_id, type(e).__name__, e)
        return None


def _write_discovery(master: JobMaster, server: RestServer) -> Path:
    folder = jobs_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid == os.getuid() and folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
    path = folder / f"{master.job_id}.json"
    data = json.dumps({
        "format": 1, "job_id": master.job_id, "name": master.pipeline.name,
        "pid": os.getpid(), "host": socket.gethostname(), "url": server.url,
        "token": server.token, "started_at": time.time(),
    }).encode()
    tmp = folder / f".{master.job_id}.json.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------ client
@dataclass(frozen=True)
class JobEndpoint:
    """A running job as its discovery file describes it."""

    job_id: str
    name: str
    pid: int
    url: str
    token: str
    started_at: float
    path: Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discover(prune: bool = True) -> list[JobEndpoint]:
    """The jobs whose discovery files are in :func:`jobs_dir`, oldest first.
    Files of dead driver processes on this host are skipped (and deleted
    with ``prune``)."""
    folder = jobs_dir()
    found = []
    try:
        names = sorted(folder.glob("*.json"))
    except OSError:
        return []
    here = socket.gethostname()
    for path in names:
        try:
            d = json.loads(path.read_text())
            ep = JobEndpoint(str(d["job_id"]), str(d.get("name", "")), int(d["pid"]),
                             str(d["url"]), str(d["token"]), float(d.get("started_at", 0)),
                             path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or not ours: leave it
        if d.get("host", here) == here and not _alive(ep.pid):
            if prune:
                path.unlink(missing_ok=True)
            continue
        found.append(ep)
    return sorted(found, key=lambda e: e.started_at)


def find_job(query: str) -> JobEndpoint:
    """The running job whose id is ``query`` (or starts with it, if only one does)."""
    jobs = discover()
    if not jobs:
        raise LockgateError(
            f"no running Lockgate job: no live discovery file in {jobs_dir()}. Start one "
            "with `lockgate run app.py`; jobs run with rest=False or LOCKGATE_REST=0, or "
            "under another LOCKGATE_HOME, are not seen")
    exact = [j for j in jobs if j.job_id == query]
    matches = exact or [j for j in jobs if j.job_id.startswith(query)]
    if len(matches) == 1:
        return matches[0]
    ids = ", ".join(j.job_id for j in (matches or jobs))
    if matches:
        raise LockgateError(f"{query!r} matches several jobs ({ids}); give more of the id")
    raise LockgateError(f"no running job {query!r} (running: {ids}); `lockgate list` "
                        "shows the running jobs")


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
