"""The window operator without processes: assigners, every window kind
against the plain-Python reference (``tests/window_reference.py``) over
random out-of-order input with late records, merging sessions, lateness and
the late side output, state clean-up, processing time on a fake clock, count
windows, snapshots restored at another parallelism, value semantics; and
what the API refuses."""

from __future__ import annotations

import io
import random
from collections import Counter
from typing import Any

import pytest

from lockgate import Pipeline, WatermarkStrategy
from lockgate.api.functions import OutputTag
from lockgate.api.plan import OperatorKind
from lockgate.api.windows import (
    AggregateFunction,
    CountWindows,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowFunctionKind,
    WindowSpec,
)
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.connectors.base import TaskInfo
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import OperatorSpec, build_job_graph
from lockgate.runtime.timers import PROCESSING_TIMERS_STATE, TIMERS_STATE
from lockgate.runtime.windows import WINDOWS_STATE, WindowOperator
from lockgate.state.keygroups import key_group_range
from lockgate.state.serde import StateSerializer
from tests import window_reference as ref

M = 16
LATE = "late"
INF = float("inf")


class WithWindow(ProcessWindowFunction):
    """``(key, start, end, value)`` of an aggregate's result."""

    def process(self, key, context, elements):
        (value,) = elements
        yield (key, context.window.start, context.window.end, value)


class Reduced(ProcessWindowFunction):
    """``(key, start, end, value)`` of a reduced record."""

    def process(self, key, context, elements):
        (r,) = elements
        yield (key, context.window.start, context.window.end, r[2])


class SortedValues(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield (key, context.window.start, context.window.end,
               tuple(sorted(e[2] for e in elements)))


class Sum(AggregateFunction):
    """The sum of the records' values, in a mutable accumulator."""

    def create_accumulator(self):
        return [0]

    def add(self, value, acc):
        acc[0] += value[2]  # in place: the operator keeps state private
        return acc

    def get_result(self, acc):
        return acc[0]

    def merge(self, a, b):
        return [a[0] + b[0]]


def value(r: tuple) -> int:
    return r[2]


def spec(assigner, kind: WindowFunctionKind, lateness: int = 0) -> WindowSpec:
    """Windows of records ``(key, ts, value)`` that emit ``(key, start, end,
    sum or sorted values)``."""
    function: Any
    function, window_function = {
        WindowFunctionKind.REDUCE: (lambda a, b: (a[0], a[1], a[2] + b[2]), Reduced()),
        WindowFunctionKind.AGGREGATE: (Sum(), WithWindow()),
        WindowFunctionKind.PROCESS: (SortedValues(), None)}[kind]
    return WindowSpec(assigner, kind, function, window_function,
                      (lambda r: r[1]) if assigner.event_time else None, lateness, LATE)


def operator(window_spec: WindowSpec, index: int = 0, parallelism: int = 1) -> WindowOperator:
    op = WindowOperator(OperatorSpec("w", OperatorKind.WINDOW, window_spec, lambda r: r[0]),
                        TaskInfo("job", "w", index, parallelism, M, 0))
    op.open(StateSerializer())
    return op


def drive(op: WindowOperator, records: list, watermarks: list[float],
          end: bool = True) -> tuple[list, list]:
    """Each record under its watermark, then the end of input; returns
    (main output, late side output)."""
    out: list = []
    current = -INF
    for r, w in zip(records, watermarks, strict=True):
        if w > current:
            out += op.process_watermark(w)
            current = w
        out += op.process([r])
    if end:
        out += op.process_watermark(INF)
    late = op.side.pop(LATE, [])
    assert not op.side
    return out, late


def random_input(seed: int, n: int = 600, keys: int = 3) -> tuple[list, list[float]]:
    """Records ``(key, ts, value)`` mostly in order, some out of order within
    the bound, some late by up to 4 windows; the watermark after each record."""
    rng = random.Random(seed)
    records, t = [], 0
    for i in range(n):
        t += rng.randint(0, 30)
        ts = t - rng.randint(0, 40)
        if rng.random() < 0.08:
            ts = t - rng.randint(50, 400)
        records.append((rng.randrange(keys), max(ts, 0), i))
    return records, ref.stream_watermarks([r[1] for r in records], 40, rng.choice([1, 3]))


ASSIGNERS = {
    "tumbling": (TumblingEventTimeWindows.of(100), ref.tumbling(100), False),
    "sliding": (SlidingEventTimeWindows.of(100, 30), ref.sliding(100, 30), False),
    "session": (EventTimeSessionWindows.with_gap(25), ref.session(25), True),
}


@pytest.mark.parametrize("kind", list(WindowFunctionKind))
@pytest.mark.parametrize("lateness", [0, 120])
@pytest.mark.parametrize("name", sorted(ASSIGNERS))
def test_every_window_kind_matches_the_reference(name, lateness, kind):
    assigner, assign, merging = ASSIGNERS[name]
    for seed in range(3):
        records, watermarks = random_input(seed)
        op = operator(spec(assigner, kind, lateness))
        got, late = drive(op, records, watermarks)
        result = (lambda vs: tuple(sorted(vs))) if kind == WindowFunctionKind.PROCESS else sum
        want, want_late = ref.simulate(records, watermarks, key_of=lambda r: r[0],
                                       ts_of=lambda r: r[1], value_of=value, assign=assign,
                                       merging=merging, lateness=lateness, result=result)
        assert Counter(got) == Counter(want), (name, seed)
        assert late == want_late and late, "the late side output holds exactly the dropped"
        assert op.windows == {} and op.backend.raw(TIMERS_STATE) == {}, "state left behind"


def test_assigners_follow_flinks_arithmetic():
    assert TumblingEventTimeWindows.of(10).assign(25) == [(20, 30)]
    assert TumblingEventTimeWindows.of(10).assign(-1) == [(-10, 0)]
    assert TumblingEventTimeWindows.of(10, offset=3).assign(12) == [(3, 13)]
    assert SlidingEventTimeWindows.of(10, 5).assign(12) == [(10, 20), (5, 15)]
    assert SlidingEventTimeWindows.of(10, 3).assign(12) == [(12, 22), (9, 19), (6, 16), (3, 13)]
    assert EventTimeSessionWindows.with_gap(7).assign(3) == [(3, 10)]
    with pytest.raises(ValueError):
        TumblingEventTimeWindows.of(0)
    with pytest.raises(ValueError):
        SlidingEventTimeWindows.of(10, 5, offset=5)


def test_sessions_merge_touching_windows_and_a_bridging_record():
    op = operator(spec(EventTimeSessionWindows.with_gap(10), WindowFunctionKind.AGGREGATE))
    for r in [("k", 0, 1), ("k", 10, 2), ("k", 30, 3)]:  # [0,10) and [10,20) touch: merged
        op.process([r])
    assert sorted(op.windows["k"]) == [(0, 20), (30, 40)]
    op.process([("k", 15, 4)])  # [15, 25) overlaps [0, 20) only
    op.process([("k", 25, 5)])  # [25, 35) bridges [0, 25) and [30, 40)
    assert list(op.windows["k"]) == [(0, 40)]
    assert op.process_watermark(INF) == [("k", 0, 40, 15)]
    assert op.backend.raw(TIMERS_STATE) == {}, "timers of merged windows left behind"


def test_late_firings_update_the_result_and_clean_up_at_the_end_of_lateness():
    op = operator(spec(TumblingEventTimeWindows.of(10), WindowFunctionKind.AGGREGATE, 20))
    op.process([("k", 5, 1)])
    assert op.process_watermark(9) == [("k", 0, 10, 1)]
    assert op.process([("k", 3, 2)]) == [("k", 0, 10, 3)]  # late, within lateness
    assert op.process_watermark(28) == []
    assert op.windows, "still within the lateness"
    assert op.process([("k", 4, 4)]) == [("k", 0, 10, 7)]
    assert op.process_watermark(29) == [] and op.windows == {}  # end - 1 + lateness
    assert op.process([("k", 4, 8)]) == []
    assert op.side == {LATE: [("k", 4, 8)]}


def test_processing_time_windows_fire_on_the_clock():
    op = operator(WindowSpec(TumblingProcessingTimeWindows.of(100), WindowFunctionKind.PROCESS,
                             SortedValues()))
    op.clock = lambda: 1_050
    op.process([("a", None, 1), ("b", None, 2)])
    op.clock = lambda: 1_120
    op.process([("a", None, 3)])
    assert op.next_processing_timer() == 1_099
    assert sorted(op.process_processing_time(1_099)) == [
        ("a", 1_000, 1_100, (1,)), ("b", 1_000, 1_100, (2,))]
    assert op.process_processing_time(1_200) == [("a", 1_100, 1_200, (3,))]
    assert op.windows == {} and op.backend.raw(PROCESSING_TIMERS_STATE) == {}
    sliding = SlidingProcessingTimeWindows.of(100, 50)
    assert sliding.assign(1_120) == [(1_100, 1_200), (1_050, 1_150)]


def test_count_windows_fire_every_size_records_of_a_key():
    op = operator(WindowSpec(CountWindows(3), WindowFunctionKind.REDUCE,
                             lambda a, b: (a[0], a[1], a[2] + b[2])))
    op.window_spec = op.window_spec._replace(window_function=None)
    op._user = None
    rng = random.Random(5)
    records = [(rng.randrange(3), 0, i) for i in range(50)]
    got = [(r[0], r[2]) for r in op.process(records)]
    want = ref.count_windows(records, 3, key_of=lambda r: r[0], value_of=value)
    assert got == want


def test_a_snapshot_restores_at_another_parallelism():
    """Windows and their timers move by key group: half of the input, a
    snapshot, restored into three tasks, the other half: the same windows as
    one run; the restored watermark keeps late records late."""
    records, watermarks = random_input(7, n=800, keys=11)
    window = spec(SlidingEventTimeWindows.of(100, 50), WindowFunctionKind.AGGREGATE, 60)
    whole, whole_late = drive(operator(window), records, watermarks)
    first = operator(window)
    out, late = drive(first, records[:400], watermarks[:400], end=False)
    snap = first.snapshot(1)
    buf = io.BytesIO()
    blocks = snap.keyed.write(buf)
    data = buf.getvalue()
    for index in range(3):
        op = operator(window, index, 3)
        for kg in key_group_range(index, 3, M):
            if kg in blocks.key_groups:
                offset, length = blocks.key_groups[kg]
                op.backend.restore_block(data[offset:offset + length], blocks.states)
        op.restore_operator_state(snap.operator_state)
        mine = [i for i, r in enumerate(records[400:], 400)
                if op.backend._assigner.key_group(r[0]) in op.backend.key_group_range]
        o, lt = drive(op, [records[i] for i in mine], [watermarks[i] for i in mine])
        out += o
        late += lt
    assert Counter(out) == Counter(whole)
    assert sorted(late) == sorted(whole_late)


def test_stored_contents_are_private_to_the_operator():
    """A reduce that changes its first argument in place and a record changed
    after it was added change neither the state nor a snapshot."""
    def grow(a, b):
        a[2].append(b[2][0])
        return a

    op = operator(spec(TumblingEventTimeWindows.of(10), WindowFunctionKind.REDUCE))
    op.window_spec = op.window_spec._replace(function=grow, window_function=None)
    op._user = None
    r = ["k", 1, [1]]
    op.process([r])
    r[2].append(99)
    snap = op.snapshot(1)
    op.process([["k", 2, [2]]])
    assert snap.keyed.tables[WINDOWS_STATE] == {"k": {(0, 10): ["k", 1, [1]]}}
    out = op.process_watermark(INF)
    assert out == [["k", 1, [1, 2]]]
    out[0][2].append(5)
    assert op.windows == {}


def test_an_aggregate_changes_its_accumulator_in_place_only_after_a_copy_of_its_own():
    """An aggregate whose ``add`` changes the accumulator in place: the
    first record after a snapshot copies the window's accumulator once, the
    next ones change that copy, and the snapshot keeps what it had. Records
    of one batch that go back and forth between windows each land in their
    own."""
    op = operator(spec(TumblingEventTimeWindows.of(10), WindowFunctionKind.AGGREGATE))
    op.process([("k", 1, 1), ("k", 12, 10), ("k", 2, 2), ("j", 3, 5), ("k", 15, 20)])
    assert op.windows == {"k": {(0, 10): [3], (10, 20): [30]}, "j": {(0, 10): [5]}}
    snap = op.snapshot(1)
    kept = op.windows["k"][(0, 10)]
    op.process([("k", 4, 4)])
    copy = op.windows["k"][(0, 10)]
    assert copy is not kept and copy == [7]
    op.process([("k", 5, 5), ("k", 11, 1)])
    assert op.windows["k"][(0, 10)] is copy and copy == [12]
    assert snap.keyed.tables[WINDOWS_STATE] == {"k": {(0, 10): [3], (10, 20): [30]},
                                                "j": {(0, 10): [5]}}
    assert sorted(op.process_watermark(INF)) == [("j", 0, 10, 5), ("k", 0, 10, 12),
                                                  ("k", 10, 20, 31)]


def test_a_growing_session_moves_its_records_and_a_snapshot_keeps_its_own():
    """A session that only grows keeps its list of records under the new
    bounds (no copy per record: a session of n records would cost n**2);
    after a snapshot the first record added copies it once, so the
    snapshot's list stays as it was. Merging two sessions keeps both lists'
    records, and neither snapshot changes."""
    op = operator(spec(EventTimeSessionWindows.with_gap(10), WindowFunctionKind.PROCESS))
    op.process([("k", 0, 1)])
    first = op.windows["k"][(0, 10)]
    op.process([("k", 5, 2)])
    op.process([("k", 12, 3)])
    assert list(op.windows["k"]) == [(0, 22)] and op.windows["k"][(0, 22)] is first
    snap = op.snapshot(1)
    op.process([("k", 20, 4)])  # grows again: copied once, then changed in place
    grown = op.windows["k"][(0, 30)]
    assert grown is not first and [r[2] for r in grown] == [1, 2, 3, 4]
    op.process([("k", 25, 5)])
    assert op.windows["k"][(0, 35)] is grown
    assert snap.keyed.tables[WINDOWS_STATE] == {"k": {(0, 22): [("k", 0, 1), ("k", 5, 2),
                                                                 ("k", 12, 3)]}}
    op.process([("k", 45, 6)])
    snap2 = op.snapshot(2)
    op.process([("k", 35, 7)])  # [35, 45) bridges [0, 35) and [45, 55)
    assert list(op.windows["k"]) == [(0, 55)]
    assert [r[2] for r in op.windows["k"][(0, 55)]] == [1, 2, 3, 4, 5, 6, 7]
    assert snap2.keyed.tables[WINDOWS_STATE]["k"][(45, 55)] == [("k", 45, 6)]
    assert snap2.keyed.tables[WINDOWS_STATE]["k"][(0, 35)] == [
        ("k", 0, 1), ("k", 5, 2), ("k", 12, 3), ("k", 20, 4), ("k", 25, 5)]
    assert op.process_watermark(INF) == [("k", 0, 55, (1, 2, 3, 4, 5, 6, 7))]


def test_the_api_refuses_what_cannot_work():
    p = Pipeline("w")
    plain = p.source(SequenceSource(1, 10), uid="plain")
    with pytest.raises(PipelineDefinitionError, match="need watermarks"):
        plain.key_by(str).window(TumblingEventTimeWindows.of(5)).reduce(max)
    stamped = p.source(SequenceSource(1, 10), uid="stamped",
                       watermarks=WatermarkStrategy(lambda x: x))
    with pytest.raises(PipelineDefinitionError, match="timestamp_of"):
        stamped.map(str).key_by(str).window(TumblingEventTimeWindows.of(5)).reduce(max)
    with pytest.raises(PipelineDefinitionError, match="merge"):
        class NoMerge(AggregateFunction):
            def create_accumulator(self):
                return 0

            def add(self, value, acc):
                return acc + 1

            def get_result(self, acc):
                return acc

        stamped.key_by(str).window(EventTimeSessionWindows.with_gap(5)).aggregate(NoMerge())
    with pytest.raises(PipelineDefinitionError, match="side_output"):
        stamped.map(str).side_output(OutputTag("x"))
    with pytest.raises(PipelineDefinitionError, match="event-time"):
        stamped.key_by(str).window(TumblingProcessingTimeWindows.of(5)).allowed_lateness(3)


def test_a_side_output_is_an_edge_of_its_own_from_the_last_operator_of_its_chain():
    p = Pipeline("w", parallelism=2)
    windowed = (p.source(SequenceSource(1, 10), uid="src",
                         watermarks=WatermarkStrategy(lambda x: x))
                .key_by(lambda x: x % 2).window(TumblingEventTimeWindows.of(5))
                .side_output_late_data(OutputTag("late")).reduce(max, uid="win"))
    windowed.map(str, uid="fmt").sink(CollectSink(), uid="out")
    windowed.side_output(OutputTag("late")).sink(CollectSink(), uid="late-out")
    g = build_job_graph(p)
    assert [[op.uid for op in v.operators] for v in g.vertices] == [
        ["src"], ["win"], ["fmt", "out"], ["late-out"]]
    assert [(e.downstream_uid, e.tag) for e in g.vertices[1].outputs] == [
        ("fmt", None), ("late-out", "late")]
