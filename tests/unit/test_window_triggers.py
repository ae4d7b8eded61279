"""Custom window triggers and sliding count windows on the window operator
without processes, against plain-Python references: ``CountTrigger`` (with
and without purging) over random out-of-order input with late records, the
built-in ``EventTimeTrigger`` reproducing the default firing
(``tests/window_reference.py``), ``ContinuousEventTimeTrigger``,
``ProcessingTimeTrigger`` on a fake clock, ``GlobalWindows`` with a purging
count trigger, ``count_window(size, slide)``, trigger state moved by key
group through a snapshot, state cleaned up, and what the API refuses."""

from __future__ import annotations

import io
import random
from collections import Counter
from typing import Any

import pytest

from lockgate import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    GlobalWindows,
    Pipeline,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from lockgate.api.windows import (
    CountWindows,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowFunctionKind,
    WindowSpec,
)
from lockgate.connectors import SequenceSource
from lockgate.errors import PipelineDefinitionError, UserFunctionError
from lockgate.runtime.timers import PROCESSING_TIMERS_STATE, TIMERS_STATE
from lockgate.runtime.window_triggers import TRIGGER_STATE
from lockgate.state.keygroups import key_group_range
from tests import window_reference as ref
from tests.unit.test_windows import (
    SortedValues,
    Sum,
    WithWindow,
    drive,
    operator,
    random_input,
    spec,
    value,
)

INF = float("inf")


def with_trigger(assigner: Any, trigger: Trigger, kind: WindowFunctionKind,
                 lateness: int = 0) -> WindowSpec:
    return spec(assigner, kind, lateness)._replace(trigger=trigger)


def count_reference(records: list, watermarks: list[float], assign: Any, n: int,
                    lateness: int, purge: bool) -> tuple[list, list]:
    """Every ``n``-th record a window takes fires it with the sum of what it
    holds (all it took, or since the last firing when purging); windows
    late at a record's watermark take nothing."""
    counts: Counter = Counter()
    sums: Counter = Counter()
    fired, late = [], []
    for r, wm in zip(records, watermarks, strict=True):
        took = False
        for w in assign(r[1]):
            if w[1] - 1 + lateness <= wm:
                continue
            took = True
            counts[r[0], w] += 1
            sums[r[0], w] += value(r)
            if counts[r[0], w] == n:
                counts[r[0], w] = 0
                fired.append((r[0], w[0], w[1], sums[r[0], w]))
                if purge:
                    sums[r[0], w] = 0
        if not took and r[1] + lateness <= wm:
            late.append(r)
    return fired, late


def clean(op) -> bool:
    b = op.backend
    return (op.windows == {} and b.raw(TRIGGER_STATE) == {} and b.raw(TIMERS_STATE) == {})


@pytest.mark.parametrize("purge", [False, True])
@pytest.mark.parametrize("kind", [WindowFunctionKind.AGGREGATE, WindowFunctionKind.REDUCE])
def test_count_trigger_matches_the_reference(kind, purge):
    for seed, (assigner, assign) in enumerate([
            (TumblingEventTimeWindows.of(100), ref.tumbling(100)),
            (SlidingEventTimeWindows.of(100, 30), ref.sliding(100, 30))]):
        records, watermarks = random_input(seed)
        trigger = CountTrigger.of(3)
        op = operator(with_trigger(assigner, PurgingTrigger.of(trigger) if purge else trigger,
                                   kind, 120))
        got, late = drive(op, records, watermarks)
        want, want_late = count_reference(records, watermarks, assign, 3, 120, purge)
        assert Counter(got) == Counter(want) and want
        assert late == want_late and late
        assert clean(op), "window, trigger state or timers left behind"


@pytest.mark.parametrize("lateness", [0, 120])
def test_event_time_trigger_is_the_default_firing(lateness):
    for seed in range(2):
        records, watermarks = random_input(seed)
        op = operator(with_trigger(SlidingEventTimeWindows.of(100, 30), EventTimeTrigger(),
                                   WindowFunctionKind.PROCESS, lateness))
        got, late = drive(op, records, watermarks)
        want, want_late = ref.simulate(
            records, watermarks, key_of=lambda r: r[0], ts_of=lambda r: r[1], value_of=value,
            assign=ref.sliding(100, 30), lateness=lateness, result=lambda vs: tuple(sorted(vs)))
        assert Counter(got) == Counter(want)
        assert late == want_late
        assert clean(op)


def test_continuous_event_time_trigger_fires_every_interval_and_at_the_end():
    op = operator(with_trigger(TumblingEventTimeWindows.of(100), ContinuousEventTimeTrigger.of(
        30), WindowFunctionKind.AGGREGATE))
    op.process([("k", 5, 1), ("k", 40, 2)])
    assert op.process_watermark(28) == []
    assert op.process_watermark(29) == [("k", 0, 100, 3)]  # 29: the first interval's end
    op.process([("k", 70, 4)])
    assert op.process_watermark(65) == [("k", 0, 100, 7)]  # 59
    assert op.process_watermark(99) == [("k", 0, 100, 7), ("k", 0, 100, 7)]  # 89, the end
    assert clean(op)


def test_processing_time_trigger_fires_on_the_clock():
    op = operator(with_trigger(TumblingProcessingTimeWindows.of(100), ProcessingTimeTrigger(),
                               WindowFunctionKind.PROCESS))
    op.window_spec = op.window_spec._replace(function=SortedValues())
    op.clock = lambda: 1_050
    op.process([("a", None, 1), ("b", None, 2)])
    assert op.next_processing_timer() == 1_099
    assert sorted(op.process_processing_time(1_099)) == [
        ("a", 1_000, 1_100, (1,)), ("b", 1_000, 1_100, (2,))]
    assert op.windows == {} and op.backend.raw(PROCESSING_TIMERS_STATE) == {}


def test_global_windows_with_a_purging_count_trigger_are_count_windows():
    op = operator(WindowSpec(GlobalWindows.create(), WindowFunctionKind.AGGREGATE, Sum(),
                             trigger=PurgingTrigger.of(CountTrigger.of(4))))
    rng = random.Random(3)
    records = [(rng.randrange(3), 0, i) for i in range(60)]
    op.window_spec = op.window_spec._replace(window_function=None)
    op._user = None
    got = op.process(records)
    want = ref.count_windows(records, 4, key_of=lambda r: r[0], value_of=value)
    assert got == [v for _, v in want] and got
    assert op.backend.raw(TRIGGER_STATE) != {}, "the counts of the keys' open windows"


class CountValues(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield (key, tuple(sorted(value(e) for e in elements)))


def sliding_count_reference(records: list, size: int, slide: int) -> list[tuple]:
    seen: dict[Any, list[int]] = {}
    out = []
    for r in records:
        vs = seen.setdefault(r[0], [])
        vs.append(value(r))
        if len(vs) % slide == 0:
            out.append((r[0], tuple(sorted(vs[-size:]))))
    return out


@pytest.mark.parametrize("size,slide", [(5, 2), (3, 3), (2, 5)])
def test_sliding_count_windows_match_the_reference(size, slide):
    rng = random.Random(size * 10 + slide)
    records = [(rng.randrange(4), 0, i) for i in range(120)]
    want = sliding_count_reference(records, size, slide)
    for kind in WindowFunctionKind:
        op = operator(spec(CountWindows(size, slide), kind)._replace(
            timestamp_of=None, window_function=None,
            function=CountValues() if kind == WindowFunctionKind.PROCESS
            else spec(CountWindows(size, slide), kind).function))
        half = op.process(records[:60])
        op.snapshot(1)  # the stored buffers are shared from here: copied before changing
        got = half + op.process(records[60:])
        if kind == WindowFunctionKind.PROCESS:
            assert got == want
        else:
            got = [v[2] if kind == WindowFunctionKind.REDUCE else v for v in got]
            assert got == [sum(vs) for _, vs in want], kind
        assert all(len(b[None]) <= size + slide for b in op.windows.values())


def test_trigger_state_restores_at_another_parallelism():
    records, watermarks = random_input(7, n=800, keys=11)
    window = with_trigger(SlidingEventTimeWindows.of(100, 50), CountTrigger.of(4),
                          WindowFunctionKind.AGGREGATE, 60)
    whole, whole_late = drive(operator(window), records, watermarks)
    first = operator(window)
    out, late = drive(first, records[:400], watermarks[:400], end=False)
    assert first.backend.raw(TRIGGER_STATE), "counts in state at the snapshot"
    snap = first.snapshot(1)
    buf = io.BytesIO()
    blocks = snap.keyed.write(buf)
    data = buf.getvalue()
    for index in range(3):
        op = operator(window, index, 3)
        for kg in key_group_range(index, 3, op.backend.max_parallelism):
            if kg in blocks.key_groups:
                offset, length = blocks.key_groups[kg]
                op.backend.restore_block(data[offset:offset + length], blocks.states)
        op.restore_operator_state(snap.operator_state)
        mine = [i for i, r in enumerate(records[400:], 400)
                if op.backend._assigner.key_group(r[0]) in op.backend.key_group_range]
        o, lt = drive(op, [records[i] for i in mine], [watermarks[i] for i in mine])
        out += o
        late += lt
    assert Counter(out) == Counter(whole) and whole
    assert sorted(late) == sorted(whole_late)


class Bad(Trigger):
    def on_element(self, element, timestamp, window, ctx):
        return "fire"


class Raising(Trigger):
    def on_element(self, element, timestamp, window, ctx):
        return {}["missing"]


def test_what_triggers_refuse():
    p = Pipeline("t")
    keyed = p.source(SequenceSource(1, 10), uid="s",
                     watermarks=WatermarkStrategy(lambda x: x, 0)).key_by(lambda x: x % 2)
    with pytest.raises(PipelineDefinitionError, match="session"):
        keyed.window(EventTimeSessionWindows.with_gap(5)).trigger(CountTrigger.of(2))
    with pytest.raises(PipelineDefinitionError, match="count windows"):
        keyed.count_window(5).trigger(CountTrigger.of(2))
    with pytest.raises(PipelineDefinitionError, match="takes a Trigger"):
        keyed.window(TumblingEventTimeWindows.of(5)).trigger(lambda *a: None)
    with pytest.raises(PipelineDefinitionError, match="GlobalWindows"):
        keyed.window(GlobalWindows.create()).reduce(lambda a, b: a + b)
    with pytest.raises(ValueError):
        CountTrigger.of(0)
    with pytest.raises(ValueError):
        keyed.count_window(5, 0)
    keyed.window(GlobalWindows.create()).trigger(CountTrigger.of(2)).reduce(
        lambda a, b: a + b, uid="ok")
    op = operator(with_trigger(TumblingEventTimeWindows.of(10), Bad(),
                               WindowFunctionKind.AGGREGATE))
    with pytest.raises(UserFunctionError, match="not a TriggerResult"):
        op.process([("k", 1, 1)])
    op = operator(with_trigger(TumblingEventTimeWindows.of(10), Raising(),
                               WindowFunctionKind.AGGREGATE))
    with pytest.raises(UserFunctionError, match=r"raised KeyError in trigger.on_element\(\)") as e:
        op.process([("k", 1, 1)])
    assert isinstance(e.value.__cause__, KeyError)
    assert TriggerResult.FIRE_AND_PURGE.fires and TriggerResult.FIRE_AND_PURGE.purges
    assert WithWindow  # the window function of the reference specs


class EarlyAndOnTime(Trigger):
    """The example of docs/windows.md, every 3 records instead of 100."""
    COUNT = ValueStateDescriptor("count", default=0)

    def on_element(self, element, timestamp, window, ctx):
        ctx.register_event_time_timer(window.max_timestamp())
        count = ctx.get_state(self.COUNT)
        count.update(count.value() + 1)
        if count.value() % 3 == 0:
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def clear(self, window, ctx):
        ctx.delete_event_time_timer(window.max_timestamp())


def test_the_documented_trigger_fires_early_and_on_time():
    op = operator(with_trigger(TumblingEventTimeWindows.of(10), EarlyAndOnTime(),
                               WindowFunctionKind.AGGREGATE))
    assert op.process([("k", t, t) for t in range(1, 8)] + [("j", 12, 5)]) == [
        ("k", 0, 10, 6), ("k", 0, 10, 21)]
    assert op.process_watermark(9) == [("k", 0, 10, 28)]
    assert op.process_watermark(INF) == [("j", 10, 20, 5)]
    assert clean(op)


def test_triggers_and_sliding_count_windows_on_rocksdb(tmp_path):
    """The same operator over the RocksDB backend's views: trigger state and
    count buffers written back, through a snapshot, and cleaned up."""
    pytest.importorskip("rocksdict")
    from lockgate.api.plan import OperatorKind
    from lockgate.connectors.base import TaskInfo
    from lockgate.graph.jobgraph import OperatorSpec
    from lockgate.runtime.windows import WindowOperator
    from lockgate.state.backends import RocksDBStateBackend, close_backend
    from lockgate.state.serde import StateSerializer

    def rocks(window: WindowSpec) -> WindowOperator:
        op = WindowOperator(OperatorSpec("w", OperatorKind.WINDOW, window, lambda r: r[0]),
                            TaskInfo("job", "w", 0, 1, 16, 0))
        op.setup(RocksDBStateBackend(local_dir=str(tmp_path / "rocks"), memory_mb=16,
                                     incremental=False), str(tmp_path / "job"))
        op.open(StateSerializer())
        return op

    records, watermarks = random_input(1)
    op = rocks(with_trigger(SlidingEventTimeWindows.of(100, 30),
                            PurgingTrigger.of(CountTrigger.of(3)), WindowFunctionKind.AGGREGATE,
                            120))
    try:
        first, _ = drive(op, records[:300], watermarks[:300], end=False)
        op.snapshot(1)
        rest, late = drive(op, records[300:], watermarks[300:])
        want, _ = count_reference(records, watermarks, ref.sliding(100, 30), 3, 120, True)
        assert Counter(first + rest) == Counter(want) and want
        b = op.backend
        assert not list(b.state_keys(TRIGGER_STATE)) and not list(b.state_keys("_windows"))
    finally:
        close_backend(op.backend)
    rng = random.Random(1)
    records = [(rng.randrange(4), 0, i) for i in range(120)]
    op = rocks(spec(CountWindows(5, 2), WindowFunctionKind.AGGREGATE)._replace(
        timestamp_of=None, window_function=None))
    try:
        got = op.process(records[:50])
        op.snapshot(1)
        got += op.process(records[50:])
        assert got == [sum(vs) for _, vs in sliding_count_reference(records, 5, 2)]
    finally:
        close_backend(op.backend)


def test_count_evictor_and_count_trigger_on_global_windows_are_sliding_count_windows():
    from lockgate.api.evictors import CountEvictor

    rng = random.Random(8)
    records = [(rng.randrange(4), 0, i) for i in range(120)]
    op = operator(WindowSpec(GlobalWindows.create(), WindowFunctionKind.PROCESS, CountValues(),
                             trigger=CountTrigger.of(2), evictor=CountEvictor.of(5)))
    got = op.process(records[:60])
    op.snapshot(1)
    got += op.process(records[60:])
    assert got == sliding_count_reference(records, 5, 2)
    assert all(len(t[None]) <= 5 + 2 for t in op.windows.values()), "evicted from state too"


def test_time_evictor_keeps_the_newest_records_of_a_window():
    from lockgate.api.evictors import TimeEvictor

    op = operator(with_trigger(TumblingEventTimeWindows.of(100), CountTrigger.of(3),
                               WindowFunctionKind.PROCESS)._replace(evictor=TimeEvictor.of(20)))
    op.window_spec = op.window_spec._replace(function=SortedValues())
    op._user = op.window_spec.function
    assert op.process([("k", 5, 1), ("k", 30, 2), ("k", 41, 3)]) == [("k", 0, 100, (2, 3))]
    assert op.process([("k", 42, 4), ("k", 70, 5), ("k", 60, 6)]) == [("k", 0, 100, (5, 6))]
    p = Pipeline("e")
    keyed = p.source(SequenceSource(1, 10), uid="s",
                     watermarks=WatermarkStrategy(lambda x: x, 0)).key_by(lambda x: x % 2)
    with pytest.raises(PipelineDefinitionError, match="process window function"):
        keyed.window(TumblingEventTimeWindows.of(5)).evictor(TimeEvictor.of(2)).reduce(
            lambda a, b: a + b)
    with pytest.raises(PipelineDefinitionError, match="event-time"):
        keyed.window(TumblingProcessingTimeWindows.of(5)).evictor(TimeEvictor.of(2))
    with pytest.raises(PipelineDefinitionError, match="no evictor"):
        keyed.window(EventTimeSessionWindows.with_gap(5)).evictor(TimeEvictor.of(2))
