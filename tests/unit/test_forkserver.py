"""The local launcher's fork server (lockgate/cluster/local/forkserver.py, the
driver's side in lockgate/cluster/local/forks.py), with real processes: tasks are
forked children that report their exit codes, a kill reaches only a task
that has not ended, the driver's environment and import path reach each
task, a server that dies leaves its tasks watched until they are gone, and
what the driver tells it to preload (the job's connectors) is imported
once, in the server, for every task forked after."""

from __future__ import annotations

import os
import queue
import signal
import sys
import time

import cloudpickle
import pytest

from lockgate import AsyncFunction, CheckpointConfig, Pipeline
from lockgate.cluster.local import forks
from lockgate.connectors.kafka import KafkaSink, KafkaSource
from lockgate.graph.jobgraph import build_job_graph


class Payload:
    """Stands in for a task's pickled (spec, coordinator, secret): unpickling
    it in the child runs ``action`` there (as unpickling user code would)."""

    def __init__(self, action: str) -> None:
        self.action = action

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_act, (self.action,))


def _act(action: str) -> None:
    if action == "exit3":
        os._exit(3)
    if action == "env":
        with open(os.environ["FORK_TEST_OUT"], "w") as f:
            f.write(os.environ.get("FORK_TEST_VALUE", "") + "|" + str(os.getsid(0) == os.getpid()))
        os._exit(0)
    if action == "sleep":
        time.sleep(600)
    if action == "modules":  # which of PRELOADED the server had imported
        with open(os.environ["FORK_TEST_OUT"], "w") as f:
            f.write(" ".join(m for m in PRELOADED if m in sys.modules))
        os._exit(0)
    os._exit(9)


PRELOADED = ("colorsys", "confluent_kafka")
"""Modules the task code does not import."""


def spawn(server: forks.ForkServer, action: str) -> tuple[int, queue.Queue[int | None]]:
    codes: queue.Queue[int | None] = queue.Queue()
    pid = server.spawn(cloudpickle.dumps(Payload(action)), codes.put)
    return pid, codes


@pytest.fixture
def server():
    s = forks.ForkServer()
    yield s
    s.proc.kill()
    s.proc.wait()


def test_a_task_is_a_fork_that_reports_its_exit_code(server) -> None:
    pid, codes = spawn(server, "exit3")
    assert pid != server.proc.pid
    assert codes.get(timeout=60) == 3


def test_a_kill_ends_a_running_task_with_sigkill(server) -> None:
    pid, codes = spawn(server, "sleep")
    server.kill(pid)
    assert codes.get(timeout=60) == -signal.SIGKILL
    server.kill(pid)  # already reaped: the server ignores it, nothing else is hit


def test_the_task_gets_the_drivers_environment_of_now_and_a_session_of_its_own(
        server, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("FORK_TEST_OUT", str(out))
    monkeypatch.setenv("FORK_TEST_VALUE", "set after the server started")
    _, codes = spawn(server, "env")
    assert codes.get(timeout=60) == 0
    assert out.read_text() == "set after the server started|True"


def test_tasks_of_a_server_that_died_are_watched_until_they_are_gone(server) -> None:
    pid, codes = spawn(server, "sleep")
    server.proc.kill()  # the server goes; its task lives on, no child of ours
    deadline = time.monotonic() + 60
    while server.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.alive
    assert codes.empty()
    os.kill(pid, signal.SIGKILL)
    assert codes.get(timeout=60) is None  # gone, its exit code unknown
    with pytest.raises(OSError):
        spawn(server, "exit3")


def replaced_server() -> forks.ForkServer:
    """Kill the process-wide server; the one the next call starts."""
    first = forks.server()
    assert forks.server() is first
    first.proc.kill()
    first.proc.wait()
    second = forks.server()
    assert second is not first
    return second


def test_the_process_wide_server_is_replaced_when_it_died() -> None:
    second = replaced_server()
    _, codes = spawn(second, "exit3")
    assert codes.get(timeout=60) == 3


def test_what_the_driver_preloads_is_imported_once_in_the_server_for_every_later_task(
        server, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("FORK_TEST_OUT", str(out))
    _, codes = spawn(server, "modules")
    assert codes.get(timeout=60) == 0
    assert out.read_text() == ""
    # what cannot be imported is left to the tasks: the server goes on
    server.preload(["no_such_module_for_lockgate", "1bad", "os; x", *PRELOADED])
    _, codes = spawn(server, "modules")
    assert codes.get(timeout=60) == 0
    assert out.read_text() == " ".join(PRELOADED)
    # forking stays safe: the preloaded client library started no thread
    assert os.listdir(f"/proc/{server.proc.pid}/task") == [str(server.proc.pid)]


def test_a_kafka_job_preloads_its_connectors_and_client_but_no_other_connector() -> None:
    p = Pipeline("kafka-modules", checkpoint=CheckpointConfig(storage="/tmp/unused"))
    (p.source(KafkaSource("localhost:1", "in", bounded=True), uid="in")
       .map(lambda x: x, uid="same")
       .sink(KafkaSink("localhost:1", "out"), uid="out"))
    modules = forks.task_modules(build_job_graph(p), p.checkpoint.storage)
    assert {"confluent_kafka", "lockgate.connectors.kafka.source",
            "lockgate.connectors.kafka.sink"} <= set(modules)
    assert not [m for m in modules if m.startswith("pyarrow")]
    assert "lockgate.runtime.operators" in modules
    assert "lockgate.runtime.async_io" not in modules  # no asynchronous operator
    remote = forks.task_modules(build_job_graph(p), "s3://bucket/checkpoints")
    assert "pyarrow.fs" in remote


def test_a_server_that_replaces_a_dead_one_imports_what_the_driver_preloaded(
        tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("FORK_TEST_OUT", str(out))
    forks.prestart(PRELOADED)
    second = replaced_server()
    _, codes = spawn(second, "modules")
    assert codes.get(timeout=60) == 0
    assert out.read_text() == " ".join(PRELOADED)


class Lookup(AsyncFunction):
    async def invoke(self, x):  # type: ignore[no-untyped-def]
        return x


def test_a_job_with_an_asynchronous_operator_preloads_its_runtime_operator() -> None:
    p = Pipeline("async-modules", checkpoint=CheckpointConfig(storage="/tmp/unused"))
    p.source(KafkaSource("localhost:1", "in", bounded=True), uid="in") \
        .async_map(Lookup(), uid="lookup").sink(KafkaSink("localhost:1", "out"), uid="out")
    modules = forks.task_modules(build_job_graph(p), p.checkpoint.storage)
    assert "lockgate.runtime.async_io" in modules
