"""The autoscaler's decisions — pure: :class:`Autoscaler`.

Fed with the figures every task reports about once a second (records in and
out, seconds busy, the source's backlog; :class:`Sample`), it answers, when
asked (:meth:`Autoscaler.evaluate`), each vertex's parallelism, as Flink's
Kubernetes autoscaler does:

* a vertex's **true processing rate** per subtask is the records it
  processed over the time its tasks were busy (records/s / busy share: a
  task blocked on its output or waiting for input is not busy);
* its **input rate** is what it would receive if nothing held it back: a
  source's is the records it read plus the growth of its backlog (what it
  could read but has not: Kafka lag, records due) plus the backlog worked
  off in ``catch_up`` seconds; a vertex downstream gets its inputs' input
  rates times their records out per record in (what they would send it,
  not what it took);
* the parallelism that keeps up with it is
  ``ceil(input rate / (true rate x target_utilization))``, within
  ``[min, max]``, ``max_parallelism`` and the task slots there are.

It acts only when the utilization at the current parallelism
(input rate / (true rate x parallelism)) leaves ``target_utilization +/-
utilization_boundary`` (hysteresis), never from metrics of the first
``stabilization`` seconds of an attempt (start, restart, rescale), only
over a full ``window`` of them, and never scales a vertex back within
``cooldown`` seconds of its last change. Time is whatever clock the caller
uses (seconds); nothing here reads one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lockgate.config import AutoscalerConfig
from lockgate.graph.jobgraph import JobGraph

__all__ = ["Autoscaler", "Decision", "Evaluation", "Sample", "VertexShape", "shapes",
           "tasks_at_most"]

BUSY_FLOOR = 1e-3
"""Busy subtask-seconds per second below which a vertex counts as idle (its
true rate cannot be told, and it needs no more tasks)."""
SETTLED = 0.2
"""A vertex's input rate has settled when the rates of the two halves of the
window are within this share of each other."""
STALE = 5.0
"""Seconds after which a task's last report is too old to decide on."""


def _middle(kept: deque[Sample]) -> Sample:
    """The sample nearest the middle of the window (not its first, when it can)."""
    mid = (kept[0].at + kept[-1].at) / 2
    inner = list(kept)[1:-1] or [kept[0]]
    return min(inner, key=lambda s: abs(s.at - mid))


@dataclass(frozen=True)
class Sample:
    """One report of a task: its counters since its attempt started."""

    at: float
    records_in: int
    records_out: int
    busy: float
    """Seconds busy since the task started."""
    backlog: int | None = None
    """Records its source could read now and has not (None: unknown, or no source)."""
    elapsed: float | None = None
    """Seconds since the task started, by its own clock (busy + backpressured +
    idle): rates are over it, not over when the reports arrived (None: ``at``)."""


@dataclass(frozen=True)
class VertexShape:
    """What the autoscaler knows of a vertex of the job graph."""

    id: int
    name: str
    """``uid -> uid`` of its chain."""
    uid: str
    """Its first operator's uid: how a rescale names it."""
    parallelism: int
    first_task: int
    inputs: tuple[tuple[int, bool], ...]
    """Its upstream vertices, each with whether it reads their main output
    (not a side output)."""
    source: bool
    excluded: bool = False


def shapes(graph: JobGraph, exclude: tuple[str, ...] = ()) -> list[VertexShape]:
    """The vertices of ``graph`` in topological order (as the graph lists
    them); a vertex with an operator in ``exclude`` is left alone."""
    offsets = graph.task_offsets()
    main = {(u.id, e.downstream) for u in graph.vertices for e in u.outputs if e.tag is None}
    return [VertexShape(v.id, v.name, v.operators[0].uid, v.parallelism, offsets[v.id],
                        tuple((e.upstream, (e.upstream, v.id) in main) for e in v.inputs),
                        v.is_source, any(op.uid in exclude for op in v.operators))
            for v in graph.vertices]


def tasks_at_most(graph: JobGraph, config: AutoscalerConfig | None) -> int:
    """The tasks of ``graph`` with every vertex the autoscaler may scale at
    its largest parallelism (without an autoscaler: the graph's): what a
    Spark session Lockgate starts for the job has slots for."""
    if config is None:
        return graph.num_tasks
    top = min(config.max or graph.max_parallelism, graph.max_parallelism)
    excluded = {v.id for v in shapes(graph, config.exclude) if v.excluded}
    return sum(v.parallelism if v.id in excluded else max(v.parallelism, top)
               for v in graph.vertices)


@dataclass(frozen=True)
class Evaluation:
    """One vertex as the autoscaler judged it: its inputs and its answer."""

    vertex: str
    uid: str
    parallelism: int
    proposed: int
    reason: str
    input_rate: float
    """Records/s it should keep up with."""
    processing_rate: float
    """Records/s it processed over the window."""
    busy: float
    """Mean share of time its tasks were busy (0..1)."""
    true_rate: float | None
    """Records/s one subtask processes when busy all the time (None: too idle to tell)."""
    utilization: float | None
    """``input_rate / (true_rate x parallelism)``."""
    needed: float | None
    """Subtasks that keep up with ``input_rate`` at the target utilization."""
    backlog: int | None = None
    backlog_growth: float | None = None

    def inputs(self) -> dict[str, Any]:
        """The figures it was decided from, JSON-ready (rounded)."""
        def r(x: float | None, digits: int = 3) -> float | None:
            return None if x is None else round(x, digits)

        return {"input_rate": r(self.input_rate, 1), "processing_rate": r(self.processing_rate, 1),
                "busy": r(self.busy), "true_rate": r(self.true_rate, 1),
                "utilization": r(self.utilization), "needed": r(self.needed),
                "backlog": self.backlog, "backlog_growth": r(self.backlog_growth, 1)}

    def as_dict(self) -> dict[str, Any]:
        return {"vertex": self.vertex, "uid": self.uid, "parallelism": self.parallelism,
                "proposed": self.proposed, "reason": self.reason, **self.inputs()}


@dataclass(frozen=True)
class Decision:
    """A rescale the autoscaler asks for: ``vertices`` (uid -> parallelism),
    each change with its evaluation."""

    vertices: dict[str, int]
    changes: list[Evaluation]


@dataclass
class _Window:
    """One vertex's figures over the window."""

    rate: float = 0.0
    out_rate: float = 0.0
    busy: float = 0.0
    """Busy subtask-seconds per second (the sum over its subtasks)."""
    backlog: int | None = 0
    growth: float | None = 0.0


@dataclass
class _Change:
    at: float
    up: bool


@dataclass
class Autoscaler:
    """The decisions of one job's autoscaler (see the module)."""

    config: AutoscalerConfig
    max_parallelism: int
    vertices: list[VertexShape]
    running_since: float | None = None
    """When every task of the current attempt ran (None: it does not yet)."""
    _samples: dict[int, deque[Sample]] = field(default_factory=dict)
    _changes: dict[str, _Change] = field(default_factory=dict)
    """The last change of each vertex (by uid), for the cool-down."""
    _unsettled: dict[str, float] = field(default_factory=dict)
    """Since when a vertex's change waits for its input rate to settle."""

    @property
    def ceiling(self) -> int:
        """The largest parallelism it gives a vertex."""
        top = self.config.max if self.config.max is not None else self.max_parallelism
        return max(1, min(top, self.max_parallelism))

    @property
    def floor(self) -> int:
        return min(self.config.min, self.ceiling)

    # ------------------------------------------------------------ feeding
    def use_graph(self, vertices: list[VertexShape]) -> None:
        """The job runs another graph from its next attempt (a rescale)."""
        self.vertices = vertices
        self.start_attempt()

    def start_attempt(self) -> None:
        """A new attempt starts: its tasks count from zero; nothing is known."""
        self.running_since = None
        self._samples = {}

    def running(self, now: float) -> None:
        """Every task of the attempt runs: the stabilization period starts."""
        self.running_since = now
        self._samples = {}
        self._unsettled = {}

    def on_sample(self, task: int, sample: Sample) -> None:
        """A task's report (kept only once the attempt is stable)."""
        since = self.running_since
        if since is None or sample.at < since + self.config.stabilization:
            return
        kept = self._samples.setdefault(task, deque())
        if kept and sample.at <= kept[-1].at:
            return
        kept.append(sample)
        start = sample.at - self.config.window
        while len(kept) > 2 and kept[1].at <= start:
            kept.popleft()

    def status(self, now: float) -> str:
        """Why no decision can be made now, or ``ready``."""
        since = self.running_since
        if since is None:
            return "waiting for every task to run"
        stable = since + self.config.stabilization
        if now < stable:
            return f"stabilizing ({stable - now:.0f} s left)"
        span, newest = self._span()
        if span < self.config.window:
            return f"collecting metrics ({span:.0f} of {self.config.window:g} s)"
        if now - newest > STALE:
            return f"a task has not reported for {now - newest:.0f} s"
        return "ready"

    def _span(self) -> tuple[float, float]:
        """The seconds of metrics every task of the graph has in its window,
        and when the task that reported least recently did."""
        spans, last = [], []
        for v in self.vertices:
            for t in range(v.first_task, v.first_task + v.parallelism):
                kept = self._samples.get(t)
                spans.append(kept[-1].at - kept[0].at if kept and len(kept) > 1 else 0.0)
                last.append(kept[-1].at if kept else float("-inf"))
        return min(spans, default=0.0), min(last, default=float("-inf"))

    # ---------------------------------------------------------- deciding
    def evaluate(self, now: float, slots: int | None = None
                 ) -> tuple[list[Evaluation], Decision | None]:
        """Every vertex's evaluation, and the rescale to ask for (None: none
        is needed, or the metrics do not allow one yet: :meth:`status`).
        ``slots``: the tasks the launcher can run at once (None: no limit)."""
        if self.status(now) != "ready":
            return [], None
        # each task's first, middle and last sample of the window, once
        ends = {t: (kept[0], _middle(kept), kept[-1]) for t, kept in self._samples.items()}
        whole = self._targets(lambda t: (ends[t][0], ends[t][2]))
        early = self._targets(lambda t: (ends[t][0], ends[t][1]))
        late = self._targets(lambda t: (ends[t][1], ends[t][2]))
        evaluations = [self._judge(v, *whole[v.id], early[v.id][1], late[v.id][1], now)
                       for v in self.vertices]
        return self.fit(evaluations, slots)

    def fit(self, evaluations: list[Evaluation], slots: int | None
            ) -> tuple[list[Evaluation], Decision | None]:
        """``evaluations`` with their scale-ups cut down to ``slots`` task
        slots (None: no limit), and the rescale they ask for (None: none)."""
        evaluations = self._fit_slots(evaluations, slots)
        changes = [e for e in evaluations if e.proposed != e.parallelism]
        if not changes:
            return evaluations, None
        return evaluations, Decision({e.uid: e.proposed for e in changes}, changes)

    def applied(self, decision: Decision, now: float) -> None:
        """``decision``'s rescale is done (its tasks run) at ``now``: its
        vertices' cool-down starts."""
        for e in decision.changes:
            self._changes[e.uid] = _Change(now, e.proposed > e.parallelism)

    def _targets(self, pick: Callable[[int], tuple[Sample, Sample]]
                 ) -> dict[int, tuple[_Window, float]]:
        """Each vertex's figures between the two samples ``pick`` gives of every
        task, and the input rate it should keep up with (in topological order)."""
        out: dict[int, tuple[_Window, float]] = {}
        factors: dict[int, float] = {}
        for v in self.vertices:
            w = self._window(v, pick)
            if v.source:
                target = w.rate
                if w.growth is not None:
                    target = max(0.0, target + w.growth)
                if w.backlog and self.config.catch_up is not None:
                    target += w.backlog / self.config.catch_up
                factors[v.id] = target / w.rate if w.rate > 0 else 1.0
            else:
                # what its inputs would send it: their input rates times their
                # records out per record in (not what it took: records queue
                # up in front of a slow vertex); a side output's records are
                # not counted by its vertex: what the vertex took of them, as
                # far as their vertex falls short of its input rate
                target, main, side = 0.0, 0.0, []
                for u, is_main in v.inputs:
                    uw, ut = out[u]
                    if is_main:
                        target += ut * (uw.out_rate / uw.rate if uw.rate > 0 else 0.0)
                        main += uw.out_rate
                    else:
                        side.append(factors[u])
                if side:
                    target += max(0.0, w.rate - main) * max(side)
                factors[v.id] = target / w.rate if w.rate > 0 else 1.0
            out[v.id] = (w, target)
        return out

    def _window(self, v: VertexShape,
                pick: Callable[[int], tuple[Sample, Sample]]) -> _Window:
        w = _Window()
        for t in range(v.first_task, v.first_task + v.parallelism):
            first, last = pick(t)
            dt = (last.elapsed - first.elapsed
                  if last.elapsed is not None and first.elapsed is not None
                  else last.at - first.at)
            if dt <= 0:
                w.backlog, w.growth = None, None
                continue
            w.rate += max(0, last.records_in - first.records_in) / dt
            w.out_rate += max(0, last.records_out - first.records_out) / dt
            w.busy += min(1.0, max(0.0, last.busy - first.busy) / dt)
            if last.backlog is None or first.backlog is None or w.backlog is None \
                    or w.growth is None:
                w.backlog, w.growth = None, None
            else:
                w.backlog += last.backlog
                w.growth += (last.backlog - first.backlog) / dt
        if not v.source:
            w.backlog, w.growth = None, None
        return w

    def _judge(self, v: VertexShape, w: _Window, target: float, early: float, late: float,
               now: float) -> Evaluation:
        cfg = self.config
        p, lo, hi = v.parallelism, self.floor, self.ceiling
        busy = w.busy / p
        true_rate = w.rate / w.busy if w.busy > BUSY_FLOOR and w.rate > 0 else None
        if true_rate is None and w.rate > 0:  # processed records without being busy
            needed: float | None = 0.0
            utilization: float | None = 0.0
        elif true_rate is None:
            needed = utilization = 0.0 if target == 0 else None
        else:
            needed = target / (true_rate * cfg.target_utilization)
            utilization = target / (true_rate * p)

        def result(proposed: int, reason: str) -> Evaluation:
            return Evaluation(v.name, v.uid, p, proposed, reason, target, w.rate, busy,
                              true_rate, utilization, needed, w.backlog, w.growth)

        if v.excluded:
            return result(p, "excluded from autoscaling")
        if needed is None or utilization is None:
            return result(p, "it processed no record in the window: its rate is unknown")
        wanted = max(lo, min(hi, max(1, math.ceil(needed - 1e-9))))
        upper = cfg.target_utilization + cfg.utilization_boundary
        lower = cfg.target_utilization - cfg.utilization_boundary
        figures = (f"input {target:,.0f} rec/s, true rate "
                   + (f"{true_rate:,.0f} rec/s per subtask" if true_rate else "unbounded (idle)")
                   + f", utilization {utilization:.2f} at parallelism {p}")
        if p < lo or p > hi:
            self._unsettled.pop(v.uid, None)
            return result(max(lo, min(hi, p)), f"parallelism {p} is outside {lo}..{hi}")
        if wanted > p and utilization > upper:
            proposed, why = wanted, (f"{figures} is above {upper:.2f}: {needed:.2f} subtasks "
                                     f"keep up at {cfg.target_utilization:g}")
        elif wanted < p and utilization < lower:
            proposed, why = wanted, (f"{figures} is below {lower:.2f}: {needed:.2f} subtasks "
                                     f"keep up at {cfg.target_utilization:g}")
        else:
            self._unsettled.pop(v.uid, None)
            if utilization > upper and p >= hi:
                return result(p, f"{figures}: it would need {needed:.2f} subtasks, at most {hi}")
            return result(p, f"{figures}: within {lower:.2f}..{upper:.2f}"
                          if lower <= utilization <= upper else f"{figures}: stays at {p}")
        last = self._changes.get(v.uid)
        if last is not None and last.up != (proposed > p) and now < last.at + cfg.cooldown:
            return result(p, f"{why}; held back: scaled {'up' if last.up else 'down'} "
                          f"{now - last.at:.0f} s ago (cool-down {cfg.cooldown:g} s)")
        # The input still changes within the window (a step, a ramp): its
        # mean is not yet the new rate. Wait for it to settle (at most two
        # windows), or a step would be followed in several rescales.
        if abs(early - late) > SETTLED * max(early, late, 1.0):
            since = self._unsettled.setdefault(v.uid, now)
            if now < since + 2 * cfg.window:
                return result(p, f"{why}; waiting for its input to settle ({early:,.0f} then "
                              f"{late:,.0f} rec/s over the window's halves)")
        self._unsettled.pop(v.uid, None)
        return result(proposed, why)

    def _fit_slots(self, evaluations: list[Evaluation], slots: int | None) -> list[Evaluation]:
        """Scale-ups cut down (the largest first) until every task has a slot."""
        if slots is None:
            return evaluations
        proposed = [e.proposed for e in evaluations]
        while sum(proposed) > slots:
            grow = [(proposed[i] - e.parallelism, i) for i, e in enumerate(evaluations)
                    if proposed[i] > e.parallelism]
            if not grow:
                break
            proposed[max(grow)[1]] -= 1
        out = []
        for e, n in zip(evaluations, proposed, strict=True):
            if n != e.proposed:
                note = (f"; {n}" if n > e.parallelism else f"; kept at {n}") + \
                    f" for want of task slots ({slots} in all)"
                e = Evaluation(e.vertex, e.uid, e.parallelism, n, e.reason + note,
                               e.input_rate, e.processing_rate, e.busy, e.true_rate,
                               e.utilization, e.needed, e.backlog, e.backlog_growth)
            out.append(e)
        return out
