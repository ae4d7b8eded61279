"""lockgate.web on its own: it imports nothing of the code that runs jobs (a
job is a JobControl), and its routes answer a small fake job without a socket."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lockgate.web.routes import JobTable, RouteError, ServedJob, parse_json_object, route
from tests.security.rest_peers import JOB_ID, FakeJob

WEB = Path(__file__).resolve().parents[2] / "lockgate" / "web"


def test_web_imports_nothing_of_cluster_or_runtime() -> None:
    imported = set()
    for path in WEB.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add((path.name, node.module))
            elif isinstance(node, ast.Import):
                imported.update((path.name, a.name) for a in node.names)
    bad = sorted((f, m) for f, m in imported
                 if m.startswith(("lockgate.cluster", "lockgate.runtime")))
    assert not bad, bad
    assert ("serving.py", "lockgate.web.control") in imported


def _table() -> JobTable:
    table = JobTable()
    table.jobs[JOB_ID] = ServedJob(FakeJob())
    return table


def test_a_savepoint_is_triggered_and_polled_to_its_location() -> None:
    table = _table()
    status, answer = route(table, "POST", f"/jobs/{JOB_ID}/savepoints",
                           lambda: {"target-directory": "/sp"})
    assert status == 202
    status, state = route(table, "GET", f"/jobs/{JOB_ID}/savepoints/{answer['request-id']}",
                          dict)
    assert state == {"status": {"id": "COMPLETED"},
                     "operation": {"location": "/savepoints/savepoint", "checkpoint-id": 1}}


@pytest.mark.parametrize("method,path,body,code", [
    ("GET", "/nope", {}, 404),
    ("GET", "/jobs/other", {}, 404),
    ("DELETE", f"/jobs/{JOB_ID}", {}, 405),
    ("PATCH", f"/jobs/{JOB_ID}?mode=stop", {}, 400),
    ("POST", f"/jobs/{JOB_ID}/stop", {"drain": "yes"}, 400),
    ("POST", f"/jobs/{JOB_ID}/savepoints", {"dir": "/x"}, 400),
    ("POST", f"/jobs/{JOB_ID}/savepoints", {"target-directory": ""}, 400),
    ("GET", f"/jobs/{JOB_ID}/savepoints/unknown", {}, 404),
])
def test_bad_requests_are_route_errors(method: str, path: str, body: dict[str, object],
                                       code: int) -> None:
    with pytest.raises(RouteError) as e:
        route(_table(), method, path, lambda: body)
    assert e.value.status == code


@pytest.mark.parametrize("raw", [b"nope", b"[1]", b"\xff", b"[" * 100_000, b'"x"'])
def test_a_body_must_be_a_json_object(raw: bytes) -> None:
    with pytest.raises(RouteError) as e:
        parse_json_object(raw)
    assert e.value.status == 400


def test_an_empty_body_is_an_empty_object() -> None:
    assert parse_json_object(b"  ") == {} and parse_json_object(b'{"a": 1}') == {"a": 1}
