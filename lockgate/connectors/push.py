"""Push sources that cannot replay: ``SocketSource`` and ``HttpPushSource``.

Records pushed to a task are gone once read: nothing can ask the sender for
them again. So their checkpoint state is empty, ``replayable`` is False,
and after a failure every record such a source delivered since the last
completed checkpoint (and whatever was pushed while the job restarted) is
lost: the job's guarantee is **at-most-once** (``JobResult.guarantee``). A
job in exactly-once mode refuses to start with one unless it opts into the
downgrade for it by name: ``run(allow_non_replayable=["<source uid>"])``
(or ``True`` for every such source).
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.errors import ConfigurationError, LockgateError

__all__ = ["SocketSource", "HttpPushSource"]

MAX_LINE = 1 << 20
"""Longest line a ``SocketSource`` accepts (bytes)."""


class SocketSource(Source[str]):
    """Lines of text read from a TCP server each task connects to (as
    Flink's ``socketTextStream``). At-most-once: see the module.

    Args:
        host, port: the server; every task opens its own connection.
        encoding: of the lines (a trailing ``\\r`` is dropped).
        connect_timeout: seconds to connect before the task fails.
    The input ends when the server closes the connection."""

    replayable = False
    bounded = False

    def __init__(self, host: str, port: int, *, encoding: str = "utf-8",
                 connect_timeout: float = 10.0) -> None:
        self.host, self.port = host, port
        self.encoding = encoding
        self.connect_timeout = connect_timeout

    def create_reader(self, info: TaskInfo) -> SocketReader:
        return SocketReader(self, info)


class SocketReader(SourceReader[str]):
    def __init__(self, source: SocketSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self._sock: socket.socket | None = None
        self._rest = b""
        self._eof = False

    def restore(self, state: list[Any] | None) -> None:
        """Nothing to restore: the source cannot rewind."""

    def poll(self, max_records: int) -> list[str] | None:
        if self._sock is None:
            try:
                self._sock = socket.create_connection(
                    (self.source.host, self.source.port), timeout=self.source.connect_timeout)
            except OSError as e:
                raise LockgateError(f"socket source: cannot connect to {self.source.host}:"
                                    f"{self.source.port}: {e}") from None
            self._sock.setblocking(False)
        while not self._eof and self._rest.count(b"\n") < max_records:
            ready, _, _ = select.select([self._sock], [], [], 0)
            if not ready:
                break
            data = self._sock.recv(1 << 16)
            if not data:
                self._eof = True
            self._rest += data
            # the line still open (after the last newline) is bounded, whatever came before
            if len(self._rest) - (self._rest.rfind(b"\n") + 1) > MAX_LINE:
                raise LockgateError(f"socket source: a line longer than {MAX_LINE} bytes")
        *lines, self._rest = self._rest.split(b"\n", max_records)
        if any(len(line) > MAX_LINE for line in lines):
            raise LockgateError(f"socket source: a line longer than {MAX_LINE} bytes")
        if self._eof and len(lines) < max_records and self._rest:
            lines.append(self._rest)
            self._rest = b""
        if not lines and self._eof and not self._rest:
            return None
        enc = self.source.encoding
        return [line.removesuffix(b"\r").decode(enc) for line in lines]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class HttpPushSource(Source[Any]):
    """Records POSTed to an HTTP endpoint each task serves: task ``i`` listens
    on ``port + i``. A request's body is JSON lines (one record per line), or
    with ``Content-Type: application/json`` one JSON array of records; it is
    answered ``200`` once its records are queued
    in the task (not yet checkpointed: at-most-once, see the module), ``503``
    when the queue stays full for ``timeout`` seconds (the sender may retry),
    ``400`` for a body that is not JSON (or nested too deeply to parse) and
    for a ``Content-Length`` that is not a count; a connection that sends
    nothing for ``read_timeout`` seconds is closed, and beyond
    ``max_connections`` open at once a new one is answered ``503`` and
    closed. Unbounded.

    Args:
        port: the first task's port (``port + i`` for task ``i``).
        host: the address to listen on (default: loopback only).
        capacity: records queued per task before senders wait.
        timeout: seconds a request may wait for room.
        max_body: largest body accepted (bytes).
        read_timeout: seconds a connection may stay silent (headers or body).
        max_connections: connections served at once, per task.
    """

    replayable = False
    bounded = False

    def __init__(self, port: int, *, host: str = "127.0.0.1", capacity: int = 10_000,
                 timeout: float = 5.0, max_body: int = 16 << 20, read_timeout: float = 10.0,
                 max_connections: int = 64) -> None:
        self.host, self.port = host, port
        self.capacity, self.timeout, self.max_body = capacity, timeout, max_body
        self.read_timeout, self.max_connections = read_timeout, max_connections

    def create_reader(self, info: TaskInfo) -> HttpPushReader:
        return HttpPushReader(self, info)


class _CappedServer(ThreadingHTTPServer):
    """At most ``cap`` connections served at once (one thread each); one
    more is answered ``503`` and closed. Errors of a connection (a timeout, a
    reset) end it quietly."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 cap: int) -> None:
        self._slots = threading.BoundedSemaphore(cap)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class HttpPushReader(SourceReader[Any]):
    def __init__(self, source: HttpPushSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.queue: queue.Queue[Any] = queue.Queue(source.capacity)
        self._server: ThreadingHTTPServer | None = None

    def restore(self, state: list[Any] | None) -> None:
        """Nothing to restore: the source cannot rewind."""
        self._serve()

    def _serve(self) -> None:
        src, records = self.source, self.queue
        port = src.port + self.info.task_index

        class Handler(BaseHTTPRequestHandler):
            timeout = src.read_timeout  # a silent sender is dropped

            def do_POST(self) -> None:
                raw = self.headers.get("Content-Length")
                if raw is not None and not raw.strip().isdigit():
                    self.send_error(400, "Content-Length is not a count of bytes")
                    return
                length = int(raw) if raw is not None else -1
                if not 0 <= length <= src.max_body:
                    self.send_error(411 if length < 0 else 413)
                    return
                body = self.rfile.read(length)
                array = self.headers.get_content_type() == "application/json"
                try:
                    text = body.decode()
                    got = (json.loads(text) if array
                           else [json.loads(line) for line in text.splitlines() if line.strip()])
                except ValueError as e:
                    self.send_error(400, f"not JSON: {e}")
                    return
                except RecursionError:
                    self.send_error(400, "not JSON this task parses: nested too deeply")
                    return
                if not isinstance(got, list):
                    self.send_error(400, "application/json: the body must be an array")
                    return
                try:
                    for record in got:
                        records.put(record, timeout=src.timeout)
                except queue.Full:
                    self.send_error(503, "the task is busy: retry later")
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        try:
            self._server = _CappedServer((src.host, port), Handler, src.max_connections)
        except OSError as e:
            raise ConfigurationError(
                f"HTTP push source: task {self.info.task_index} cannot listen on "
                f"{src.host}:{port}: {e}") from None
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name=f"http-push-{port}").start()

    def poll(self, max_records: int) -> list[Any] | None:
        out: list[Any] = []
        try:
            while len(out) < max_records:
                out.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        return out

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
