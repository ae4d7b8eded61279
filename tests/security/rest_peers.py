"""Helpers of the REST server tests: a small job satisfying
:class:`lockgate.web.control.JobControl` served by a real server, and raw
HTTP over a real socket (127.0.0.1 only)."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from lockgate.config import RestConfig
from lockgate.web.routes import ServedJob
from lockgate.web.server import RestServer

TOKEN = "t" * 32
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
JOB_ID = "fake-1"


@dataclass
class _Named:
    name: str


class FakeJob:
    """A running job that completes every savepoint at once."""

    job_id = JOB_ID
    pipeline = _Named("fake")
    state = "running"
    guarantee: str | None = "exactly_once"

    def status(self) -> dict[str, Any]:
        return {"name": "fake", "status": self.state}

    def checkpoint_history(self) -> list[dict[str, Any]]:
        return [{"id": 1, "status": "completed"}]

    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        future.set_result({"path": f"/savepoints/{kind}", "checkpoint_id": 1})
        return future


@contextlib.contextmanager
def fake_server() -> Iterator[int]:
    """A real REST server serving :class:`FakeJob`; its port."""
    server = RestServer(RestConfig(token=TOKEN))
    server.table.jobs[JOB_ID] = ServedJob(FakeJob())
    try:
        yield int(server.url.rpartition(":")[2])
    finally:
        server.close()


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data``, half-close, and read until the server closes (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        return read_all(s, timeout)


def read_all(s: socket.socket, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    out = b""
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            data = s.recv(65536)
        except TimeoutError:
            break
        except OSError:
            break
        if not data:
            break
        out += data
    return out


STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def statuses(answer: bytes) -> list[int]:
    """The status codes of the answers in ``answer``."""
    return [int(m) for m in STATUS.findall(answer)]


def request(path: str) -> bytes:
    """An authorized ``GET path`` that closes its connection."""
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + AUTH
            + b"Connection: close\r\n\r\n")
