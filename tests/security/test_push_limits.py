"""Push sources face the network: HttpPushSource drops silent senders
(a read timeout), serves a bounded number of connections at once, and
answers a bad ``Content-Length`` or deeply nested JSON with ``400`` (no
traceback); SocketSource's line limit holds after a newline too. Real
servers and sockets on loopback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lockgate.connectors import HttpPushSource, SocketSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.push import MAX_LINE
from lockgate.errors import LockgateError
from tests.connectors.test_push import free_port

INFO = TaskInfo("job", "pushed", 0, 1, 128, 0)


@pytest.fixture
def server():
    port = free_port()
    reader = HttpPushSource(port, read_timeout=1.0, max_connections=4).create_reader(INFO)
    reader.restore(None)
    yield port, reader
    reader.close()


def request(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def post(body: bytes, length: str | None = None, kind: str = "application/json") -> bytes:
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\nConnection: close\r\n"
    head += f"Content-Length: {len(body) if length is None else length}\r\n"
    return head.encode() + b"\r\n" + body


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", " 12x"])
def test_a_bad_content_length_gets_400(server, length, capfd):
    port, _ = server
    assert request(port, post(b"[1]", length)).startswith(b"HTTP/1.0 400")
    assert "Traceback" not in capfd.readouterr().err


def test_deeply_nested_json_gets_400(server, capfd):
    port, reader = server
    deep = b"[" * 200_000 + b"]" * 200_000
    assert request(port, post(deep)).startswith(b"HTTP/1.0 400")
    lines = b"\n".join([b"{\"a\":" * 100_000 + b"1" + b"}" * 100_000])
    assert request(port, post(lines, kind="text/plain")).startswith(b"HTTP/1.0 400")
    assert request(port, post(b"[1, 2]")).startswith(b"HTTP/1.0 200")
    assert reader.poll(10) == [1, 2]
    assert "Traceback" not in capfd.readouterr().err


def test_silent_senders_are_dropped_and_connections_capped(server, capfd):
    """Four connections that send headers and never the body: a fifth is
    answered 503 at once; after the read timeout the four are closed and a
    new sender is served."""
    port, reader = server
    threads = threading.active_count()  # the server's own, and other tests' leftovers
    stuck = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(post(b"", "100"))  # a body of 100 bytes announced, none sent
        stuck.append(s)
    time.sleep(0.2)  # the server accepted them (each holds a slot)
    assert request(port, post(b"[1]")).startswith(b"HTTP/1.1 503")
    deadline = time.monotonic() + 10
    for s in stuck:  # each is closed by the server after the read timeout
        s.settimeout(max(0.1, deadline - time.monotonic()))
        assert s.recv(1) == b""
        s.close()
    until = time.monotonic() + 10
    while not (answer := request(port, post(b"[7]"))).startswith(b"HTTP/1.0 200"):
        assert time.monotonic() < until, answer
        time.sleep(0.05)
    assert reader.poll(10) == [7]
    until = time.monotonic() + 10  # the stuck connections' threads are gone
    while threading.active_count() > threads + 2:
        assert time.monotonic() < until, f"{threading.active_count()} threads, {threads} before"
        time.sleep(0.05)
    assert "Traceback" not in capfd.readouterr().err


def test_the_socket_line_limit_holds_after_a_newline():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        reader = SocketSource("127.0.0.1", port).create_reader(INFO)
        stop = threading.Event()

        def feed() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"first\n")
                try:
                    while not stop.is_set():
                        conn.sendall(b"x" * 65536)  # one line without end
                except OSError:
                    pass

        t = threading.Thread(target=feed, daemon=True)
        t.start()
        got: list[str] = []
        try:
            with pytest.raises(LockgateError, match=f"a line longer than {MAX_LINE} bytes"):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    got += reader.poll(1000) or []
                    assert len(reader._rest) <= MAX_LINE + (1 << 16) + len(b"first\n")
        finally:
            stop.set()
            reader.close()
        assert got == ["first"] or got == []
