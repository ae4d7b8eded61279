"""Async I/O in real jobs against a real TCP service (``tests/async_service.py``,
an asyncio server in this process; the tasks connect to it over loopback):
results in input order or as they complete, at most ``capacity`` requests
in flight per task, timeouts that give a default or fail the job, and no
result of the unordered mode overtaking a watermark."""

from __future__ import annotations

from collections import Counter

import pytest

from lockgate import (
    AsyncFunction,
    CheckpointConfig,
    NoRestart,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.connectors import SequenceSource
from lockgate.connectors.collect import CollectSink
from lockgate.errors import JobFailedError
from tests.async_service import LookupService, answer, ask


@pytest.fixture(scope="module")
def service():
    with LookupService() as s:
        yield s


def _pipeline(tmp_path, name: str, parallelism: int = 1) -> Pipeline:
    return Pipeline(name, parallelism=parallelism, batch_size=64, restart=NoRestart(),
                    checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))


def _lookup(address: str, delay_of):
    async def lookup(x):
        return (x, await ask(address, x, delay_of(x)))
    return lookup


def test_ordered_results_come_in_input_order(tmp_path, service):
    """(The Spark launcher runs async_map in tests/fault/test_async_io.py.)"""
    n = 1500
    service.reset()
    p = _pipeline(tmp_path, "async-ordered")
    sink = CollectSink(str(tmp_path / "out"))
    # every 3rd request takes 15 ms, the others none: they complete out of order
    (p.source(SequenceSource(1, n), uid="numbers")
       .async_map(_lookup(service.address, lambda x: 15 if x % 3 == 0 else 0), capacity=16,
                  uid="lookup")
       .sink(sink, uid="out"))
    result = p.run(launcher="local")
    assert result.status == "finished"
    assert sink.results() == [(x, answer(x)) for x in range(1, n + 1)]
    assert service.max_in_flight <= 16


def test_unordered_results_come_as_they_complete(tmp_path, service):
    n = 1500
    service.reset()
    p = _pipeline(tmp_path, "async-unordered")
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(SequenceSource(1, n), uid="numbers")
       .async_map(_lookup(service.address, lambda x: 15 if x % 3 == 0 else 0), capacity=16,
                  ordered=False, uid="lookup")
       .sink(sink, uid="out"))
    assert p.run(launcher="local").status == "finished"
    got = sink.results()
    assert sorted(got) == [(x, answer(x)) for x in range(1, n + 1)]
    assert got != sorted(got), "a slow request never let a quick one after it overtake"


@pytest.mark.parametrize("ordered", [True, False])
def test_capacity_bounds_the_requests_in_flight(tmp_path, service, ordered):
    """Every request waits 20 ms at the service: the operator keeps exactly
    ``capacity`` in flight per task (2 tasks), never more."""
    n, capacity = 400, 6
    service.reset()
    p = _pipeline(tmp_path, "async-capacity", parallelism=2)
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(SequenceSource(1, n), uid="numbers")
       .async_map(_lookup(service.address, lambda x: 20), capacity=capacity,
                  ordered=ordered, uid="lookup")
       .sink(sink, uid="out"))
    assert p.run(launcher="local").status == "finished"
    assert sorted(sink.results()) == [(x, answer(x)) for x in range(1, n + 1)]
    assert service.requests == Counter(range(1, n + 1))
    assert capacity < service.max_in_flight <= 2 * capacity


class WindowCount(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield (context.window.start, len(elements))


class SlowOrDefault(AsyncFunction):
    """Values divisible by 50 take 3 s at the service: after ``timeout`` they
    get ``(x, None)``; ``open`` and ``close`` run on the event loop."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def open(self, ctx):
        self.task = ctx.task_index
        await ask(self.address, -1)  # the service answers before the first record

    async def invoke(self, x):
        return (x, await ask(self.address, x, 3000 if x % 50 == 0 else 1))

    def timeout(self, x):
        return (x, None)


@pytest.mark.parametrize("ordered", [True, False])
def test_timeouts_give_the_handlers_result(tmp_path, service, ordered):
    n = 300
    p = _pipeline(tmp_path, "async-timeout")
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(SequenceSource(1, n), uid="numbers")
       .async_map(SlowOrDefault(service.address), capacity=20, timeout=0.5, ordered=ordered,
                  uid="lookup")
       .sink(sink, uid="out"))
    assert p.run(launcher="local").status == "finished"
    expected = [(x, None if x % 50 == 0 else answer(x)) for x in range(1, n + 1)]
    got = sink.results()
    assert got == expected if ordered else sorted(got) == expected


def test_a_timeout_without_handler_fails_the_job(tmp_path, service):
    p = _pipeline(tmp_path, "async-timeout-fails")
    (p.source(SequenceSource(1, 20), uid="numbers")
       .async_map(_lookup(service.address, lambda x: 5000 if x == 7 else 0), capacity=4,
                  timeout=0.3, uid="lookup")
       .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(JobFailedError, match=r"AsyncTimeoutError.*'lookup'.*7.*timed out"):
        p.run(launcher="local")


def test_an_error_of_the_function_fails_the_job_naming_the_record(tmp_path, service):
    async def broken(x):
        if x == 13:
            raise ValueError("no such user")
        return x

    p = _pipeline(tmp_path, "async-error")
    (p.source(SequenceSource(1, 30), uid="numbers")
       .async_map(broken, capacity=4, ordered=False, uid="lookup")
       .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(JobFailedError, match=r"'lookup' raised ValueError.*record 13.*no such"):
        p.run(launcher="local")


def test_unordered_results_never_overtake_a_watermark(tmp_path, service):
    """Event time = the number; an event-time window downstream counts the
    results and sends late ones to a side output: had a result left after a
    watermark past its time, it would be late. None is, every window is exact."""
    n, size = 3000, 100
    p = _pipeline(tmp_path, "async-watermarks")
    late_tag = OutputTag("late")
    windows, late = CollectSink(str(tmp_path / "out")), CollectSink(str(tmp_path / "late"))
    counts = (p.source(SequenceSource(1, n), uid="numbers",
                       watermarks=WatermarkStrategy(lambda x: x, 0, interval=0))
                .async_map(_lookup(service.address, lambda x: 10 if x % 7 == 0 else 0),
                           capacity=32, ordered=False, uid="lookup")
                .key_by(lambda r: 0)
                .window(TumblingEventTimeWindows.of(size), timestamp_of=lambda r: r[0])
                .side_output_late_data(late_tag)
                .process(WindowCount(), uid="counts"))
    counts.sink(windows, uid="out")
    counts.side_output(late_tag).sink(late, uid="late-out")
    assert p.run(launcher="local").status == "finished"
    expected = Counter(x // size * size for x in range(1, n + 1))
    assert late.results() == []
    assert sorted(windows.results()) == sorted(expected.items())
