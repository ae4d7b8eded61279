"""The driver's HTTP server: one per driver process, serving every job of it
(:mod:`lockgate.web.routes` says what each path does, :mod:`lockgate.web.handler`
how one request is read and answered).

Every request carries ``Authorization: Bearer <token>`` (401 otherwise). The
server listens on 127.0.0.1 and a free port unless told otherwise
(:class:`lockgate.config.RestConfig`). Errors are ``{"errors": [...]}``.

Built to stay responsive whatever its clients do, and never to touch the job:

- a listen backlog of :data:`BACKLOG`;
- one loop thread accepts connections and reads each request's head (line and
  headers) without blocking: a client that sends it slowly, or nothing, holds
  no worker and is answered 408 and dropped when :data:`REQUEST_TIMEOUT` is up
  (an idle kept-alive connection too); a head over :data:`MAX_HEAD` bytes is
  answered 431;
- a request whose head has arrived goes to a pool of :data:`WORKERS` threads;
  at most :data:`QUEUE` wait for one, and beyond that, or beyond
  :data:`MAX_CONNECTIONS` open connections, the newest is answered 503 and
  closed;
- a connection answered with an error is shut for writing and drained
  (at most :data:`CLOSE_TIMEOUT` s), so its answer is not lost to a reset.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import secrets
import selectors
import socket
import threading
import time

from lockgate.config import RestConfig
from lockgate.web.handler import SEND_TIMEOUT, Connection, serve_request
from lockgate.web.routes import JobTable

log = logging.getLogger("lockgate.rest")

BACKLOG = 128
"""Connections the kernel holds for the server before it accepts them."""
WORKERS = 16
"""Threads that answer requests."""
QUEUE = 256
"""Requests (heads arrived) waiting for a worker at most; beyond: 503."""
MAX_CONNECTIONS = 512
"""Open connections at most (reading, waiting, served, closing); beyond: 503."""
REQUEST_TIMEOUT = 5.0
"""Seconds for a request's head to arrive, from the connection's accept or
the end of its previous answer."""
MAX_HEAD = 16 * 1024
"""Bytes of a request line and headers at most; beyond: 431."""
CLOSE_TIMEOUT = 2.0
"""Seconds a connection answered with an error is drained before it is closed."""

__all__ = ["BACKLOG", "MAX_CONNECTIONS", "MAX_HEAD", "QUEUE", "REQUEST_TIMEOUT", "WORKERS",
           "RestServer"]


def _head_end(buf: bytearray) -> int:
    """Where the head ends (after its empty line), or -1 if it has not yet."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\n\r\n") if (i := buf.find(sep)) >= 0]
    return min(ends) if ends else -1


def _answer_now(sock: socket.socket, status: int, reason: str, message: str) -> None:
    """A short error answer without waiting for the client (best effort)."""
    data = json.dumps({"errors": [message]}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(head + data)


class RestServer:
    """The HTTP server of this driver process (see the module)."""

    def __init__(self, config: RestConfig) -> None:
        self.config = config
        self.token = config.token or secrets.token_urlsafe(32)
        self.table = JobTable()
        self._listener = socket.create_server((config.host, config.port), backlog=BACKLOG)
        self._listener.setblocking(False)
        host, port = self._listener.getsockname()[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        self.url = f"http://{shown}:{port}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a request is answered
        self._returned: list[Connection] = []  # from workers, for the loop
        self._reading: set[Connection] = set()  # owned by the loop thread
        self._open = 0  # connections not yet closed, wherever they are
        self._queued = 0  # requests handed to the pool, not yet answered
        self._closed = False
        # daemon threads of our own, not a ThreadPoolExecutor: that one refuses work
        # once the interpreter is exiting, which is when an ended job lingers
        self._requests: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._workers = [threading.Thread(target=self._work, daemon=True,
                                          name=f"lockgate-rest-{i}") for i in range(WORKERS)]
        for worker in self._workers:
            worker.start()
        self._accept_warned = 0.0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lockgate-rest")
        self._thread.start()
        log.info("REST API on %s", self.url)

    def close(self) -> None:
        """Stop serving: no more connections; the requests being answered end
        (within their timeouts), the others are closed."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(5)
        with self._idle:
            self._idle.wait_for(lambda: self._queued == 0, timeout=SEND_TIMEOUT)
        for _ in self._workers:
            self._requests.put(None)

    # -- the loop thread ---------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                now = time.monotonic()
                first = min((c.deadline for c in self._reading), default=now + 1.0)
                for key, _ in self._selector.select(max(0.0, min(first - now, 1.0))):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._receive(key.data)
                self._take_returned()
                self._expire(time.monotonic())
        except Exception:
            log.warning("the REST server stopped", exc_info=True)
        finally:
            for conn in list(self._reading):
                self._close(conn)
            with self._lock:
                self._closed = True
                returned, self._returned = self._returned, []
            for conn in returned:
                self._close(conn, registered=False)
            self._selector.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()

    def _accept(self) -> None:
        for _ in range(64):  # then let the others in
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of file descriptors, ...: the loop goes on
                if time.monotonic() - self._accept_warned > 10:
                    self._accept_warned = time.monotonic()
                    log.warning("REST server cannot accept a connection: %s", e)
                time.sleep(0.05)
                return
            with self._lock:
                full = self._open >= MAX_CONNECTIONS
                self._open += 0 if full else 1
            if full:
                _answer_now(sock, 503, "Service Unavailable", "too many connections; retry")
                sock.close()
                continue
            sock.setblocking(False)
            self._watch(Connection(sock, address, deadline=time.monotonic() + REQUEST_TIMEOUT))

    def _watch(self, conn: Connection) -> None:
        self._reading.add(conn)
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _receive(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.closing:
            return  # drained, dropped
        conn.buffer += data
        self._check_head(conn)

    def _check_head(self, conn: Connection) -> None:
        end = _head_end(conn.buffer)
        if end < 0 and len(conn.buffer) <= MAX_HEAD:
            return
        if end < 0 or end > MAX_HEAD:
            self._refuse(conn, 431, "Request Header Fields Too Large",
                         f"the request line and headers are over {MAX_HEAD} bytes")
            return
        with self._lock:
            busy = self._queued >= WORKERS + QUEUE
            self._queued += 0 if busy else 1
        if busy:
            self._refuse(conn, 503, "Service Unavailable", "the server is busy; retry")
            return
        self._selector.unregister(conn.sock)
        self._reading.discard(conn)
        self._requests.put(conn)

    def _refuse(self, conn: Connection, status: int, reason: str, message: str) -> None:
        _answer_now(conn.sock, status, reason, message)
        self._linger(conn)

    def _linger(self, conn: Connection) -> None:
        """Shut for writing; read and drop what comes until the client closes."""
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        conn.closing, conn.buffer = True, bytearray()
        conn.deadline = time.monotonic() + CLOSE_TIMEOUT

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._reading if c.deadline <= now]:
            if conn.closing:
                self._close(conn)
            else:
                self._refuse(conn, 408, "Request Timeout",
                             f"the request did not arrive within {REQUEST_TIMEOUT} s")

    def _take_returned(self) -> None:
        with self._lock:
            returned, self._returned = self._returned, []
        for conn in returned:
            conn.sock.setblocking(False)
            self._watch(conn)
            if not conn.closing:
                conn.deadline = time.monotonic() + REQUEST_TIMEOUT
                if conn.buffer:
                    self._check_head(conn)  # a pipelined request

    def _close(self, conn: Connection, registered: bool = True) -> None:
        if registered:
            self._reading.discard(conn)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
        with self._lock:
            self._open -= 1

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- a worker thread ---------------------------------------------------
    def _work(self) -> None:
        while (conn := self._requests.get()) is not None:
            self._serve(conn)

    def _serve(self, conn: Connection) -> None:
        keep = False
        try:
            conn.sock.setblocking(True)
            keep = serve_request(conn, self.table, self.token)
        except (TimeoutError, ConnectionError, OSError) as e:
            log.debug("REST connection from %s dropped: %s", conn.address, e)
        except Exception:
            log.warning("REST request from %s failed", conn.address, exc_info=True)
        with self._idle:
            self._queued -= 1
            self._idle.notify_all()
        if not keep:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            conn.closing, conn.buffer = True, bytearray()
            conn.deadline = time.monotonic() + CLOSE_TIMEOUT
        with self._lock:
            back = not self._closed
            if back:
                self._returned.append(conn)  # the loop reads its next request, or drains it
        if back:
            self._wake()
        else:
            conn.sock.close()
            with self._lock:
                self._open -= 1
