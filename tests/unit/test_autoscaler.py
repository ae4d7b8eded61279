"""The autoscaler's decisions, alone (pure: fed samples, asked at given
times): true processing rate = records / busy time, input rate from the
sources' rate and backlog, parallelism = ceil(input / (true rate x target
utilization)) within min, max, max_parallelism and the slots; nothing from
a stabilization period or an unfilled window; hysteresis and cool-down
against flapping; the settings checked."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from lockgate import AutoscalerConfig, Pipeline
from lockgate.cluster.autoscaler import Autoscaler, Decision, Sample, VertexShape, shapes
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import build_job_graph

CONFIG = AutoscalerConfig(min=1, max=6, target_utilization=0.7, utilization_boundary=0.2,
                          stabilization=5.0, window=10.0, cooldown=30.0, catch_up=20.0)


def job(source: int = 1, slow: int = 1, sink: int = 1) -> list[VertexShape]:
    """source -> slow -> sink, with these parallelisms."""
    return [VertexShape(0, "numbers", "numbers", source, 0, (), True),
            VertexShape(1, "slow", "slow", slow, source, ((0, True),), False),
            VertexShape(2, "sums -> out", "sums", sink, source + slow, ((1, True),), False)]


@dataclass
class Load:
    """A task's steady figures: records/s in, share of time busy, its
    source's backlog now and its growth per second."""

    rate: float
    busy: float
    backlog: int | None = None
    growth: float = 0.0


class Run:
    """An attempt of the job: its tasks report once a second from ``start``
    (their counters from zero), as the job master would feed them."""

    def __init__(self, scaler: Autoscaler, start: float) -> None:
        self.scaler, self.start, self.now = scaler, start, start
        self.records: dict[int, float] = {}
        self.busy: dict[int, float] = {}
        scaler.start_attempt()
        scaler.running(start)

    def report(self, seconds: float, loads: Callable[[float], dict[int, Load]]) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 1.0
            t = self.now - self.start
            for task, load in loads(self.now).items():
                records = self.records[task] = self.records.get(task, 0.0) + load.rate
                busy = self.busy[task] = self.busy.get(task, 0.0) + load.busy
                backlog = None if load.backlog is None else int(load.backlog + load.growth * t)
                self.scaler.on_sample(task, Sample(self.now, int(records), int(records), busy,
                                                   backlog))

    def decide(self, slots: int | None = None) -> dict[str, int] | None:
        _, decision = self.scaler.evaluate(self.now, slots)
        if decision is not None:
            self.scaler.applied(decision, self.now)
        return None if decision is None else decision.vertices


def steady(source: Load, slow: list[Load], sink: Load) -> Callable[[float], dict[int, Load]]:
    tasks = {0: source, **{1 + i: load for i, load in enumerate(slow)}, 1 + len(slow): sink}
    return lambda now: tasks


def test_backpressured_vertex_scaled_to_the_input_its_source_cannot_read() -> None:
    # the source reads 250/s (held back by `slow`) while 200/s more pile up in
    # its backlog: the input is 450/s; `slow` is busy all the time at 250/s,
    # so its true rate is 250/s: ceil(450 / (250 x 0.7)) = 3
    scaler = Autoscaler(AutoscalerConfig(**{**CONFIG.__dict__, "catch_up": None}), 128, job())
    run = Run(scaler, 0.0)
    loads = steady(Load(250, 0.05, backlog=0, growth=200), [Load(250, 1.0)], Load(250, 0.1))
    run.report(12, loads)
    assert run.decide() is None  # 5 s of stabilization, 10 s of window: not full yet
    run.report(4, loads)
    evaluations, decision = scaler.evaluate(run.now)
    assert decision is not None and decision.vertices == {"slow": 3}
    slow = next(e for e in evaluations if e.uid == "slow")
    assert slow.input_rate == pytest.approx(450, rel=0.02)
    assert slow.true_rate == pytest.approx(250, rel=0.02)
    assert slow.utilization == pytest.approx(1.8, rel=0.02)
    assert slow.needed == pytest.approx(450 / 175, rel=0.02)
    assert "above 0.90" in slow.reason and "450 rec/s" in slow.reason
    # the source and the sink are barely busy: they stay at 1 (the minimum)
    assert {e.uid: e.proposed for e in evaluations} == {"numbers": 1, "slow": 3, "sums": 1}


def test_a_known_backlog_is_worked_off_within_catch_up() -> None:
    # no growth, but 2,000 records waiting: 2,000 / 20 s = 100/s more than the 150/s read
    scaler = Autoscaler(CONFIG, 128, job())
    run = Run(scaler, 0.0)
    run.report(16, steady(Load(150, 0.01, backlog=2000), [Load(150, 0.6)], Load(150, 0.1)))
    evaluations, decision = scaler.evaluate(run.now)
    slow = next(e for e in evaluations if e.uid == "slow")
    assert slow.input_rate == pytest.approx(250, rel=0.02)
    assert slow.true_rate == pytest.approx(250, rel=0.02)
    assert decision is not None and decision.vertices == {"slow": 2}  # ceil(250/175)


def test_nothing_from_the_stabilization_period_or_a_short_window() -> None:
    scaler = Autoscaler(CONFIG, 128, job())
    assert scaler.status(0.0) == "waiting for every task to run"
    run = Run(scaler, 0.0)
    hot = steady(Load(250, 0.05, backlog=0, growth=500), [Load(250, 1.0)], Load(250, 0.1))
    run.report(4, hot)
    assert scaler.status(run.now).startswith("stabilizing")
    assert run.decide() is None
    run.report(10, hot)  # samples from 5 s to 14 s: 9 s of a 10 s window
    assert scaler.status(run.now) == "collecting metrics (9 of 10 s)"
    assert run.decide() is None
    run.report(1, hot)
    assert scaler.status(run.now) == "ready" and run.decide() == {"slow": 6}  # capped by max
    # a new attempt (the rescale's): nothing is known again
    run = Run(scaler, run.now + 2.0)
    assert run.decide() is None and scaler.status(run.now).startswith("stabilizing")


def test_nothing_while_a_task_has_not_reported_for_long() -> None:
    scaler = Autoscaler(CONFIG, 128, job())
    run = Run(scaler, 0.0)
    hot = steady(Load(250, 0.05, backlog=0, growth=500), [Load(250, 1.0)], Load(250, 0.1))
    run.report(16, hot)
    assert scaler.status(run.now) == "ready"
    run.report(6, lambda now: {t: load for t, load in hot(now).items() if t != 2})
    assert scaler.status(run.now) == "a task has not reported for 6 s"
    assert run.decide() is None


def test_within_the_utilization_band_nothing_changes() -> None:
    # utilization 0.6 and 0.85: inside 0.5..0.9, at 2 and 3 subtasks alike
    for busy in (0.6, 0.85):
        scaler = Autoscaler(CONFIG, 128, job(slow=2))
        run = Run(scaler, 0.0)
        run.report(16, steady(Load(400, 0.05, backlog=0), [Load(200, busy), Load(200, busy)],
                              Load(400, 0.1)))
        evaluations, decision = scaler.evaluate(run.now)
        assert decision is None, decision
        assert "within 0.50..0.90" in next(e for e in evaluations if e.uid == "slow").reason


def test_scale_down_when_the_input_drops_and_idle_vertices_go_to_min() -> None:
    scaler = Autoscaler(CONFIG, 128, job(source=2, slow=4, sink=2))
    run = Run(scaler, 0.0)
    # 100/s in all: each `slow` subtask 25/s at 0.1 busy (true rate 250/s)
    run.report(16, lambda now: {0: Load(50, 0.01, backlog=0), 1: Load(50, 0.01, backlog=0),
                                **{t: Load(25, 0.1) for t in range(2, 6)},
                                6: Load(50, 0.02), 7: Load(50, 0.02)})
    assert run.decide() == {"numbers": 1, "slow": 1, "sums": 1}


def test_cool_down_holds_back_a_scale_down_and_no_flapping_under_noise() -> None:
    scaler = Autoscaler(AutoscalerConfig(**{**CONFIG.__dict__, "catch_up": None}), 128, job())
    run = Run(scaler, 0.0)
    run.report(16, steady(Load(250, 0.05, backlog=0, growth=200), [Load(250, 1.0)],
                          Load(250, 0.1)))
    assert run.decide() == {"slow": 3}
    # the rescaled attempt: the input drops at once to 100/s
    scaler.use_graph(job(slow=3))
    run = Run(scaler, run.now + 1.0)
    low = steady(Load(100, 0.01, backlog=0), [Load(100 / 3, 0.4 / 3)] * 3, Load(100, 0.05))
    run.report(16, low)
    evaluations, decision = scaler.evaluate(run.now)
    assert decision is None
    slow = next(e for e in evaluations if e.uid == "slow")
    assert "held back: scaled up 17 s ago (cool-down 30 s)" in slow.reason
    run.report(15, low)
    assert run.decide() == {"slow": 1}
    # then a noisy input around the target (0.4..1.0 utilization at 1 from one second to
    # the next, beyond the band both ways; 0.7 over a window): no decision
    scaler.use_graph(job())
    run = Run(scaler, run.now + 1.0)
    decisions = []
    for i in range(60):
        busy = 0.7 + 0.3 * math.sin(i)
        run.report(1, lambda now, b=busy: {0: Load(175 * b / 0.7, 0.01, backlog=0),
                                           1: Load(175 * b / 0.7, b), 2: Load(175, 0.05)})
        decisions.append(run.decide())
    assert decisions == [None] * 60


def test_bounds_max_parallelism_and_slots() -> None:
    hot = steady(Load(250, 0.05, backlog=0, growth=2000), [Load(250, 1.0)], Load(250, 0.02))
    # needs ceil(2250 + 32000 / 20) / 175) = 22: the max (6)
    scaler = Autoscaler(CONFIG, 128, job())
    run = Run(scaler, 0.0)
    run.report(16, hot)
    assert run.decide() == {"slow": 6}
    # max_parallelism below the max
    scaler = Autoscaler(CONFIG, 4, job())
    run = Run(scaler, 0.0)
    run.report(16, hot)
    assert run.decide() == {"slow": 4}
    # 5 slots: source and sink keep theirs, `slow` gets 3
    scaler = Autoscaler(CONFIG, 128, job())
    run = Run(scaler, 0.0)
    run.report(16, hot)
    evaluations, decision = scaler.evaluate(run.now, slots=5)
    assert decision is not None and decision.vertices == {"slow": 3}
    assert "; 3 for want of task slots (5 in all)" in decision.changes[0].reason
    _, decision = scaler.evaluate(run.now, slots=3)
    assert decision is None  # no slot to spare


def test_outside_min_max_is_moved_in_and_excluded_vertices_stay() -> None:
    config = AutoscalerConfig(**{**CONFIG.__dict__, "min": 2, "max": 3})
    scaler = Autoscaler(config, 128, job(source=1, slow=5, sink=2))
    run = Run(scaler, 0.0)
    run.report(16, lambda now: {0: Load(500, 0.01, backlog=0),
                                **{t: Load(100, 0.5) for t in range(1, 6)},
                                6: Load(250, 0.7), 7: Load(250, 0.7)})
    evaluations, decision = scaler.evaluate(run.now)
    assert decision is not None and decision.vertices == {"numbers": 2, "slow": 3}
    assert "parallelism 5 is outside 2..3" in decision.changes[1].reason
    # excluded: the source's vertex keeps its parallelism
    vertices = job(source=1, slow=5, sink=2)
    vertices[0] = VertexShape(0, "numbers", "numbers", 1, 0, (), True, excluded=True)
    scaler = Autoscaler(config, 128, vertices)
    run = Run(scaler, 0.0)
    run.report(16, lambda now: {0: Load(500, 0.01, backlog=0),
                                **{t: Load(100, 0.5) for t in range(1, 6)},
                                6: Load(250, 0.7), 7: Load(250, 0.7)})
    evaluations, decision = scaler.evaluate(run.now)
    assert decision is not None and decision.vertices == {"slow": 3}
    assert evaluations[0].reason == "excluded from autoscaling"


def test_shapes_from_a_job_graph() -> None:
    p = Pipeline("g", parallelism=2)
    (p.source(SequenceSource(1, 10), uid="src").rebalance().map(lambda x: x, uid="m")
     .key_by(lambda x: x).reduce(lambda a, b: a + b, uid="r").sink(CollectSink(), uid="out"))
    got = shapes(build_job_graph(p), exclude=("out",))
    assert [(s.name, s.uid, s.first_task, s.inputs, s.source, s.excluded) for s in got] == [
        ("src", "src", 0, (), True, False), ("m", "m", 2, ((0, True),), False, False),
        ("r -> out", "r", 4, ((1, True),), False, True)]


def test_a_spark_session_lockgate_starts_has_slots_for_the_autoscalers_max() -> None:
    from lockgate.cluster.autoscaler import tasks_at_most

    p = Pipeline("g", parallelism=2, max_parallelism=16)
    (p.source(SequenceSource(1, 10), uid="src").rebalance().map(lambda x: x, uid="m")
     .key_by(lambda x: x).reduce(lambda a, b: a + b, uid="r").sink(CollectSink(), uid="out"))
    graph = build_job_graph(p)
    assert tasks_at_most(graph, None) == 6
    assert tasks_at_most(graph, AutoscalerConfig(max=5)) == 15
    assert tasks_at_most(graph, AutoscalerConfig(max=5, exclude=("src",))) == 12
    assert tasks_at_most(graph, AutoscalerConfig()) == 48  # max_parallelism each
    assert tasks_at_most(graph, AutoscalerConfig(max=1)) == 6  # never below the graph's


@pytest.mark.parametrize("fields, message", [
    ({"min": 0}, "min must be an integer >= 1"),
    ({"max": 0}, "max must be an integer >= 1"),
    ({"min": 3, "max": 2}, "max (2) is below its min (3)"),
    ({"target_utilization": 0.0}, "target_utilization must be in (0, 1]"),
    ({"target_utilization": 1.5}, "target_utilization must be in (0, 1]"),
    ({"utilization_boundary": 0.7}, "utilization_boundary must be >= 0 and below"),
    ({"stabilization": -1}, "stabilization must be seconds >= 0"),
    ({"window": 0}, "window and catch_up must be > 0"),
    ({"cooldown": float("nan")}, "cooldown must be seconds >= 0"),
    ({"exclude": ("",)}, "exclude takes operator uids"),
])
def test_bad_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        AutoscalerConfig(**fields)  # type: ignore[arg-type]


def test_pipeline_takes_the_autoscaler() -> None:
    assert Pipeline("p").autoscale is None
    config = AutoscalerConfig(max=4)
    assert Pipeline("p", autoscale=config).autoscale is config
    with pytest.raises(PipelineDefinitionError, match="exceeds max_parallelism"):
        Pipeline("p", max_parallelism=8, autoscale=AutoscalerConfig(max=9))
    with pytest.raises(PipelineDefinitionError, match="takes an AutoscalerConfig"):
        Pipeline("p", autoscale={"max": 4})  # type: ignore[arg-type]


def test_records_queued_in_front_of_a_slow_vertex_count_as_its_input() -> None:
    # the source sends 400/s (no backlog: the queues in between take them),
    # `slow` takes 250/s: its input is what the source sends, not what it took
    scaler = Autoscaler(CONFIG, 128, job())
    run = Run(scaler, 0.0)
    run.report(16, steady(Load(400, 0.05, backlog=0), [Load(250, 1.0)], Load(250, 0.02)))
    evaluations, decision = scaler.evaluate(run.now)
    slow = next(e for e in evaluations if e.uid == "slow")
    assert slow.input_rate == pytest.approx(400, rel=0.02)
    assert slow.processing_rate == pytest.approx(250, rel=0.02)
    assert decision is not None and decision.vertices == {"slow": 3}


def test_a_step_of_the_input_is_followed_in_one_rescale() -> None:
    # the input steps from 100/s to 400/s in the middle of a full window:
    # the window's mean would ask for 2, then 3; the autoscaler waits for the
    # input to settle and asks once, for 3
    config = AutoscalerConfig(**{**CONFIG.__dict__, "catch_up": None})
    scaler = Autoscaler(config, 128, job())
    run = Run(scaler, 0.0)

    def loads(now: float) -> dict[int, Load]:
        high = now > 20
        return {0: Load(250 if high else 100, 0.02, backlog=0, growth=150 if high else 0),
                1: Load(250 if high else 100, 1.0 if high else 0.4), 2: Load(100, 0.02)}

    decisions = []
    reasons = []
    for _ in range(40):
        run.report(1, loads)
        evaluations, decision = scaler.evaluate(run.now)
        if decision is not None:
            scaler.applied(decision, run.now)
            decisions.append((run.now, decision.vertices))
            break
        reasons += [e.reason for e in evaluations if e.uid == "slow"]
    assert any("waiting for its input to settle" in r for r in reasons), reasons
    assert len(decisions) == 1 and decisions[0][1] == {"slow": 3}, decisions
    assert 25 <= decisions[0][0] <= 32  # after the step, within two windows of it


def test_an_input_that_keeps_changing_is_acted_on_within_two_windows() -> None:
    # a steady ramp: the halves of the window never agree within 20 %
    scaler = Autoscaler(AutoscalerConfig(**{**CONFIG.__dict__, "catch_up": None}), 128, job())
    run = Run(scaler, 0.0)
    decided = None
    for _ in range(60):
        run.report(1, lambda now: {0: Load(20 * now, 0.01, backlog=0),
                                   1: Load(min(250, 20 * now), min(1.0, 20 * now / 250)),
                                   2: Load(min(250, 20 * now), 0.02)})
        if (decision := run.decide()) is not None:
            decided = run.now, decision
            break
    assert decided is not None and decided[1]["slow"] > 1


def test_the_driver_applies_decisions_and_keeps_them() -> None:
    from concurrent.futures import Future

    from lockgate.cluster.autoscaling import AutoscaleDriver
    from lockgate.protocol import TaskMetrics

    p = Pipeline("g", parallelism=1)
    (p.source(SequenceSource(1, 10), uid="numbers").rebalance().map(lambda x: x, uid="slow")
     .sink(CollectSink(), uid="out"))
    graph = build_job_graph(p)
    asked: list[dict[str, object]] = []
    answers: list[Future[dict[str, object]]] = []

    def submit(kind: str, **args: object) -> Future[dict[str, object]]:
        asked.append({"kind": kind, **args})
        answers.append(Future())
        return answers[-1]

    now = [0.0]
    driver = AutoscaleDriver(AutoscalerConfig(stabilization=1.0, window=4.0, cooldown=10.0),
                             graph, submit, lambda: None, clock=lambda: now[0])
    assert driver.snapshot()["state"] == "waiting for every task to run"
    driver.start_attempt()
    driver.running()
    totals = {0: 0.0, 1: 0.0}
    for _ in range(8):
        now[0] += 1.0
        for task, (rate, busy, backlog) in {0: (250, 0.01, 200 * now[0]),
                                            1: (250, 1.0, None)}.items():
            totals[task] += rate
            driver.on_metrics(task, TaskMetrics(int(totals[task]), int(totals[task]),
                                                busy * now[0], 0.0, (1 - busy) * now[0], 0.0,
                                                None, 0,
                                                None if backlog is None else int(backlog)))
        driver.tick(None)
    assert asked == [{"kind": "rescale", "vertices": {"slow": 3}}]
    shown = driver.snapshot()
    assert shown["state"] == "rescaling" and shown["decision_count"] == 1
    (row,) = shown["decisions"]
    assert (row["vertex"], row["uid"], row["from"], row["to"], row["status"]) == (
        "slow -> out", "slow", 1, 3, "requested")
    assert "above 0.90" in row["why"] and row["inputs"]["needed"] > 2
    assert {v["vertex"] for v in shown["vertices"]} == {"numbers", "slow -> out"}
    answers[0].set_result({"seconds": 0.5})
    assert driver.snapshot()["decisions"][0]["status"] == "done"
    assert driver.snapshot()["decisions"][0]["seconds"] == 0.5
    # busy (a stop): nothing asked; a new attempt stabilizes first
    now[0] += 1.0
    driver.tick("the job is stopping")
    assert driver.snapshot()["state"] == "the job is stopping"
    driver.start_attempt()
    now[0] += 1.0
    driver.tick(None)
    assert driver.snapshot()["state"] == "waiting for every task to run" and len(asked) == 1
    # a failed rescale (its future, as the job master answers it): marked,
    # and no new decision for a window
    driver.running()
    future: Future[dict[str, object]] = Future()
    future.set_exception(RuntimeError("no slots"))
    driver._done(future, Decision({"slow": 3}, []), driver._decisions)
    assert driver.snapshot()["decisions"][0]["status"] == "failed: no slots"
    now[0] += 1.0
    driver.tick(None)
    assert driver.snapshot()["state"].startswith("a rescale failed: next evaluation in")


def test_exclude_must_name_operators_of_the_job() -> None:
    from lockgate.cluster.submission import check_autoscale

    p = Pipeline("g", autoscale=AutoscalerConfig(exclude=("srcc",)))
    p.source(SequenceSource(1, 10), uid="src").sink(CollectSink(), uid="out")
    with pytest.raises(PipelineDefinitionError, match=r"names no operator of the job: \['srcc'\]"):
        check_autoscale(build_job_graph(p), p)
    p.autoscale = AutoscalerConfig(exclude=("src",))
    check_autoscale(build_job_graph(p), p)
