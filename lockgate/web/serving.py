"""How a job is served: this process's one REST server, started by the first
job that runs (:func:`attach`) and closed after its last; a job's discovery
file while it runs; an ended job served a little longer (:data:`LINGER`)
while a client has not fetched the result of its savepoint or stop.

The server never slows or breaks a job: it runs on its own threads, reads the
job's state and hands requests to it as commands (:meth:`JobControl.submit`);
its own failures are logged and answered, never raised into the job.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lockgate.config import RestConfig
from lockgate.errors import ConfigurationError
from lockgate.web.control import JobControl
from lockgate.web.discovery import write_discovery
from lockgate.web.routes import ServedJob, Trigger
from lockgate.web.server import RestServer

log = logging.getLogger("lockgate.rest")

LINGER = 10.0
"""Seconds an ended job stays served while a client has not yet fetched the
result of its savepoint or stop request (so ``lockgate stop`` learns the
savepoint's path even though the driver ends with the job)."""

__all__ = ["LINGER", "Registration", "attach", "resolve_rest"]


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


_lock = threading.Lock()
_server: RestServer | None = None
_closing: threading.Thread | None = None


@dataclass
class Registration:
    """A job served by this process's REST server, with its discovery file."""

    server: RestServer
    job: ServedJob
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
            with self.server.table.lock:
                self.job.ended = True
                waiting = [t for t in self.job.triggers.values() if not t.delivered.is_set()]
            if waiting:
                threading.Thread(target=self._linger, args=(waiting,), daemon=False,
                                 name="lockgate-rest-linger").start()
            else:
                self._forget(background=True)
        except Exception:
            log.warning("REST: could not end serving job %s", self.job.master.job_id,
                        exc_info=True)

    def _linger(self, waiting: list[Trigger]) -> None:
        deadline = time.monotonic() + LINGER
        for t in waiting:
            t.delivered.wait(max(0.0, deadline - time.monotonic()))
        self._forget(background=False)

    def _forget(self, background: bool) -> None:
        global _server, _closing
        table = self.server.table
        with _lock:
            with table.lock:
                table.jobs.pop(self.job.master.job_id, None)
                idle = not table.jobs
            if not idle or _server is not self.server:
                return
            _server = None  # the next job starts a new one, once this one is closed
            # closing waits for the server's threads: not in the job's thread
            closing = _closing = threading.Thread(target=self.server.close, daemon=True,
                                                  name="lockgate-rest-close")
            closing.start()
        if not background:
            closing.join()


def attach(master: JobControl, config: RestConfig | None) -> Registration | None:
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
            job = ServedJob(master)
            with server.table.lock:
                server.table.jobs[master.job_id] = job
        discovery = None
        try:
            discovery = write_discovery(master.job_id, master.pipeline.name, server.url,
                                        server.token)
        except OSError as e:
            log.warning("job %s: cannot write its discovery file (%s); the `lockgate` "
                        "commands will not find it (REST API on %s). Set LOCKGATE_HOME to "
                        "a writable folder", master.job_id, e, server.url)
        return Registration(server, job, discovery)
    except Exception as e:
        log.warning("job %s runs without its REST API: %s: %s (set another port with "
                    "LOCKGATE_REST_PORT / RestConfig(port=...), or turn it off with "
                    "rest=False / LOCKGATE_REST=0)", master.job_id, type(e).__name__, e)
        return None
