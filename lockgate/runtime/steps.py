"""When each start-up step of a task happened: the task's half of the
breakdown of a cold start or a recovery (:mod:`lockgate.cluster.startup`).

A task marks its steps on the wall clock (``time.time()``: the driver and the
tasks of one machine share it; across machines the skew of their clocks
adds in) and sends them in :class:`~lockgate.protocol.Running`. The names,
in the order they happen:

``entry``     the launcher's code runs in the task's process (after the
              interpreter started, or after the fork);
``imported``  Lockgate's task code is imported and the spec unpickled;
``leased``    (Spark) the task holds its lease;
``connected`` control connection authenticated, :class:`Register` sent;
``restored``  operators opened, state restored;
``started``   :class:`Start` (every task's address) received;
``outputs``   output channels connected;
``inputs``    every input channel connected;
``running``   :class:`Running` sent: records flow.
"""

from __future__ import annotations

import time

TASK_STEPS = ("entry", "imported", "leased", "connected", "restored", "started", "outputs",
              "inputs", "running")
"""The steps a task may report, in order (the protocol refuses others)."""

Steps = dict[str, float]
"""Step name -> wall-clock time (seconds since the epoch)."""


def mark(steps: Steps, name: str, at: float | None = None) -> None:
    """Record that ``name`` happened now (or ``at``); the first time counts."""
    steps.setdefault(name, time.time() if at is None else at)
