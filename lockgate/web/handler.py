"""One HTTP request, on a worker thread, once its head has arrived whole.

The server's loop (:mod:`lockgate.web.server`) reads a request's line and
headers; this module parses them, checks the token, reads the body (with a
deadline and a size limit) and answers from :mod:`lockgate.web.routes`.
Client mistakes are answered with a 4xx and ``{"errors": [...]}``: a
malformed request line, more than 100 headers, a ``Content-Length`` that is
not a number, negative or too large (400/413), a chunked body (411), a body
that is not JSON (400), an unknown method (405). Only a fault of the server
itself is a 500, logged with its traceback.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from lockgate.web.routes import JobTable, Raw, RouteError, parse_json_object, route
from lockgate.web.ui_files import ui_file

log = logging.getLogger("lockgate.rest")

MAX_BODY = 64 * 1024
"""Bytes of a request body at most (413 beyond)."""
BODY_TIMEOUT = 5.0
"""Seconds to receive a request's body once its head has arrived."""
SEND_TIMEOUT = 5.0
"""Seconds to send an answer to a client that does not read it."""

__all__ = ["BODY_TIMEOUT", "MAX_BODY", "SEND_TIMEOUT", "Connection", "serve_request"]


@dataclass(eq=False)
class Connection:
    """An accepted connection and the bytes received on it not yet used."""

    sock: socket.socket
    address: tuple[Any, ...]
    buffer: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0
    closing: bool = False
    """Answered and shut for writing: the loop reads what the client still
    sends until it closes (so the answer is not lost to a reset)."""


class _Input(io.BufferedIOBase):
    """The request as ``rfile``: the head from the connection's buffer, the
    body from the buffer and then the socket, before a deadline."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1, /) -> bytes:
        buf = self.conn.buffer
        end = buf.find(b"\n", self.pos)
        end = len(buf) if end < 0 else end + 1
        if size is not None and size >= 0:
            end = min(end, self.pos + size)
        line = bytes(buf[self.pos:end])
        self.pos = end
        return line

    def read(self, size: int | None = -1, /) -> bytes:
        if size is None or size < 0:
            raise ValueError("a request body is read by its length")
        deadline = time.monotonic() + BODY_TIMEOUT
        buf = self.conn.buffer
        while len(buf) - self.pos < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the body did not arrive within {BODY_TIMEOUT} s")
            self.conn.sock.settimeout(remaining)
            data = self.conn.sock.recv(min(65536, size - (len(buf) - self.pos)))
            if not data:
                raise ConnectionError("the client closed the connection mid-body")
            buf += data
        body = bytes(buf[self.pos:self.pos + size])
        self.pos += size
        return body

    def rest(self) -> bytearray:
        """The bytes after this request (a pipelined next one)."""
        return self.conn.buffer[self.pos:]


class _Output(io.BufferedIOBase):
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any, /) -> int:
        self.sock.sendall(data)
        return len(data)


def serve_request(conn: Connection, table: JobTable, token: str) -> bool:
    """Answer the request whose head is in ``conn.buffer`` (the socket
    blocking); whether the connection stays open for another (then its
    buffer holds what came after this request)."""
    handler = _Handler(conn, table, token)
    handler.handle_one_request()
    conn.buffer = handler.rfile.rest()
    return not handler.close_connection


class _Handler(BaseHTTPRequestHandler):
    server_version = "lockgate"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # never answer without a status line
    rfile: _Input

    def __init__(self, conn: Connection, table: JobTable, token: str) -> None:
        # not BaseRequestHandler's __init__: the loop has read the head already
        self.conn = conn
        self.table = table
        self.token = token
        self.request = conn.sock
        self.client_address = conn.address
        self.rfile = _Input(conn)
        self.wfile = _Output(conn.sock)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
        try:
            self.raw_requestline = self.rfile.readline()
            if not self.parse_request():
                return
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self._error(405, f"method {self.command!r} is not allowed; the API takes "
                            "GET, POST and PATCH", {"Allow": "GET, POST, PATCH"})
                return
            method()
        except (TimeoutError, ConnectionError) as e:
            log.debug("REST connection from %s dropped: %s", self.address_string(), e)
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's parse errors, as JSON. An unknown method or a newer
        HTTP version is the client's mistake here (405, 400), not a 5xx."""
        code = {501: 405, 505: 400}.get(code, code)
        short, _ = self.responses.get(code, ("error", ""))
        self._error(code, f"{message or short}" + (f": {explain}" if explain else ""))

    # -- plumbing ---------------------------------------------------------
    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, Raw):
            data, content_type = body.data, body.content_type
        else:
            data, content_type = _json(body), "application/json"
        self.conn.sock.settimeout(SEND_TIMEOUT)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self.close_connection = True  # an unread request body must not be taken for the next
        self._send(status, {"errors": [message]}, headers)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        expected = f"Bearer {self.token}".encode()
        return hmac.compare_digest(header.encode("utf-8", "replace"), expected)

    def _body_length(self) -> int:
        if self.headers.get("Transfer-Encoding") is not None:
            raise RouteError(411, "send the request body with a Content-Length "
                             "(Transfer-Encoding is not supported)")
        values = {v.strip() for v in self.headers.get_all("Content-Length", [])}
        if not values:
            return 0
        value = values.pop()
        if values or not (value.isascii() and value.isdigit()):
            raise RouteError(400, "bad Content-Length header: it must be one number of "
                             "bytes, at least 0")
        if len(value) > 12 or int(value) > MAX_BODY:
            raise RouteError(413, f"request body over {MAX_BODY} bytes")
        return int(value)

    def _handle(self, method: str) -> None:
        try:
            path = self.path.split("?", 1)[0]
            if method == "GET" and (path == "/ui" or path.startswith("/ui/")):
                # the dashboard's static files hold no data: no token (a browser
                # cannot send one when it opens a page); its script sends the token
                status, page, headers = ui_file(self.path)
                self._send(status, page, headers)
                return
            if not self._authorized():
                self._error(401, "missing or wrong token: send 'Authorization: Bearer <token>'; "
                            "the token is in the job's discovery file "
                            "(<LOCKGATE_HOME or ~/.local/state/lockgate>/jobs/<job-id>.json)",
                            {"WWW-Authenticate": 'Bearer realm="lockgate"'})
                return
            length = self._body_length()
            raw = self.rfile.read(length) if length else b""  # read, so the next request is
            body: Callable[[], dict[str, Any]] = lambda: parse_json_object(raw)  # its own
            status, answer = route(self.table, method, self.path, body)
            self._send(status, answer)
        except RouteError as e:
            self._error(e.status, str(e))
        except (TimeoutError, ConnectionError):
            raise
        except Exception as e:
            log.warning("REST %s %s failed", method, self.path, exc_info=True)
            try:
                self._error(500, f"internal error: {type(e).__name__}: {e}")
            except OSError:
                self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def _json(body: Any) -> bytes:
    """JSON text; a float that JSON cannot spell (an infinite watermark) is null."""
    try:
        return json.dumps(body, default=str, allow_nan=False).encode()
    except ValueError:
        return json.dumps(_finite(body), default=str).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
