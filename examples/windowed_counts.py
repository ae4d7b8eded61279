"""Windowed counts with late data: clicks per user in tumbling one-minute
event-time windows, from JSONL files of ``{"user": ..., "ts": <epoch ms>}``
that arrive up to 10 s out of order.

A window is emitted when the watermark passes its end. It is kept 30 s
longer (allowed lateness): a click that comes late but within that updates
its window, which is emitted again with the new count (the latest line of a
window is its count). A click later than that goes to the side output of
late clicks, in OUT_DIR/late, instead of being lost.

    python examples/windowed_counts.py IN_DIR OUT_DIR
    lockgate run examples/windowed_counts.py IN_DIR OUT_DIR
"""

import os
import sys

from lockgate import (
    AggregateFunction,
    CheckpointConfig,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, FileSource

MINUTE = 60_000
LATE = OutputTag("late-clicks")


class CountClicks(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, click, count):
        return count + 1

    def get_result(self, count):
        return count

    def merge(self, a, b):
        return a + b


class PerUserAndMinute(ProcessWindowFunction):
    def process(self, user, context, counts):
        yield {"user": user, "window_start": context.window.start, "clicks": counts[0]}


def build(in_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("windowed-counts", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    counts = (p.source(FileSource(in_dir, format="jsonl"), uid="clicks",
                       watermarks=WatermarkStrategy(lambda c: c["ts"],
                                                    max_out_of_orderness=10_000, interval=0))
                .key_by(lambda c: c["user"])
                .window(TumblingEventTimeWindows.of(MINUTE))
                .allowed_lateness(30_000)
                .side_output_late_data(LATE)
                .aggregate(CountClicks(), PerUserAndMinute(), uid="counts"))
    counts.sink(FileSink(os.path.join(out_dir, "counts"), format="jsonl"), uid="counts-out")
    counts.side_output(LATE).sink(FileSink(os.path.join(out_dir, "late"), format="jsonl"),
                                  uid="late-out")
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} IN_DIR OUT_DIR")
    return build(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main().run()
