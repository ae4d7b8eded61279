"""The Nexmark queries (``benchmarks/nexmark``) against their plain-Python
references over the same events, record by record: one job runs all of them
on one source at parallelism 2 (every keyed stage, window, join and the
connect spread over two tasks), with short windows so that many fire; and
the generator itself: deterministic, the 1 : 3 : 46 proportions, ids that
refer to people and auctions that exist (or are about to).

q12's windows are of processing time, so what one run gives depends on when
each bid was processed. In the job it is checked by what holds whatever the
timing: every bid of every bidder counted exactly once, windows aligned to
their size, one row per bidder and window, every window within the wall
clock of the run. Record by record, its window operator (the query's own
spec) runs on a clock the test sets, against the reference on that clock."""

from __future__ import annotations

import random
import time
from collections import Counter

from benchmarks.nexmark.generator import GeneratorConfig, NexmarkGenerator
from benchmarks.nexmark.job import QUERIES, build
from benchmarks.nexmark.queries import Windows
from benchmarks.nexmark.queries_more import q12_bidders
from benchmarks.nexmark.reference import reference
from benchmarks.nexmark.reference_more import q12_on_clock
from benchmarks.nexmark.source import NexmarkSource
from lockgate import Pipeline
from lockgate.api.watermarks import MAX_WATERMARK
from lockgate.connectors import FileSink
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.collect import CollectSink
from lockgate.graph.jobgraph import build_job_graph
from lockgate.runtime.windows import WindowOperator
from lockgate.state.serde import StateSerializer
from tests.fixtures import committed_lines

EVENTS = 24_000
CONFIG = GeneratorConfig(rate=1_000)  # 24 s of event time
WINDOWS = Windows(size=2_000, slide=500)


def test_every_query_equals_its_reference(tmp_path):
    # q10 logs to files, as Flink's does: through the exactly-once file sink
    sinks = {q: FileSink(str(tmp_path / q), format="jsonl") if q == "q10"
             else CollectSink(str(tmp_path / q)) for q in QUERIES}
    p = build(list(QUERIES), EVENTS, sinks.__getitem__, parallelism=2, config=CONFIG,
              windows=WINDOWS, storage=str(tmp_path / "chk"), interval=0.5, batch_size=256)
    began = time.time() * 1000
    result = p.run(launcher="local")
    ended = time.time() * 1000
    assert result.status == "finished"
    events = NexmarkGenerator(CONFIG).events(0, EVENTS)
    for q, sink in sinks.items():
        if q == "q12":
            check_q12(sink.results(), events, began, ended)
            continue
        expected = reference(q, events, WINDOWS)
        rows = committed_lines(tmp_path / q) if q == "q10" else sink.results()
        got = Counter(tuple(r) for r in rows)
        assert got == expected, f"{q}: {sum(got.values())} rows, expected {sum(expected.values())}"
        assert expected, f"{q} has no result over this input: the test would prove nothing"


def test_the_generator_is_deterministic_and_keeps_the_proportions():
    g1, g2 = NexmarkGenerator(), NexmarkGenerator()
    events = g1.events(0, 20_000)
    assert events == [g2.event(i) for i in reversed(range(20_000))][::-1]
    assert Counter(e[0] for e in events) == {"P": 400, "A": 1_200, "B": 18_400}
    people = {e[1] for e in events if e[0] == "P"}
    auctions = {e[1] for e in events if e[0] == "A"}
    assert people == set(range(1000, 1400)) and auctions == set(range(1000, 2200))
    # bids and auctions refer to existing ids, or to the next few (the lead)
    assert all(e[1] < max(auctions) + 11 and e[2] < max(people) + 11
               for e in events if e[0] == "B")
    assert all(e[8] < max(people) + 11 for e in events if e[0] == "A")
    times = [g1.config.timestamp(i) for i in (0, 9_999, 10_000)]
    assert times == [g1.config.base_time, g1.config.base_time + 999, g1.config.base_time + 1000]


def check_q12(rows: list, events: list, began: float, ended: float) -> None:
    """What q12 gives on any clock: each bidder's bids, all counted, in
    aligned windows of the run's time, one row per bidder and window."""
    size = WINDOWS.size
    bids = Counter(e[2] for e in events if e[0] == "B")
    counted: Counter = Counter()
    for bidder, n, start, end in rows:
        counted[bidder] += n
        assert n > 0 and end - start == size and start % size == 0, (bidder, n, start, end)
        assert began - size < start <= ended, (start, began, ended)
    assert counted == bids
    windows = [(bidder, start) for bidder, _, start, _ in rows]
    assert len(windows) == len(set(windows))


def test_q12_on_a_clock_the_test_sets():
    """q12's window operator (the spec of the query's graph) on a clock that
    moves by a random step between batches of bids, its windows firing as the
    clock passes them and the rest at the end of input: record by record
    equal to the reference on the same clock."""
    p = Pipeline("q12", parallelism=1)
    QUERIES["q12"](p.source(NexmarkSource(1), uid="events"), WINDOWS).sink(
        CollectSink(), uid="out")
    (spec,) = [op for v in build_job_graph(p).vertices for op in v.operators if op.uid == "q12"]
    op = WindowOperator(spec, TaskInfo("job", "q12", 0, 1, 128, 0))
    op.open(StateSerializer())
    rng = random.Random(12)
    bids = [e for e in NexmarkGenerator(CONFIG).events(0, 6_000) if e[0] == "B"]
    now, out, timed = 1_000_000, [], []
    i = 0
    while i < len(bids):
        batch = bids[i:i + rng.randrange(1, 200)]
        i += len(batch)
        now += rng.randrange(0, 700)
        out += op.process_processing_time(now)
        op.clock = lambda t=now: t
        out += op.process(q12_bidders(batch))  # what the source's task sends it
        timed += [(b, now) for b in batch]
    out += op.process_watermark(MAX_WATERMARK)
    expected = q12_on_clock(timed, WINDOWS.size)
    assert Counter(out) == Counter(expected) and len(expected) > 100
    assert op.windows == {}
