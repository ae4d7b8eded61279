"""Steps a fault test's driver takes while its job runs (``sums_job.py
--plan``): ``kill`` SIGKILLs a random task of the running attempt, ``N``
rescales the job to parallelism ``N`` (``JobClient.rescale``), ``bad:N``
asks for a rescale to ``N`` that must be refused, ``killing:N`` asks for a
rescale to ``N`` and SIGKILLs a random task of the running attempt while it
happens (within 0.3 s of the request). Each step waits for every
task of the newest attempt to run and for a checkpoint completed since the
step before, so records flow and are committed between steps."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

from tests.fault.checks import task_processes


class Plan(threading.Thread):
    def __init__(self, client: Any, steps: list[str], seed: int = 0,
                 timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.steps = steps
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.checkpoints = 0
        self.progress = threading.Condition()
        self.log: list[dict[str, Any]] = []
        self.error: str | None = None

    def on_progress(self, progress: Any) -> None:
        with self.progress:
            self.checkpoints = progress.checkpoints_completed
            self.progress.notify_all()

    def run(self) -> None:
        try:
            for step in self.steps:
                self._ready()
                self.log.append(self._do(step))
        except Exception as e:  # reported in the driver's output, failing the test
            self.error = f"{type(e).__name__}: {e}"

    def _ready(self) -> None:
        """Every task of the newest attempt runs, and a checkpoint completed."""
        deadline = time.monotonic() + self.timeout
        with self.progress:
            seen = self.checkpoints
            self.progress.wait_for(lambda: self.checkpoints > seen,
                                   timeout=deadline - time.monotonic())
        while time.monotonic() < deadline:
            tasks = task_processes(os.getpid())
            newest = max((a for a, _ in tasks.values()), default=-1)
            running = [p for p, (a, _) in tasks.items() if a == newest]
            if newest >= 0 and newest == self.client.status()["attempt"] and \
                    len(running) == self.client.master.graph.num_tasks:
                return
            time.sleep(0.01)  # polling /proc: no event to await here
        raise AssertionError("the job's tasks did not all run in time")

    def _do(self, step: str) -> dict[str, Any]:
        if step == "kill":
            tasks = task_processes(os.getpid())
            newest = max(a for a, _ in tasks.values())
            victim = self.rng.choice(sorted(p for p, (a, _) in tasks.items() if a == newest))
            os.kill(victim, signal.SIGKILL)
            return {"step": "kill", "attempt": newest}
        if step.startswith("bad:"):
            n = int(step[4:])
            try:
                self.client.rescale(n)
            except Exception as e:
                return {"step": step, "refused": str(e)}
            raise AssertionError(f"the rescale to {n} was not refused")
        if step.startswith("killing:"):
            tasks = task_processes(os.getpid())
            newest = max(a for a, _ in tasks.values())
            victim = self.rng.choice(sorted(p for p, (a, _) in tasks.items() if a == newest))
            future = self.client.master.submit("rescale", parallelism=int(step[8:]))
            time.sleep(self.rng.uniform(0.0, 0.3))  # a moment of the rescale, by design
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return {"step": step, **future.result(self.timeout)}
        answer = self.client.rescale(int(step))
        return {"step": step, **answer}
