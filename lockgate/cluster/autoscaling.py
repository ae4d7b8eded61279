"""The autoscaler in a running job: :class:`AutoscaleDriver`, the job
master's thin part that feeds :class:`~lockgate.cluster.autoscaler.Autoscaler`
(pure decisions) with the tasks' figures, asks it about once a second, and
applies its decisions as a per-vertex rescale (``JobMaster.submit("rescale",
vertices=...)``, as ``lockgate rescale JOB --vertex uid=N`` does). Every
decision is logged with its inputs and kept for the REST API and the
dashboard (``GET /jobs/<id>/autoscaler``; docs/elasticity.md).

Everything here runs on the job master's loop, except :meth:`snapshot`
(REST threads), which copies under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any

from lockgate.cluster.autoscaler import Autoscaler, Decision, Evaluation, Sample, shapes
from lockgate.config import AutoscalerConfig
from lockgate.graph.jobgraph import JobGraph
from lockgate.protocol import TaskMetrics

__all__ = ["AutoscaleDriver", "MAX_DECISIONS_SHOWN"]

log = logging.getLogger("lockgate.autoscaler")

EVERY = 1.0
"""Seconds between two evaluations (tasks report once a second)."""
MAX_DECISIONS_SHOWN = 200
"""Decisions kept for the REST API and the dashboard (the count is exact beyond it)."""

Submit = Callable[..., "Future[dict[str, Any]]"]


class AutoscaleDriver:
    """Applies one job's autoscaler (see the module)."""

    def __init__(self, config: AutoscalerConfig, graph: JobGraph, submit: Submit,
                 slots: Callable[[], int | None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.config = config
        self.autoscaler = Autoscaler(config, graph.max_parallelism,
                                     shapes(graph, config.exclude))
        self._submit = submit
        """``JobMaster.submit``: the rescale request."""
        self._slots = slots
        """The tasks the launcher can run at once (None: no limit)."""
        self.clock = clock
        self._lock = threading.Lock()
        self._decisions: list[dict[str, Any]] = []
        self._decision_count = 0
        self._evaluations: list[dict[str, Any]] = []
        self._evaluated_at: float | None = None
        self._state = "waiting for every task to run"
        self._next = 0.0
        self._in_flight: Future[dict[str, Any]] | None = None
        self._retry_at = 0.0
        self._input_ended = False

    # ------------------------------------------------ job master's loop
    def use_graph(self, graph: JobGraph) -> None:
        """The job was rescaled: its vertices' evaluations are the old graph's."""
        self.autoscaler.use_graph(shapes(graph, self.config.exclude))
        with self._lock:
            self._evaluations = []

    def start_attempt(self) -> None:
        self.autoscaler.start_attempt()
        self._input_ended = False

    def running(self) -> None:
        """Every task of the attempt runs."""
        self.autoscaler.running(self.clock())

    def input_ended(self) -> None:
        """A source of the attempt read all its input: the job winds down."""
        self._input_ended = True

    def on_metrics(self, task: int, figures: TaskMetrics) -> None:
        elapsed = figures.busy + figures.backpressured + figures.idle  # the task's clock
        self.autoscaler.on_sample(task, Sample(self.clock(), figures.records_in,
                                               figures.records_out, figures.busy,
                                               figures.backlog, elapsed))

    def tick(self, busy: str | None) -> None:
        """Evaluate (at most every :data:`EVERY` s) and ask for the rescale
        the autoscaler decides on; ``busy``: why the job cannot rescale now
        (a rescale or a stop in progress), or None."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + EVERY
        blocked = busy or self._blocked(now)
        if blocked is not None:
            self._set_state(blocked)
            return
        status = self.autoscaler.status(now)
        if status != "ready":
            self._set_state(status)
            return
        evaluations, decision = self.autoscaler.evaluate(now)
        if decision is not None and any(e.proposed > e.parallelism for e in decision.changes):
            slots = self._slots()
            if slots is not None:
                evaluations, decision = self.autoscaler.fit(evaluations, slots)
        with self._lock:
            self._evaluations = [e.as_dict() for e in evaluations]
            self._evaluated_at = time.time()
        self._set_state("evaluating" if decision is None else "rescaling")
        if decision is not None:
            self._apply(decision, now)

    def _blocked(self, now: float) -> str | None:
        if self._input_ended:
            return "a source read all its input: no more decisions"
        if self._in_flight is not None and not self._in_flight.done():
            return "rescaling"
        if now < self._retry_at:
            return f"a rescale failed: next evaluation in {self._retry_at - now:.0f} s"
        return None

    def _apply(self, decision: Decision, now: float) -> None:
        """Ask for ``decision``'s rescale; log and keep it."""
        wall = time.time()
        with self._lock:
            rows = [self._row(e, wall) for e in decision.changes]
            self._decisions.extend(rows)
            self._decision_count += len(rows)
            del self._decisions[:-MAX_DECISIONS_SHOWN]
        for e in decision.changes:
            log.info("autoscaler: %s from %d to %d: %s (inputs %s)", e.vertex, e.parallelism,
                     e.proposed, e.reason, e.inputs())
        future = self._submit("rescale", vertices=dict(decision.vertices))
        self._in_flight = future
        future.add_done_callback(lambda f: self._done(f, decision, rows))

    @staticmethod
    def _row(e: Evaluation, wall: float) -> dict[str, Any]:
        return {"time": wall, "vertex": e.vertex, "uid": e.uid, "from": e.parallelism,
                "to": e.proposed, "why": e.reason, "inputs": e.inputs(),
                "status": "requested", "seconds": None}

    def _done(self, future: Future[dict[str, Any]], decision: Decision,
              rows: list[dict[str, Any]]) -> None:
        """The rescale's outcome: done (the cool-down starts now, with the new
        parallelism running) or failed (nothing is decided for a window)."""
        error = future.exception()
        if error is None:
            self.autoscaler.applied(decision, self.clock())
        with self._lock:
            for row in rows:
                if error is None:
                    row["status"] = "done"
                    row["seconds"] = future.result().get("seconds")
                else:
                    row["status"] = f"failed: {error}"
        if error is not None:
            log.warning("autoscaler: the rescale of %s failed: %s",
                        ", ".join(r["vertex"] for r in rows), error)
            self._retry_at = self.clock() + self.config.window

    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state

    # ---------------------------------------------------------- any thread
    def snapshot(self) -> dict[str, Any]:
        """The settings, the state, the latest evaluation of every vertex
        and the decisions: JSON-ready."""
        with self._lock:
            return {"enabled": True, "config": {**asdict(self.config),
                                                "exclude": list(self.config.exclude)},
                    "state": self._state, "evaluated_at": self._evaluated_at,
                    "vertices": [dict(e) for e in self._evaluations],
                    "decisions": [{**r, "inputs": dict(r["inputs"])} for r in self._decisions],
                    "decision_count": self._decision_count}
