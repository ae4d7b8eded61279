"""The ``local`` launcher: every task is a process of its own on this machine.

Tasks are forked by the driver's fork server (:mod:`lockgate.cluster.local.forks`),
which imported the task code once: a restart after a failure costs a fork,
not an interpreter and its imports. Without a fork server (it cannot start,
or ``fork_server = False``) each task is ``python -m lockgate.runtime.task_main``.

The fork server is one of the job's processes: when it dies (or stops
answering) while it starts an attempt's tasks, the tasks it could not start
are reported as exited (exit code unknown), so the attempt fails and the job
restarts on a new server, as after any task's death.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import cloudpickle

from lockgate.cluster.events import TaskEvent, TaskExited
from lockgate.cluster.local import forks
from lockgate.runtime.spec import TaskSpec

log = logging.getLogger("lockgate.driver")

STOP_TIMEOUT = 10.0
"""Seconds ``stop`` waits for the killed tasks of the fork server before it
kills the server itself (a server that no longer answers; its tasks die with it)."""


class LocalLauncher:
    name = "local"
    fork_server = True
    """Fork tasks from the fork server (else: a new interpreter per task)."""

    def __init__(self, events: queue.Queue[TaskEvent]) -> None:
        self.events = events
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._forked: dict[int, tuple[int, threading.Event]] = {}
        """Tasks of the fork server: pid and a flag set when it has exited."""
        self._server: forks.ForkServer | None = None

    def start(self, specs: list[TaskSpec], coordinator: tuple[str, int], secret: bytes) -> None:
        server = None
        if self.fork_server:
            try:
                server = forks.server()
            except OSError:
                server = None
        self._server = server
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        for spec in specs:
            payload = cloudpickle.dumps((spec, coordinator, secret))
            if server is not None:
                gone = threading.Event()
                try:
                    pid = server.spawn(payload, self._on_exit(spec.attempt, spec.task_id, gone))
                except OSError as e:  # the server died: the attempt fails, not the job
                    log.warning("task %d of attempt %d not started: %s", spec.task_id,
                                spec.attempt, e)
                    self.events.put(TaskExited(spec.attempt, spec.task_id, None))
                    return
                self._forked[spec.task_id] = (pid, gone)
                continue
            proc = subprocess.Popen(
                [sys.executable, "-m", "lockgate.runtime.task_main"],
                stdin=subprocess.PIPE, env=env, start_new_session=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(payload)
            proc.stdin.close()
            self._procs[spec.task_id] = proc
            threading.Thread(target=self._watch, args=(spec.attempt, spec.task_id, proc),
                             daemon=True, name=f"watch-{spec.task_id}").start()

    def _on_exit(self, attempt: int, task: int, gone: threading.Event) -> forks.OnExit:
        def exited(code: int | None) -> None:
            gone.set()
            self.events.put(TaskExited(attempt, task, code))
        return exited

    def _watch(self, attempt: int, task: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self.events.put(TaskExited(attempt, task, code))

    def pids(self) -> dict[int, int]:
        """Process id of every running task, by global task number (for tests)."""
        pids = {t: p.pid for t, p in self._procs.items() if p.poll() is None}
        pids.update({t: pid for t, (pid, gone) in self._forked.items() if not gone.is_set()})
        return pids

    def stalled(self) -> None:
        """Nothing to drop: a fork server that stops answering is replaced
        when a spawn times out (:mod:`lockgate.cluster.local.forks`)."""

    def stop(self) -> None:
        """Kill every task of the attempt and wait until all are gone: no zombie
        of this attempt can write after ``stop`` returns."""
        for pid, gone in self._forked.values():
            if not gone.is_set():
                assert self._server is not None
                self._server.kill(pid)
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT
        for _, gone in self._forked.values():
            if not gone.wait(max(0.0, deadline - time.monotonic())):
                assert self._server is not None
                self._server.end(f"its tasks were not gone {STOP_TIMEOUT:.0f} s after they "
                                 "were killed")
                gone.wait()
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()
        self._forked.clear()
