"""Event time: watermarks from sources, event-time timers in a keyed process
function, MAX_WATERMARK at the end of input and on ``stop --drain``, timers
kept in a savepoint by a stop without drain and rescaled by key group — each
checked window by window against the expected counts."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lockgate import (
    MAX_WATERMARK,
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    MapStateDescriptor,
    Pipeline,
    WatermarkStrategy,
)
from lockgate.checkpoint import storage
from lockgate.cli.savepoint import describe_savepoint
from lockgate.connectors import FileSink, FileSource, SequenceSource
from tests.fault.held_source import HeldSequence
from tests.fixtures import committed_lines, hidden_files, sequence_read, start_and_await

WINDOW = 1_000
KEYS = 3


class WindowCounts(KeyedProcessFunction):
    """Tumbling event-time windows of ``WINDOW``: per key and window, the
    number of records, emitted when the watermark passes the window's end as
    ``[key, window end, count, fired at MAX_WATERMARK]``. A late record (its
    window already fired) is emitted as ``["late", x]``: none may come."""

    def __init__(self, timestamp_of: Callable[[Any], int]) -> None:
        self.timestamp_of = timestamp_of

    def open(self, ctx):
        self.counts = ctx.get_map_state(MapStateDescriptor("counts"))

    def process_element(self, x, ctx):
        end = (self.timestamp_of(x) // WINDOW + 1) * WINDOW
        if end - 1 <= ctx.timer_service.current_watermark():
            return [["late", x]]
        self.counts.put(end, self.counts.get(end, 0) + 1)
        ctx.timer_service.register_event_time_timer(end - 1)
        return None

    def on_timer(self, ts, ctx):
        end = ts + 1
        count = self.counts.get(end)
        self.counts.remove(end)
        at_max = ctx.timer_service.current_watermark() == MAX_WATERMARK
        return [[ctx.current_key, end, count, at_max]]


def timestamp(x: int, half: int) -> int:
    """Both splits of ``SequenceSource(1, 2 * half)`` at parallelism 2 walk
    through the same event time, 0 .. half - 1, side by side."""
    return (x - 1) % half


def expected(n: int) -> Counter:
    half = n // 2
    return Counter((x % KEYS, (timestamp(x, half) // WINDOW + 1) * WINDOW)
                   for x in range(1, n + 1))


def job(tmp: Path, n: int, parallelism: int, rate: float | None = None,
        interval: float = 0.2, watermark_interval: float = 0.2, held: bool = False) -> Pipeline:
    half = n // 2

    def ts(x: int) -> int:
        return timestamp(x, half)

    p = Pipeline("windows", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")),
                 restart=FixedDelayRestart(max_attempts=5, delay_s=0.0))
    source = HeldSequence(1, n, rate=rate) if held else SequenceSource(1, n, rate=rate)
    (p.source(source, uid="numbers",
              watermarks=WatermarkStrategy(ts, interval=watermark_interval))
       .key_by(lambda x: x % KEYS)
       .process(WindowCounts(ts), uid="windows")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def windows_of(out: Path) -> dict[tuple[int, int], list]:
    """Committed windows by (key, end); fails on a late record or a window twice."""
    lines = committed_lines(out)
    assert not [r for r in lines if r[0] == "late"], "records overtaken by a watermark"
    found: dict[tuple[int, int], list] = {}
    for k, end, count, at_max in lines:
        assert (k, end) not in found, f"window {(k, end)} emitted twice"
        found[(k, end)] = [count, at_max]
    return found


def test_windows_fire_on_watermarks_and_the_last_at_the_end(tmp_path: Path,
                                                            launcher: str) -> None:
    """Every window exactly once with its exact count. Only each key's last
    window (its timer is past the last finite watermark) fires at the end of
    input, on MAX_WATERMARK; all others fire as watermarks pass them (a
    watermark after every batch here: the job is over in well under the
    default interval)."""
    n = 40_000
    result = job(tmp_path, n, 2, watermark_interval=0).run(launcher=launcher)
    assert result.status == "finished"
    got = windows_of(tmp_path / "out")
    assert {w: c for w, (c, _) in got.items()} == dict(expected(n))
    fired_at_end = sorted(w for w, (_, at_max) in got.items() if at_max)
    assert fired_at_end == [(k, n // 2) for k in range(KEYS)]
    assert hidden_files(tmp_path / "out") == []


def test_windows_are_exact_under_kills(tmp_path: Path) -> None:
    """SIGKILLs at protocol points: timers are restored with the keyed state
    of the checkpoint, watermarks restart from the replayed records, and every
    window is committed once with its exact count."""
    n = 60_000
    faults = [
        {"point": "batch", "task": 0, "attempt": 0, "count": 15},
        {"point": "snapshot", "task": 3, "attempt": 1, "count": 2},
        {"point": "acked", "task": 0, "attempt": 2, "count": 2},
        {"point": "final_snapshot", "task": 2, "attempt": 3, "count": 1},
    ]
    result = job(tmp_path, n, 2, rate=60_000, interval=0.1).run(
        launcher="local", fault_injection=faults)
    assert result.restarts == len(faults), result.failures
    got = windows_of(tmp_path / "out")
    assert {w: c for w, (c, _) in got.items()} == dict(expected(n))
    assert hidden_files(tmp_path / "out") == []


def test_stop_keeps_timers_and_drain_fires_them(tmp_path: Path) -> None:
    """A stop without drain fires no timer: every committed window is complete,
    and the open windows' timers are in the savepoint. Resumed at parallelism
    3 (timers move with their key groups), then stopped with drain: end of
    input, MAX_WATERMARK, every remaining timer fires — so the committed
    windows are exactly those of the records the sources read, each once."""
    n = 400_000
    half = n // 2

    def started(parallelism: int, savepoint: str | None, ready: Callable[[], bool]):
        """The job, once a checkpoint completed after which ``ready()`` holds."""
        return start_and_await(job(tmp_path, n, parallelism, rate=60_000, held=True),
                               launcher="local",
                               from_savepoint=savepoint, until=lambda _: ready(),
                               what="the job did not get there")

    # the first job stops once some window was committed (a checkpoint
    # commits the windows that fired before its barrier: not always the first)
    first = started(2, None, lambda: bool(committed_lines(tmp_path / "out"))).stop(
        str(tmp_path / "sp"))
    assert first.status == "stopped"
    windows = next(op for op in describe_savepoint(first.savepoint)["operators"]
                   if op["uid"] == "windows")
    assert windows["keyed_states"] == {"counts": "map", "_timers": "map"}  # inspect shows them
    exp = expected(n)
    got = windows_of(tmp_path / "out")
    assert got and all(not at_max and count == exp[w] for w, (count, at_max) in got.items()), \
        "a stop without drain fired a timer early"

    drained = started(3, first.savepoint, lambda: True).stop(str(tmp_path / "sp"), drain=True)
    assert drained.status == "finished"
    # the numbers read (splits were cut anew at parallelism 3)
    records = sequence_read(drained.savepoint, n)
    assert 0 < len([x for x in records if x <= half]) < half, "the stop read no or all of 1..n/2"
    assert 0 < len([x for x in records if x > half]) < n - half
    assert len(records) == storage.read_metadata(drained.savepoint).progress.read
    cut = Counter((x % KEYS, (timestamp(x, half) // WINDOW + 1) * WINDOW) for x in records)
    got = windows_of(tmp_path / "out")
    assert {w: count for w, (count, _) in got.items()} == dict(cut)
    # windows past the largest finite watermark a source emitted (its last
    # timestamp - 1) can only have fired on the drain's MAX_WATERMARK
    last = max(timestamp(x, half) for x in records) - 1
    beyond = [at_max for (_, end), (_, at_max) in got.items() if end - 1 > last]
    assert beyond and all(beyond)
    assert hidden_files(tmp_path / "out") == []


@pytest.mark.parametrize("idle_timeout", [None, 0.3])
def test_an_idle_source_task_holds_event_time_back_unless_it_declares_idleness(
        tmp_path: Path, idle_timeout: float | None) -> None:
    """A watched folder with one file: one source subtask reads it, the other
    has nothing to read, ever. Without an idle timeout that subtask holds every
    watermark at MIN, so no window fires while the job runs; with one, it
    declares itself idle and the windows the reader's watermark passed fire
    and are committed. A drain then fires the rest: every window exactly."""
    n = 30_000
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.jsonl").write_text(
        "".join(f'{{"k": {i % KEYS}, "ts": {i}}}\n' for i in range(n)))
    p = Pipeline("idle", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    def ts(e: dict) -> int:
        return e["ts"]

    (p.source(FileSource(str(tmp_path / "in"), format="jsonl", watch=True), uid="events",
              watermarks=WatermarkStrategy(ts, idle_timeout=idle_timeout))
       .key_by(lambda e: e["k"])
       .process(WindowCounts(ts), uid="windows")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    after_input = {"checkpoints": 0}
    settled = threading.Event()

    def on_progress(progress) -> None:
        if progress.records_read == n:
            after_input["checkpoints"] += 1
            if after_input["checkpoints"] >= 8:  # >= 0.8 s after the last record
                settled.set()

    client = p.start(launcher="local", on_progress=on_progress)
    assert settled.wait(120), "the file was not read"
    expected_windows = Counter((i % KEYS, (i // WINDOW + 1) * WINDOW) for i in range(n))
    running = {w: count for w, (count, _) in windows_of(tmp_path / "out").items()}
    if idle_timeout is None:
        assert running == {}, "a window fired while a source subtask held event time back"
    else:  # the reader's last watermark is n - 2: every window ending by then
        assert running == {w: c for w, c in expected_windows.items() if w[1] - 1 <= n - 2}
    result = client.stop(str(tmp_path / "sp"), drain=True)
    assert result.status == "finished"
    assert len(committed_lines(tmp_path / "out")) == len(expected_windows)
    got = windows_of(tmp_path / "out")
    assert {w: count for w, (count, _) in got.items()} == dict(expected_windows)
