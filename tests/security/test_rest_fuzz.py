"""Fuzzing the REST server's request parsing over a real socket: random bytes,
and valid requests mutated (bytes flipped, inserted, deleted, duplicated,
truncated). Whatever arrives, the server never answers 5xx, never sends a
traceback, never stops, and answers a valid request right after.

Brief by default (50 examples per test, for CI); set
``LOCKGATE_FUZZ_EXAMPLES=5000`` for a longer run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.security.rest_peers import AUTH, JOB_ID, exchange, fake_server, request, statuses

EXAMPLES = int(os.environ.get("LOCKGATE_FUZZ_EXAMPLES", "50"))

def _post(method: str, path: str, body: bytes) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + AUTH
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


VALID = [
    request(f"/jobs/{JOB_ID}"),
    request("/jobs"),
    request(f"/jobs/{JOB_ID}/checkpoints"),
    _post("POST", f"/jobs/{JOB_ID}/savepoints", b'{"target-directory": "/sp"}'),
    _post("POST", f"/jobs/{JOB_ID}/stop", b'{"targetDirectory": null, "drain": true}'),
    _post("PATCH", f"/jobs/{JOB_ID}?mode=cancel", b""),
]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with fake_server() as p:
        yield p


def _check(port: int, data: bytes) -> None:
    answer = exchange(port, data, timeout=15)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:200]
    assert all(code < 500 for code in statuses(answer)), answer[:300]
    assert b"Traceback" not in answer and b"internal error" not in answer
    after = exchange(port, request(f"/jobs/{JOB_ID}"), timeout=15)
    assert statuses(after) == [200], after[:300]


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.binary(max_size=4096))
def test_random_bytes(port: int, data: bytes) -> None:
    _check(port, data)


_edit = st.tuples(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]),
                  st.integers(min_value=0, max_value=1 << 16),
                  st.binary(min_size=1, max_size=16))


@settings(max_examples=EXAMPLES, deadline=None)
@given(base=st.sampled_from(VALID), edits=st.lists(_edit, min_size=1, max_size=6))
def test_mutated_valid_requests(port: int, base: bytes, edits: list[tuple[str, int, bytes]]
                                ) -> None:
    data = bytearray(base)
    for kind, where, chunk in edits:
        i = where % (len(data) + 1)
        if kind == "flip" and i < len(data):
            data[i] ^= chunk[0] or 1
        elif kind == "insert":
            data[i:i] = chunk
        elif kind == "delete":
            del data[i:i + len(chunk)]
        elif kind == "duplicate":
            data[i:i] = data[max(0, i - len(chunk)):i]
        elif kind == "truncate":
            del data[i:]
    _check(port, bytes(data))


def test_valid_requests_are_answered(port: int) -> None:
    for data in VALID:
        got = statuses(exchange(port, data))
        assert got and got[0] in (200, 202), data
