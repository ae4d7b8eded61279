"""The Nexmark queries (``benchmarks/nexmark``) against their plain-Python
references over the same events, record by record: one job runs all of them
on one source at parallelism 2 (every keyed stage, window, join and the
connect spread over two tasks), with short windows so that many fire; and
the generator itself: deterministic, the 1 : 3 : 46 proportions, ids that
refer to people and auctions that exist (or are about to)."""

from __future__ import annotations

from collections import Counter

from benchmarks.nexmark.generator import GeneratorConfig, NexmarkGenerator
from benchmarks.nexmark.job import build
from benchmarks.nexmark.queries import QUERIES, Windows
from benchmarks.nexmark.reference import reference
from lockgate.connectors import FileSink
from lockgate.connectors.collect import CollectSink
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
    result = p.run(launcher="local")
    assert result.status == "finished"
    events = NexmarkGenerator(CONFIG).events(0, EVENTS)
    for q, sink in sinks.items():
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
