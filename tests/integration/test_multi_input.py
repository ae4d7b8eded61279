"""Several inputs in real jobs (local launcher), each output against a
plain-Python reference over the whole input: union (of streams of other
parallelism and of a side output), connect (not keyed; keyed with shared
state and event-time timers), broadcast state reaching every task, the
interval join and the window joins (tumbling, sliding, session) with
out-of-order input from two sources."""

from __future__ import annotations

from collections import Counter

from lockgate import (
    BroadcastProcessFunction,
    CheckpointConfig,
    CoProcessFunction,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    MapStateDescriptor,
    OutputTag,
    Pipeline,
    ProcessJoinFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from lockgate.connectors import CollectSink, SequenceSource
from tests import join_reference as jref
from tests import window_reference as wref

N = 3_000
ODD = OutputTag("odd")
RULES = MapStateDescriptor("rules")


def ts_a(x: int) -> int:
    """Side a's event time: 3 per record, up to 20 out of order."""
    return 3 * x - (x * 7) % 20


def ts_b(x: int) -> int:
    return 5 * x - (x * 11) % 30


class Split(KeyedProcessFunction):
    def process_element(self, x, ctx):
        if x % 2:
            ctx.output(ODD, x)
            return None
        return [x]


class Tag(CoProcessFunction):
    def process_element1(self, x, ctx):
        return [("first", x)]

    def process_element2(self, x, ctx):
        return [("second", x)]


class Balance(CoProcessFunction):
    """Per key: the first input adds, the second subtracts; the balance is
    emitted by an event-time timer at the end of input."""

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element1(self, x, ctx):
        self.total.update(self.total.value() + x)
        ctx.timer_service.register_event_time_timer(10**9)

    def process_element2(self, x, ctx):
        self.total.update(self.total.value() - x)
        ctx.timer_service.register_event_time_timer(10**9)

    def on_timer(self, timestamp, ctx):
        yield (ctx.current_key, self.total.value())


class Rules(BroadcastProcessFunction):
    def process_element(self, x, ctx):
        return None

    def process_broadcast_element(self, r, ctx):
        ctx.get_broadcast_state(RULES).put(r, r * r)

    def finish(self, ctx):
        yield (ctx.task_index, sorted(ctx.get_broadcast_state(RULES).items()))


class Pair(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        yield (left, right)


def test_union_connect_and_broadcast_jobs(tmp_path):
    p = Pipeline("multi", parallelism=2,
                 checkpoint=CheckpointConfig(storage=str(tmp_path / "checkpoints")))
    wm_a, wm_b = WatermarkStrategy(ts_a, 20), WatermarkStrategy(ts_b, 30)
    a = p.source(SequenceSource(1, N), uid="a", watermarks=wm_a)
    b = p.source(SequenceSource(1, N // 2), uid="b", parallelism=1, watermarks=wm_b)
    split = a.key_by(lambda x: x % 4).process(Split(), uid="split")
    sinks = {name: CollectSink() for name in ("union", "tag", "balance", "rules")}
    (split.union(split.side_output(ODD).map(lambda x: -x, uid="neg"), b)
     .sink(sinks["union"], uid="union-out"))
    b2 = p.source(SequenceSource(1, 500), uid="b2", parallelism=1)
    (p.source(SequenceSource(1, 700), uid="a2").connect(b2).process(Tag(), uid="tag")
     .sink(sinks["tag"], uid="tag-out"))
    b3 = p.source(SequenceSource(1, N), uid="b3", watermarks=wm_b, parallelism=1)
    (p.source(SequenceSource(1, N), uid="a3", watermarks=wm_a)
     .connect(b3.map(lambda x: x * 2, uid="twice")).key_by(lambda x: x % 7, lambda y: y % 7)
     .process(Balance(), uid="balance").sink(sinks["balance"], uid="balance-out"))
    rules = p.source(SequenceSource(1, 40), uid="rules", parallelism=1).broadcast(RULES)
    (p.source(SequenceSource(1, 100), uid="data", parallelism=3).connect(rules)
     .process(Rules(), uid="apply", parallelism=3).sink(sinks["rules"], uid="rules-out"))
    assert p.run(launcher="local").status == "finished"

    evens = [x for x in range(1, N + 1) if x % 2 == 0]
    odds = [-x for x in range(1, N + 1) if x % 2]
    assert Counter(sinks["union"].results()) == Counter(evens + odds + list(range(1, N // 2 + 1)))
    assert Counter(sinks["tag"].results()) == Counter(
        [("first", x) for x in range(1, 701)] + [("second", x) for x in range(1, 501)])
    want = Counter()
    for x in range(1, N + 1):
        want[x % 7] += x
        want[(2 * x) % 7] -= 2 * x
    assert sorted(sinks["balance"].results()) == sorted(want.items())
    everything = sorted((r, r * r) for r in range(1, 41))
    assert sorted(sinks["rules"].results()) == [(i, everything) for i in range(3)]


def test_interval_and_window_joins_match_the_reference(tmp_path):
    p = Pipeline("joins", parallelism=2,
                 checkpoint=CheckpointConfig(storage=str(tmp_path / "checkpoints")))
    wm_a, wm_b = WatermarkStrategy(ts_a, 20), WatermarkStrategy(ts_b, 30)
    key_a, key_b = (lambda x: x % 5), (lambda y: y % 5)
    a = p.source(SequenceSource(1, N), uid="a", watermarks=wm_a)
    b = p.source(SequenceSource(1, N), uid="b", watermarks=wm_b, parallelism=1)
    a_odd = a.filter(lambda x: x % 3 != 0, uid="a-some")
    sinks = {name: CollectSink() for name in ("interval", "tumbling", "sliding", "session")}
    (a_odd.key_by(key_a).interval_join(b.key_by(key_b)).between(-7, 12)
     .process(Pair(), uid="interval").sink(sinks["interval"], uid="interval-out"))
    assigners = {"tumbling": (TumblingEventTimeWindows.of(60), wref.tumbling(60), False),
                 "sliding": (SlidingEventTimeWindows.of(60, 20), wref.sliding(60, 20), False),
                 "session": (EventTimeSessionWindows.with_gap(9), wref.session(9), True)}
    for name, (assigner, _, _) in assigners.items():
        a2 = p.source(SequenceSource(1, 600), uid=f"{name}-a", watermarks=wm_a)
        b2 = p.source(SequenceSource(1, 400), uid=f"{name}-b", watermarks=wm_b, parallelism=1)
        (a2.join(b2).where(key_a).equal_to(key_b).window(assigner)
         .apply(lambda x, y: (x, y), uid=name).sink(sinks[name], uid=f"{name}-out"))
    assert p.run(launcher="local").status == "finished"

    # no record is late in these inputs: the watermarks do not matter
    left = [(0, x) for x in range(1, N + 1) if x % 3 != 0]
    events = [(side, x, float("-inf")) for side, x in left + [(1, y) for y in range(1, N + 1)]]
    pairs, late_l, late_r = jref.interval_join(
        events, key_of=lambda side, r: r % 5, ts_of=lambda side, r: (ts_a, ts_b)[side](r),
        lower=-7, upper=12)
    assert not late_l and not late_r and pairs
    assert Counter(sinks["interval"].results()) == Counter(pairs)
    for name, (_, assign, merging) in assigners.items():
        tagged = [(0, x) for x in range(1, 601)] + [(1, y) for y in range(1, 401)]
        fired, late = wref.simulate(
            tagged, [float("-inf")] * len(tagged), key_of=lambda t: t[1] % 5,
            ts_of=lambda t: (ts_a, ts_b)[t[0]](t[1]), value_of=lambda t: t, assign=assign,
            merging=merging,
            result=lambda vs: [(x, y) for s, x in vs if s == 0 for t, y in vs if t == 1])
        want = Counter(pair for *_, ps in fired for pair in ps)
        assert not late and want
        assert Counter(sinks[name].results()) == want, name
