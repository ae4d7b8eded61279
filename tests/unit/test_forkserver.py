"""The local launcher's fork server (lockgate/cluster/local/forkserver.py, the
driver's side in lockgate/cluster/local/forks.py), with real processes: tasks are
forked children that report their exit codes, a kill reaches only a task
that has not ended, the driver's environment and import path reach each
task, and a server that dies leaves its tasks watched until they are gone."""

from __future__ import annotations

import os
import queue
import signal
import time

import cloudpickle
import pytest

from lockgate.cluster.local import forks


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
    os._exit(9)


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


def test_the_process_wide_server_is_replaced_when_it_died() -> None:
    first = forks.server()
    assert forks.server() is first
    first.proc.kill()
    first.proc.wait()
    second = forks.server()
    assert second is not first
    _, codes = spawn(second, "exit3")
    assert codes.get(timeout=60) == 3
