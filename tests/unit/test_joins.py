"""The two-input operators without processes: the interval join against the
plain-Python reference (``tests/join_reference.py``) over random
out-of-order input with late records on both sides, for several bounds,
the same whichever way its inputs interleave (each input's records judged
by that input's own watermark); its state cleaned up; each input's
watermark restored; a snapshot restored at another parallelism; the
window join's pairing on the window operator against
``tests/window_reference.py`` with late data; broadcast state restored
round-robin; keyed connected streams sharing state and timers; and the job
graph of unions, connects and broadcasts."""

from __future__ import annotations

import io
import random
from collections import Counter
from typing import Any

import pytest

from lockgate import (
    MapStateDescriptor,
    Pipeline,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from lockgate.api.broadcast import BroadcastProcessFunction
from lockgate.api.connected import CoProcessFunction, CoSpec
from lockgate.api.joins import IntervalJoinSpec, ProcessJoinFunction, _PairUp
from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.api.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    WindowFunctionKind,
    WindowSpec,
)
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.connectors.base import TaskInfo
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import OperatorSpec, build_job_graph
from lockgate.protocol import Watermark
from lockgate.runtime.broadcast_process import BroadcastProcessOperator
from lockgate.runtime.coprocess import CoProcessOperator
from lockgate.runtime.interval_join import LEFT_STATE, RIGHT_STATE, IntervalJoinOperator
from lockgate.runtime.timers import TIMERS_STATE
from lockgate.runtime.valve import WatermarkValve
from lockgate.runtime.windows import WindowOperator
from lockgate.state.keygroups import key_group_range
from lockgate.state.serde import StateSerializer
from tests import join_reference as jref
from tests import window_reference as wref

M = 16
INF = float("inf")


class Pair(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        assert ctx.left_timestamp == left[1] and ctx.right_timestamp == right[1]
        yield (left, right)


def join_op(lower: int, upper: int, index: int = 0, parallelism: int = 1,
            late: bool = True) -> IntervalJoinOperator:
    spec = IntervalJoinSpec(lower, upper, lambda r: r[1], lambda r: r[1],
                            "late-left" if late else None, "late-right" if late else None)
    co = CoSpec(Pair(), (lambda r: r[0], lambda r: r[0]), spec)
    op = IntervalJoinOperator(OperatorSpec("j", OperatorKind.INTERVAL_JOIN, co, lambda r: r[0]),
                              TaskInfo("job", "j", index, parallelism, M, 0))
    op.open(StateSerializer())
    return op


def random_events(seed: int, n: int = 500, keys: int = 4) -> list[tuple[int, Any, float]]:
    """``(side, (key, ts, id), watermark before it)``: both sides mostly in
    order, some out of order within the bound, some late; the watermark
    trails the largest timestamp seen by 30."""
    rng = random.Random(seed)
    events, t, top = [], 0, -INF
    for i in range(n):
        t += rng.randint(0, 8)
        ts = max(t - rng.randint(0, 25), 0)
        if rng.random() < 0.07:
            ts = max(t - rng.randint(40, 200), 0)
        wm = top - 30 if top != -INF else -INF
        events.append((rng.randrange(2), (rng.randrange(keys), ts, i), wm))
        top = max(top, ts)
    return events


def drive(op: IntervalJoinOperator, events: list, end: bool = True) -> list:
    out: list = []
    current = -INF
    for side, r, wm in events:
        if wm > current:
            out += op.process_watermark(wm)
            current = wm
        out += op.process_input(side, [r])
    if end:
        out += op.process_watermark(INF)
    return out


BOUNDS = [(-20, 30), (0, 40), (-50, -10), (5, 5), (-15, 0)]


@pytest.mark.parametrize("lower,upper", BOUNDS)
def test_interval_join_matches_the_reference(lower, upper):
    for seed in range(4):
        events = random_events(seed)
        op = join_op(lower, upper)
        got = drive(op, events)
        pairs, late_l, late_r = jref.interval_join(
            events, key_of=lambda side, r: r[0], ts_of=lambda side, r: r[1],
            lower=lower, upper=upper)
        assert Counter(got) == Counter(pairs), (lower, upper, seed)
        assert pairs, "the input makes pairs"
        assert op.side.pop("late-left", []) == late_l and op.side.pop("late-right", []) == late_r
        assert late_l and late_r, "the input has late records on both sides"
        backend = op.backend
        assert backend.raw(LEFT_STATE) == {} and backend.raw(RIGHT_STATE) == {}, "buffers left"
        assert backend.raw(TIMERS_STATE) == {}, "timers left"


def test_interval_join_cleans_up_as_the_watermark_passes():
    op = join_op(-10, 20, late=False)
    op.process_input(0, [("k", 100, "a")])
    op.process_input(1, [("k", 95, "b")])
    assert op.process_watermark(105) == []
    assert 95 in op.buffers[1]["k"], "a left at 105 is not late and matches it"
    op.process_watermark(106)  # past 95 + 10: the right at 95 goes
    assert "k" not in op.buffers[1] and 100 in op.buffers[0]["k"]
    assert op.process_input(1, [("k", 119, "c")]) == [(("k", 100, "a"), ("k", 119, "c"))]
    op.process_watermark(121)  # past 100 + 20: the left at 100 goes
    assert op.buffers[0] == {}
    assert op.process_input(1, [("k", 110, "d")]) == [] and op.side == {}, "late: dropped"


def test_a_record_at_the_watermark_pairs_with_one_that_came_before():
    """Neither is late (``ts < watermark`` is), so they pair: the first is
    kept until the watermark passes the last time a match can come at, not
    only reaches it."""
    for lower, upper, first, second in [(-10, 20, (0, 100), (1, 120)),
                                        (-10, 20, (1, 95), (0, 105)),
                                        (0, 0, (0, 50), (1, 50)),
                                        (-5, -5, (1, 40), (0, 45))]:
        op = join_op(lower, upper)
        (side_a, ts_a), (side_b, ts_b) = first, second
        op.process_input(side_a, [("k", ts_a, "first")])
        assert op.process_watermark(ts_b) == []
        out = op.process_input(side_b, [("k", ts_b, "second")])
        a, b = ("k", ts_a, "first"), ("k", ts_b, "second")
        assert out == [(a, b) if side_a == 0 else (b, a)], (lower, upper)
        assert op.side == {}


def side_stream(seed: int, side: int, n: int = 300, keys: int = 4) -> list[Any]:
    """One input's own order: records ``(key, ts, (side, i))``, mostly in
    order, some late, and after every few a :class:`Watermark` trailing the
    largest timestamp so far by 30."""
    rng = random.Random(seed * 2 + side)
    out: list[Any] = []
    t, top = 0, -INF
    for i in range(n):
        t += rng.randint(0, 8)
        ts = max(t - rng.randint(0, 25), 0)
        if rng.random() < 0.08:
            ts = max(t - rng.randint(40, 200), 0)
        out.append((rng.randrange(keys), ts, (side, i)))
        top = max(top, ts)
        if rng.random() < 0.4:
            out.append(Watermark(top - 30))
    return out + [Watermark(INF)]


def interleave(streams: list[list[Any]], order: str, seed: int) -> list[tuple[int, Any]]:
    """Both inputs' elements in one arrival order: each input's own order
    kept, ``left-first``, ``right-first`` or ``random`` between them."""
    if order != "random":
        first = 0 if order == "left-first" else 1
        return [(first, e) for e in streams[first]] + [(1 - first, e)
                                                       for e in streams[1 - first]]
    rng = random.Random(seed)
    rest = [list(reversed(s)) for s in streams]
    out = []
    while rest[0] or rest[1]:
        side = rng.choice([i for i in (0, 1) if rest[i]])
        out.append((side, rest[side].pop()))
    return out


def feed(op: IntervalJoinOperator, elements: list[tuple[int, Any]]) -> list:
    """``elements`` through a task's watermark valve (a channel per input)
    into ``op``, as the task hands them over."""
    valve = WatermarkValve(2, input_of=[0, 1])
    out: list = []
    for side, e in elements:
        if isinstance(e, Watermark):
            emitted = valve.input_watermark(side, e.timestamp)
            op.input_watermark(side, valve.input_watermarks[side])
            for w in emitted:
                out += op.process_watermark(w.timestamp)
        else:
            out += op.process_input(side, [e])
    return out


@pytest.mark.parametrize("lower,upper", BOUNDS)
def test_interval_join_judges_each_input_by_its_own_watermark(lower, upper):
    """Whichever way the two inputs interleave (one far ahead of the other,
    or mixed), the same records are late, those below their own input's
    watermark, and the same pairs come out: the reference's."""
    for seed in range(3):
        streams = [side_stream(seed, side) for side in (0, 1)]
        events = []
        for side, stream in enumerate(streams):
            wm = -INF
            for e in stream:
                if isinstance(e, Watermark):
                    wm = max(wm, e.timestamp)
                else:
                    events.append((side, e, wm))
        pairs, late_l, late_r = jref.interval_join(
            events, key_of=lambda side, r: r[0], ts_of=lambda side, r: r[1],
            lower=lower, upper=upper)
        assert pairs and late_l and late_r, "the input makes pairs and late records"
        for order in ("left-first", "right-first", "random"):
            op = join_op(lower, upper)
            got = feed(op, interleave(streams, order, seed))
            assert Counter(got) == Counter(pairs), (lower, upper, seed, order)
            assert sorted(op.side.pop("late-left", [])) == sorted(late_l), order
            assert sorted(op.side.pop("late-right", [])) == sorted(late_r), order
            assert op.backend.raw(LEFT_STATE) == {} and op.backend.raw(RIGHT_STATE) == {}


def test_interval_join_restores_each_inputs_own_watermark():
    """A snapshot taken while the left input ran far ahead of the right
    restores both inputs' watermarks: a left record below the left's is
    late after the restore too, before any new watermark comes."""
    streams = [side_stream(4, 0), side_stream(4, 1)]
    elements = interleave(streams, "left-first", 0)
    cut = len(streams[0]) // 2  # half the left input, none of the right
    first = join_op(-20, 30)
    feed(first, elements[:cut])
    snap = first.snapshot(1)
    assert first.timers.watermark == -INF and first._inputs[0] > 0
    restored = join_op(-20, 30)
    restored.restore_operator_state(snap.operator_state)
    assert restored._inputs == first._inputs and restored.timers.watermark == -INF
    late = ("k", int(first._inputs[0]) - 1, "late")
    assert restored.process_input(0, [late]) == []
    assert restored.side == {"late-left": [late]}


def test_interval_join_restores_at_another_parallelism():
    """Buffers and timers move by key group; the restored watermark keeps
    late records late."""
    events = random_events(9, n=800, keys=11)
    whole = drive(join_op(-20, 30), events)
    first = join_op(-20, 30)
    out = drive(first, events[:400], end=False)
    snap = first.snapshot(1)
    buf = io.BytesIO()
    blocks = snap.keyed.write(buf)
    data = buf.getvalue()
    for index in range(3):
        op = join_op(-20, 30, index, 3)
        for kg in key_group_range(index, 3, M):
            if kg in blocks.key_groups:
                offset, length = blocks.key_groups[kg]
                op.backend.restore_block(data[offset:offset + length], blocks.states)
        op.restore_operator_state(snap.operator_state)
        mine = [e for e in events[400:]
                if op.backend._assigner.key_group(e[1][0]) in op.backend.key_group_range]
        out += drive(op, mine)
    assert Counter(out) == Counter(whole)


def test_interval_join_keeps_records_private():
    class Mutating(ProcessJoinFunction):
        def process_element(self, left, right, ctx):
            left["seen"] = True
            yield dict(left, right=right["v"])

    co = CoSpec(Mutating(), (lambda r: r["k"], lambda r: r["k"]),
                IntervalJoinSpec(0, 10, lambda r: r["ts"], lambda r: r["ts"]))
    op = IntervalJoinOperator(OperatorSpec("j", OperatorKind.INTERVAL_JOIN, co, None),
                              TaskInfo("job", "j", 0, 1, M, 0))
    op.open(StateSerializer())
    left = {"k": 1, "ts": 5, "v": "l"}
    op.process_input(0, [left])
    left["v"] = "changed by the caller"
    out = op.process_input(1, [{"k": 1, "ts": 7, "v": "r1"}])
    out += op.process_input(1, [{"k": 1, "ts": 8, "v": "r2"}])
    assert [o["v"] for o in out] == ["l", "l"] and "seen" not in op.buffers[0][1][5][0]


# ------------------------------------------------------------ window join

JOIN_ASSIGNERS = {
    "tumbling": (TumblingEventTimeWindows.of(100), wref.tumbling(100), False),
    "sliding": (SlidingEventTimeWindows.of(100, 50), wref.sliding(100, 50), False),
    "session": (EventTimeSessionWindows.with_gap(20), wref.session(20), True),
}


def pairs_of(values: list) -> tuple:
    return tuple(sorted((a, b) for sa, a in values if sa == 0 for sb, b in values if sb == 1))


@pytest.mark.parametrize("name", sorted(JOIN_ASSIGNERS))
def test_window_join_pairs_match_the_reference(name):
    """The window join's operator (tagged records through the window
    operator and ``_PairUp``) against the window reference whose result is
    every left-right pair of the window; out-of-order and late input."""
    assigner, assign, merging = JOIN_ASSIGNERS[name]
    for seed in range(3):
        events = random_events(seed, n=400)
        records = [(side, r) for side, r, _ in events]
        watermarks = [wm for _, _, wm in events]
        spec = WindowSpec(assigner, WindowFunctionKind.PROCESS, _PairUp(lambda a, b: (a, b)),
                          None, lambda t: t[1][1], 0, None)
        op = WindowOperator(OperatorSpec("w", OperatorKind.WINDOW, spec, lambda t: t[1][0]),
                            TaskInfo("job", "w", 0, 1, M, 0))
        op.open(StateSerializer())
        got: list = []
        current = -INF
        for r, wm in zip(records, watermarks, strict=True):
            if wm > current:
                got += op.process_watermark(wm)
                current = wm
            got += op.process([r])
        got += op.process_watermark(INF)
        fired, _ = wref.simulate(records, watermarks, key_of=lambda t: t[1][0],
                                 ts_of=lambda t: t[1][1], value_of=lambda t: t,
                                 assign=assign, merging=merging, result=pairs_of)
        want = [p for *_, ps in fired for p in ps]
        assert Counter(got) == Counter(want) and want, (name, seed)


# ------------------------------------------------------ broadcast, connect

RULES = MapStateDescriptor("rules")


class Apply(BroadcastProcessFunction):
    def process_element(self, value, ctx):
        state = ctx.get_broadcast_state(RULES)
        with pytest.raises(AttributeError):
            state.put("x", 1)  # read-only here
        return [(value, state.get(value % 3))]

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        return None


def broadcast_op(index: int, parallelism: int) -> BroadcastProcessOperator:
    op = BroadcastProcessOperator(
        OperatorSpec("b", OperatorKind.BROADCAST_PROCESS, CoSpec(Apply(), (None, None), (RULES,))),
        TaskInfo("job", "b", index, parallelism, M, 0))
    op.open(StateSerializer())
    return op


def test_broadcast_state_restores_round_robin_at_another_parallelism():
    old = [broadcast_op(i, 2) for i in range(2)]
    for i, op in enumerate(old):
        op.process_input(1, [(0, "zero"), (1, f"one-{i}")])  # (tasks differ: to tell copies)
        assert op.process_input(0, [3, 4]) == [(3, "zero"), (4, f"one-{i}")]
    entries = [e for op in old for e in op.snapshot(1).operator_state]
    old[0].process_input(1, [(2, "after the snapshot")])
    assert "after the snapshot" not in str(entries), "a snapshot holds a copy"
    for index in range(3):
        new = broadcast_op(index, 3)
        new.restore_operator_state(entries)
        assert new.process_input(0, [1]) == [(1, f"one-{index % 2}")]


def test_keyed_connected_streams_share_state_and_timers():
    class Both(CoProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

        def process_element1(self, value, ctx):
            self.total.update(self.total.value() + value[1])
            ctx.timer_service.register_event_time_timer(10)

        def process_element2(self, value, ctx):
            self.total.update(self.total.value() - value[1])

        def on_timer(self, timestamp, ctx):
            yield (ctx.current_key, self.total.value())

    co = CoSpec(Both(), (lambda r: r[0], lambda r: r[0]))
    op = CoProcessOperator(OperatorSpec("c", OperatorKind.CO_PROCESS, co, lambda r: r[0]),
                           TaskInfo("job", "c", 0, 1, M, 0))
    op.open(StateSerializer())
    op.process_input(0, [("a", 5), ("b", 1)])
    op.process_input(1, [("a", 2), ("c", 7)])
    assert sorted(op.process_watermark(10)) == [("a", 3), ("b", 1)]


# ------------------------------------------------------------- job graph

def test_union_is_edges_of_its_consumer_with_input_indexes():
    p = Pipeline("g", parallelism=2)
    wm = WatermarkStrategy(lambda x: x, 0)
    a = p.source(SequenceSource(1, 10), uid="a", watermarks=wm)
    b = p.source(SequenceSource(1, 10), uid="b", parallelism=1, watermarks=wm)
    c = p.source(SequenceSource(1, 10), uid="c", watermarks=wm)
    rules = p.source(SequenceSource(1, 3), uid="r", parallelism=1).broadcast(RULES)
    u = a.union(b, c.map(lambda x: x, uid="m"))
    u.key_by(lambda x: x).connect(rules).process(_Keyed(), uid="k").sink(CollectSink(), uid="o")
    g = build_job_graph(p)
    (k,) = [v for v in g.vertices if v.operators[0].uid == "k"]
    names = {g.vertices[e.upstream].name: (e.partitioning, e.input_index) for e in k.inputs}
    assert names == {"a": (Partitioning.HASH, 0), "b": (Partitioning.HASH, 0),
                     "c -> m": (Partitioning.HASH, 0), "r": (Partitioning.BROADCAST, 1)}
    assert all(op.kind != OperatorKind.UNION for op in g.operators())


def test_a_stream_joined_with_itself_is_refused():
    p = Pipeline("g")
    a = p.source(SequenceSource(1, 10), uid="a")
    a.union(a).sink(CollectSink(), uid="o")
    with pytest.raises(PipelineDefinitionError, match="twice"):
        build_job_graph(p)


def test_what_the_api_refuses():
    p = Pipeline("g")
    a = p.source(SequenceSource(1, 10), uid="a")
    b = p.source(SequenceSource(1, 10), uid="b")
    with pytest.raises(PipelineDefinitionError, match="keyed"):
        a.key_by(lambda x: x).connect(b)
    with pytest.raises(PipelineDefinitionError, match="MapStateDescriptor"):
        b.broadcast(ValueStateDescriptor("v"))
    with pytest.raises(PipelineDefinitionError, match="watermarks"):
        a.key_by(lambda x: x).interval_join(b.key_by(lambda x: x)).between(0, 1)
    with pytest.raises(PipelineDefinitionError, match="KeyedBroadcastProcessFunction"):
        a.key_by(lambda x: x).connect(b.broadcast(RULES)).process(Apply())


from lockgate.api.broadcast import KeyedBroadcastProcessFunction  # noqa: E402


class _Keyed(KeyedBroadcastProcessFunction):
    def process_element(self, value, ctx):
        return [value]

    def process_broadcast_element(self, value, ctx):
        return None


def test_the_driver_finds_script_classes_in_join_functions():
    """A class of the job script that only a join's function names reaches
    the tasks (``state/script_classes.py`` walks tuples: the join's specs
    and helpers are tuples)."""
    from lockgate.state.script_classes import script_classes

    point = type("Point", (), {})
    point.__module__ = "__main__"
    other = type("Other", (), {})
    other.__module__ = "__main__"

    def make(a, b):
        return point()

    def later(r):
        return other and r

    make.__module__ = later.__module__ = "__main__"
    p = Pipeline("g")
    wm = WatermarkStrategy(lambda x: x, 0)
    a = p.source(SequenceSource(1, 10), uid="a", watermarks=wm)
    b = p.source(SequenceSource(1, 10), uid="b", watermarks=wm)
    a.join(b).where(lambda x: x).equal_to(lambda x: x).window(
        TumblingEventTimeWindows.of(5)).apply(make, uid="wj").sink(CollectSink(), uid="o")
    (a.key_by(lambda x: x).interval_join(b.key_by(lambda x: x)).between(0, 1)
     .process(Pair(), uid="ij").sink(CollectSink(), uid="o2"))
    c = p.source(SequenceSource(1, 10), uid="c", watermarks=wm)
    d = p.source(SequenceSource(1, 10), uid="d", watermarks=wm)
    c.key_by(lambda x: x).connect(d.key_by(later)).process(_Both(), uid="co").sink(
        CollectSink(), uid="o3")
    roots = [(op.fn, op.key_selector, op.watermarks) for op in build_job_graph(p).operators()]
    found = script_classes(*roots)
    assert point in found and other in found


class _Both(CoProcessFunction):
    def process_element1(self, value, ctx):
        return None

    def process_element2(self, value, ctx):
        return None
