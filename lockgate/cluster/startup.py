"""Where the time of a cold start or a recovery goes: the driver's steps and
every task's (:mod:`lockgate.runtime.steps`) of each attempt, on one clock.

The driver marks, in order (those that apply):

``run``          the job is submitted (``Pipeline.run``/``start``, before any check);
``session``      (Spark) the SparkContext is ready: JVM, session, task slots;
``master``       the job master is built (job folder, control server);
``killed``       (benchmarks) when a test or benchmark killed a task;
``failed``       the failure of the previous attempt is seen by the job master;
``cause``        its root cause is known (a broken channel waits for the report);
``stopped``      every task of the previous attempt is gone;
``launch``       the launcher starts this attempt's tasks;
``submitted``    (Spark) the barrier stage is submitted;
``registered``   every task registered: ``Start`` goes out;
``running``      every task is running.

The tasks' steps come in between (``entry`` ... ``running``), each taken
from the slowest task: that is the one the attempt waits for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from lockgate.runtime.steps import TASK_STEPS, Steps, mark

log = logging.getLogger("lockgate.driver")

DRIVER_BEFORE = ("run", "session", "master", "killed", "failed", "cause", "stopped", "launch",
                 "submitted")
"""Driver steps before the tasks' own."""
ORDER = (*DRIVER_BEFORE, "task entry", "imported", "leased", "connected", "restored",
         "registered", "started", "outputs", "inputs", "task running", "running")
"""Every step of the timeline in order: a task step is the slowest task's
(``entry`` and ``running`` are called ``task entry`` and ``task running``)."""
_TASK_NAMES = {"entry": "task entry", "running": "task running"}


@dataclass
class AttemptSteps:
    """The steps of one attempt: the driver's, and each task's by task number."""

    attempt: int
    driver: Steps = field(default_factory=dict)
    tasks: dict[int, Steps] = field(default_factory=dict)

    def timeline(self) -> list[tuple[str, float]]:
        """Every step that happened with its time (a task step: the latest
        over the tasks), in the order they happened: the driver's
        ``registered`` (the last task connected) may come before or after the
        slowest task ``restored`` its state, and the driver hears of
        ``running`` after records flow."""
        times: dict[str, float] = dict(self.driver)
        for name in TASK_STEPS:
            values = [steps[name] for steps in self.tasks.values() if name in steps]
            if values:
                times[_TASK_NAMES.get(name, name)] = max(values)
        order = {name: i for i, name in enumerate(ORDER)}
        return sorted(((name, t) for name, t in times.items() if name in order),
                      key=lambda step: (step[1], order[step[0]]))

    def breakdown(self) -> list[tuple[str, float]]:
        """Seconds from each step to the next, named by the step they end in."""
        line = self.timeline()
        return [(name, max(0.0, t - line[i - 1][1])) for i, (name, t) in enumerate(line) if i > 0]

    def total(self) -> float | None:
        line = self.timeline()
        return line[-1][1] - line[0][1] if len(line) > 1 else None

    def describe(self) -> str:
        parts = ", ".join(f"{name} +{seconds * 1000:.0f} ms" for name, seconds in
                          self.breakdown())
        total = self.total()
        return f"attempt {self.attempt} up in {total or 0.0:.3f} s: {parts}"


class StartupLog:
    """The steps of every attempt of a job (``JobMaster.startup``)."""

    def __init__(self) -> None:
        self.attempts: list[AttemptSteps] = []
        self._next: Steps = {}
        """Steps marked before the attempt they belong to exists."""

    @property
    def current(self) -> AttemptSteps | None:
        return self.attempts[-1] if self.attempts else None

    def mark(self, name: str, at: float | None = None) -> None:
        """A driver step of the coming attempt (``run`` ... ``stopped``) or of
        the current one (``submitted`` on)."""
        if name in DRIVER_BEFORE[:DRIVER_BEFORE.index("launch")] or self.current is None:
            mark(self._next, name, at)
        else:
            mark(self.current.driver, name, at)

    def begin(self, attempt: int) -> None:
        """Attempt ``attempt`` is being launched now."""
        steps = AttemptSteps(attempt, self._next)
        self._next = {}
        mark(steps.driver, "launch")
        self.attempts.append(steps)

    def task_running(self, task: int, steps: Steps, all_running: bool,
                     launcher_steps: Steps | None = None) -> None:
        """Task ``task`` runs (its ``steps``); with ``all_running``, every task
        does, and the launcher's own steps (``submitted``) join the driver's."""
        current = self.current
        if current is None:
            return
        current.tasks[task] = dict(steps)
        if all_running:
            for name, at in (launcher_steps or {}).items():
                mark(current.driver, name, at)
            mark(current.driver, "running", time.time())
            log.debug("%s", current.describe())
