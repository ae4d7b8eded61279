"""Windows and side outputs in real jobs: every window kind against the
plain-Python reference (``tests/window_reference.py``) over out-of-order
input with records late within and beyond the allowed lateness, the late
side output holding exactly the dropped records, no window state left in the
final checkpoint, processing-time windows, and the side output of a keyed
process function."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from lockgate import (
    AggregateFunction,
    CheckpointConfig,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
)
from lockgate.checkpoint import storage
from lockgate.connectors import FileSink, SequenceSource
from lockgate.state.serde import StateSerializer
from tests import window_reference as ref
from tests.fixtures import committed_lines

KEYS = 3
LATE = OutputTag("late")
SLIDE = 300
GAP = 25
COUNT = 7


class WithWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield [key, context.window.start, context.window.end, elements[0]]


class SortedValues(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield [key, context.window.start, context.window.end, sorted(elements)]


class Sum(AggregateFunction):
    def create_accumulator(self):
        return {"sum": 0}

    def add(self, value, acc):
        acc["sum"] += value
        return acc

    def get_result(self, acc):
        return acc["sum"]

    def merge(self, a, b):
        return {"sum": a["sum"] + b["sum"]}


def keyed_entries(chk_dir: str, uid: str) -> Counter:
    """Entries per keyed state of operator ``uid`` in a checkpoint."""
    meta = storage.read_metadata(chk_dir)
    counts: Counter = Counter()
    for handle in meta.operators[uid].subtasks:
        if handle is None:
            continue
        data = storage.read_state_file(chk_dir, handle)
        for offset, length in handle.key_groups.values():
            start = handle.keyed_offset + offset
            _, content = StateSerializer().loads(data[start:start + length])
            for name, entries in content.items():
                counts[name] += len(entries)
    return counts


def lines(folder: Path) -> Counter:
    return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r)
                   for r in committed_lines(folder))


def test_every_window_kind_matches_the_reference(tmp_path: Path, launcher: str) -> None:
    n = 12_000
    p = Pipeline("windows", parallelism=2, batch_size=ref.BATCH,
                 checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp_path / "chk")))
    keyed = (p.source(SequenceSource(1, n), uid="numbers", parallelism=1,
                      watermarks=WatermarkStrategy(ref.timestamp, ref.OUT_OF_ORDER, interval=0))
              .key_by(lambda x: x % KEYS))
    tumbling = (keyed.window(TumblingEventTimeWindows.of(ref.SIZE))
                .allowed_lateness(ref.LATENESS).side_output_late_data(LATE)
                .reduce(lambda a, b: a + b, WithWindow(), uid="tumbling"))
    tumbling.sink(FileSink(str(tmp_path / "tumbling"), format="jsonl"), uid="tumbling-out")
    tumbling.side_output(LATE).sink(FileSink(str(tmp_path / "late"), format="jsonl"),
                                    uid="late-out")
    (keyed.window(SlidingEventTimeWindows.of(ref.SIZE, SLIDE)).allowed_lateness(ref.LATENESS)
          .aggregate(Sum(), WithWindow(), uid="sliding")
          .sink(FileSink(str(tmp_path / "sliding"), format="jsonl"), uid="sliding-out"))
    (keyed.window(EventTimeSessionWindows.with_gap(GAP)).allowed_lateness(ref.LATENESS)
          .process(SortedValues(), uid="sessions")
          .sink(FileSink(str(tmp_path / "sessions"), format="jsonl"), uid="sessions-out"))
    (keyed.count_window(COUNT).reduce(lambda a, b: a + b, uid="counts")
          .sink(FileSink(str(tmp_path / "counts"), format="jsonl"), uid="counts-out"))
    result = p.run(launcher=launcher)
    assert result.status == "finished", result.failures

    fired, late = ref.job_reference(n, KEYS, ref.tumbling(ref.SIZE))
    assert lines(tmp_path / "tumbling") == Counter(fired)
    assert sorted(committed_lines(tmp_path / "late")) == late and late
    assert max(Counter(w[:3] for w in fired).values()) > 1, "no late firing was tested"
    fired, _ = ref.job_reference(n, KEYS, ref.sliding(ref.SIZE, SLIDE))
    assert lines(tmp_path / "sliding") == Counter(fired)
    fired, _ = ref.job_reference(n, KEYS, ref.session(GAP), merging=True,
                                 result=lambda vs: tuple(sorted(vs)))
    assert lines(tmp_path / "sessions") == Counter(fired)
    counts = ref.count_windows(range(1, n + 1), COUNT, key_of=lambda x: x % KEYS,
                               value_of=lambda x: x)
    assert Counter(committed_lines(tmp_path / "counts")) == Counter(s for _, s in counts)

    # No window can fire any more: nothing is left in the final checkpoint
    # but the count windows that never filled up (they never fire).
    final = storage.latest_completed(str(tmp_path / "chk" / result.job_id))
    assert final is not None
    for uid in ("tumbling", "sliding", "sessions"):
        assert sum(keyed_entries(final, uid).values()) == 0, uid
    left = sum(1 for k in range(KEYS) if len(range(k or KEYS, n + 1, KEYS)) % COUNT)
    assert keyed_entries(final, "counts") == {"_windows": left, "_window_counts": left}


def test_processing_time_windows_fire_on_the_clock(tmp_path: Path) -> None:
    """Windows of 200 ms of the task's clock: each record in at most one
    window, every window aligned; only the windows open at the end of input
    do not fire (as in Flink)."""
    n = 3_000
    p = Pipeline("clock", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, n, rate=2_000), uid="numbers")
       .key_by(lambda x: x % KEYS)
       .window(TumblingProcessingTimeWindows.of(200))
       .process(SortedValues(), uid="windows")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    assert p.run(launcher="local").status == "finished"
    rows = committed_lines(tmp_path / "out")
    seen = [x for _, _, _, xs in rows for x in xs]
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(1, n + 1))
    assert all(end - start == 200 and start % 200 == 0 for _, start, end, _ in rows)
    assert all(x % KEYS == k for k, _, _, xs in rows for x in xs)
    assert len(seen) > n // 2


class Split(KeyedProcessFunction):
    """Even numbers to the main output, odd ones to the side output ``odd``."""

    def process_element(self, x, ctx):
        if x % 2:
            ctx.output(OutputTag("odd"), [ctx.current_key, x])
            return None
        return [x]


def test_side_output_of_a_keyed_process_function(tmp_path: Path, launcher: str) -> None:
    n = 5_000
    p = Pipeline("split", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    evens = (p.source(SequenceSource(1, n), uid="numbers")
               .key_by(lambda x: x % 5).process(Split(), uid="split"))
    evens.sink(FileSink(str(tmp_path / "even"), format="jsonl"), uid="even-out")
    (evens.side_output(OutputTag("odd")).map(lambda kx: kx[1] * 10, uid="times-ten")
          .sink(FileSink(str(tmp_path / "odd"), format="jsonl"), uid="odd-out"))
    assert p.run(launcher=launcher).status == "finished"
    assert sorted(committed_lines(tmp_path / "even")) == list(range(2, n + 1, 2))
    assert sorted(committed_lines(tmp_path / "odd")) == list(range(10, 10 * n + 1, 20))
