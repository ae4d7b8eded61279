"""The driver's HTTP server: one per driver process, serving every job of it
(:mod:`lockgate.web.routes` says what each path does).

Every request carries ``Authorization: Bearer <token>`` (401 otherwise). The
server listens on 127.0.0.1 and a free port unless told otherwise
(:class:`lockgate.config.RestConfig`). Errors are ``{"errors": [...]}``.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lockgate.config import RestConfig
from lockgate.web.routes import JobTable, RouteError, parse_json_object, route

log = logging.getLogger("lockgate.rest")

MAX_BODY = 64 * 1024

__all__ = ["MAX_BODY", "RestServer"]


class RestServer:
    """The HTTP server of this driver process (see the module)."""

    def __init__(self, config: RestConfig) -> None:
        self.config = config
        self.token = config.token or secrets.token_urlsafe(32)
        self.table = JobTable()
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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    rest: RestServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("REST request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "lockgate"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("%s %s", self.address_string(), format % args)

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
            raise RouteError(400, "bad Content-Length header") from None
        if length > MAX_BODY:
            raise RouteError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length > 0 else b""
        return parse_json_object(raw)

    def _handle(self, method: str) -> None:
        try:
            if not self._authorized():
                self._error(401, "missing or wrong token: send 'Authorization: Bearer <token>'; "
                            "the token is in the job's discovery file "
                            "(<LOCKGATE_HOME or ~/.local/state/lockgate>/jobs/<job-id>.json)",
                            {"WWW-Authenticate": 'Bearer realm="lockgate"'})
                return
            status, body = route(self.server.rest.table, method, self.path, self._body)
            self._send(status, body)
        except RouteError as e:
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
