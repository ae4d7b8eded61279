"""The ``local`` launcher: every task is a subprocess of the driver."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import cloudpickle

from lockgate.cluster.events import TaskEvent, TaskExited
from lockgate.runtime.spec import TaskSpec


class LocalLauncher:
    name = "local"

    def __init__(self, events: queue.Queue[TaskEvent]) -> None:
        self.events = events
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, specs: list[TaskSpec], coordinator: tuple[str, int], secret: bytes) -> None:
        env = dict(os.environ)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        for spec in specs:
            payload = cloudpickle.dumps((spec, coordinator, secret))
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

    def _watch(self, attempt: int, task: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self.events.put(TaskExited(attempt, task, code))

    def pids(self) -> dict[int, int]:
        """Process id of every running task, by global task number (for tests)."""
        return {t: p.pid for t, p in self._procs.items() if p.poll() is None}

    def stop(self) -> None:
        """Kill every task of the attempt and wait until all are gone: no zombie
        of this attempt can write after ``stop`` returns."""
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()
