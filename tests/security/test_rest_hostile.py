"""The REST server under load and hostile clients, over
real sockets on 127.0.0.1.

- A running job (local launcher) served while 200 well-behaved clients ask for
  its status and checkpoints at once, beside 20 slowloris clients (a header
  byte every half second) and 20 silent connections: every request is
  answered 200 with the job's id within a bounded time, and the slow and
  silent connections are closed by the server once its request timeout is
  up (they hold no worker meanwhile).
- Malformed requests (negative, non-numeric, huge or duplicated
  ``Content-Length``, chunked bodies, bodies that are not JSON or nest too
  deep, garbage request lines, header floods, unknown methods, newer HTTP
  versions) get a 4xx and never a 5xx, and the server answers the next
  request.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from lockgate import RestConfig
from lockgate.web import discovery, server
from tests.security.rest_peers import (
    AUTH,
    JOB_ID,
    TOKEN,
    exchange,
    fake_server,
    read_all,
    request,
    statuses,
)

CLIENTS = 200
REQUESTS_EACH = 3
HOSTILE = 20


@pytest.fixture
def running_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real job served by this process's REST server: (job id, port)."""
    from tests.fault.sums_job import build

    monkeypatch.setenv("LOCKGATE_HOME", str(tmp_path / "home"))
    p = build(None, 1, 2, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2, rate=2000)
    job = p.start(launcher="local", rest=RestConfig(token=TOKEN))
    try:
        deadline = time.monotonic() + 60
        while not (found := discovery.discover()):
            assert time.monotonic() < deadline, "no discovery file within 60 s"
            time.sleep(0.05)
        yield job.job_id, int(found[0].url.rpartition(":")[2])
    finally:
        job.master.submit("cancel")
        job.result(60)


def _watch_hostile(port: int, results: dict[str, list[float]]) -> None:
    """Open the slowloris and silent connections; feed the slow ones a byte
    every 0.5 s; record how long the server took to close each (inf: never,
    within the watch)."""
    slow, silent = [], []
    for _ in range(HOSTILE):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /jobs HTTP/1.1\r\n")
        slow.append((s, time.monotonic()))
        silent.append((socket.create_connection(("127.0.0.1", port), timeout=5),
                       time.monotonic()))
    open_ = {id(s): (kind, s, t0) for kind, group in (("slow", slow), ("silent", silent))
             for s, t0 in group}
    give_up = time.monotonic() + server.REQUEST_TIMEOUT + 15
    header = b"X-Slow: " + b"a" * 100
    sent = 0
    while open_ and time.monotonic() < give_up:
        for key, (kind, s, t0) in list(open_.items()):
            closed = False
            try:
                if kind == "slow" and sent < len(header):
                    s.send(header[sent:sent + 1])
                data = s.recv(65536, socket.MSG_DONTWAIT)
                closed = data == b"" or b"408" in data
            except BlockingIOError:
                pass
            except OSError:
                closed = True
            if closed:
                results[kind].append(time.monotonic() - t0)
                s.close()
                del open_[key]
        sent += 1
        time.sleep(0.5)
    for kind, s, _ in open_.values():
        results[kind].append(float("inf"))
        s.close()


def test_200_clients_beside_slowloris_and_silent_connections(running_job) -> None:
    job_id, port = running_job
    hostile: dict[str, list[float]] = {"slow": [], "silent": []}
    watcher = threading.Thread(target=_watch_hostile, args=(port, hostile), daemon=True)
    watcher.start()
    time.sleep(0.5)  # the hostile connections are open first

    answers: list[tuple[int, bool, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS, timeout=60)

    def client(i: int) -> None:
        start.wait()
        for r in range(REQUESTS_EACH):
            path = f"/jobs/{job_id}" + ("/checkpoints" if (i + r) % 2 else "")
            t0 = time.monotonic()
            try:
                answer = exchange(port, request(path), timeout=30)
            except OSError:
                answer = b""
            got = statuses(answer)
            ok = False
            if got == [200]:
                body = json.loads(answer.partition(b"\r\n\r\n")[2])
                ok = body.get("id") == job_id if "checkpoints" not in path else \
                    body["counts"]["total"] == len(body["history"])
            with lock:
                answers.append((got[0] if got else 0, ok, time.monotonic() - t0))

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    took = time.monotonic() - began
    watcher.join(server.REQUEST_TIMEOUT + 30)

    assert len(answers) == CLIENTS * REQUESTS_EACH
    failed = [a for a in answers if a[0] != 200 or not a[1]]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:5]}"
    assert max(a[2] for a in answers) < 30 and took < 60, (took, max(a[2] for a in answers))
    # the slow and silent ones: closed by the server once its timeout is up
    limit = server.REQUEST_TIMEOUT + 8
    for kind in ("slow", "silent"):
        assert len(hostile[kind]) == HOSTILE
        assert max(hostile[kind]) < limit, (kind, sorted(hostile[kind]))


MALFORMED: list[tuple[str, bytes, set[int]]] = [
    ("negative Content-Length", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: -5\r\n\r\n", {400}),
    ("non-numeric Content-Length", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 12abc\r\n\r\n{}", {400}),
    ("two Content-Lengths", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", {400}),
    ("huge Content-Length", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 99999999999999999999\r\n\r\n{}", {413}),
    ("chunked body", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", {411}),
    ("body not JSON", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 5\r\n\r\nhello", {400}),
    ("body not UTF-8", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 2\r\n\r\n\xff\xfe", {400}),
    ("JSON nested too deep", b"POST /jobs/fake-1/savepoints HTTP/1.1\r\n" + AUTH
     + b"Content-Length: 60000\r\n\r\n" + b"[" * 60000, {400}),
    ("garbage request line", b"\x00\x01garbage\xff\r\n\r\n", {400}),
    ("no version", b"GET\r\n\r\n", {400}),
    ("HTTP/9.9", b"GET /jobs HTTP/9.9\r\n" + AUTH + b"\r\n", {400}),
    ("bad version", b"GET /jobs HTTP/1.x\r\n" + AUTH + b"\r\n", {400}),
    ("header flood", b"GET /jobs HTTP/1.1\r\n" + AUTH
     + b"".join(b"X-%d: y\r\n" % i for i in range(500)) + b"\r\n", {431}),
    ("one huge header", b"GET /jobs HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n", {431}),
    ("unknown method", b"BREW /jobs HTTP/1.1\r\n" + AUTH + b"\r\n", {405}),
    ("method not allowed", b"DELETE /jobs HTTP/1.1\r\n" + AUTH + b"\r\n", {405}),
    ("no token", b"GET /jobs HTTP/1.1\r\n\r\n", {401}),
    ("unknown path", b"GET /../../etc/passwd HTTP/1.1\r\n" + AUTH + b"\r\n", {404}),
]


@pytest.mark.parametrize("name,data,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_a_4xx_and_the_server_goes_on(name: str, data: bytes,
                                                           expected: set[int]) -> None:
    with fake_server() as port:
        answer = exchange(port, data)
        got = statuses(answer)
        assert got and got[0] in expected, (name, answer[:300])
        assert b"Traceback" not in answer and b"internal error" not in answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["errors"]
        after = exchange(port, request(f"/jobs/{JOB_ID}"))
        assert statuses(after) == [200], after[:300]


def test_an_answer_is_not_lost_when_the_client_still_sends() -> None:
    """An error answered before the body was read (401 here) reaches the
    client: the server drains what it still sends instead of resetting."""
    with fake_server() as port, socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /jobs/fake-1/savepoints HTTP/1.1\r\nContent-Length: 40000\r\n\r\n")
        with contextlib.suppress(OSError):
            for _ in range(10):
                s.sendall(b"x" * 4000)
        assert statuses(read_all(s, 10)) == [401]


def test_kept_alive_and_pipelined_requests_are_answered_in_order() -> None:
    keep = (f"GET /jobs/{JOB_ID} HTTP/1.1\r\n".encode() + AUTH + b"\r\n")
    with fake_server() as port, socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(keep + keep + request(f"/jobs/{JOB_ID}/checkpoints"))
        answer = read_all(s, 10)
    assert statuses(answer) == [200, 200, 200]
    assert answer.count(b'"id": "fake-1"') == 2 and b'"counts"' in answer


def test_a_silent_connection_is_answered_408_and_closed_in_time() -> None:
    with fake_server() as port, socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.monotonic()
        answer = read_all(s, server.REQUEST_TIMEOUT + 10)
        took = time.monotonic() - t0
    assert statuses(answer) == [408] and took < server.REQUEST_TIMEOUT + 5, (answer, took)
