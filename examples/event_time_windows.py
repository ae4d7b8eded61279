"""Event time: clicks per user in tumbling one-minute windows, from JSONL
files of ``{"user": ..., "ts": <epoch milliseconds>}`` that arrive up to 10 s
out of order. A window is emitted once the watermark passes its end (at the
latest at the end of the input); a click later than that is emitted as late.

    python examples/event_time_windows.py IN_DIR OUT_DIR
    lockgate run examples/event_time_windows.py IN_DIR OUT_DIR
    spark-submit --master 'local[4]' examples/event_time_windows.py IN_DIR OUT_DIR
"""

import sys

from lockgate import (
    CheckpointConfig,
    KeyedProcessFunction,
    MapStateDescriptor,
    Pipeline,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, FileSource

MINUTE = 60_000


class ClicksPerMinute(KeyedProcessFunction):
    def open(self, ctx):
        self.counts = ctx.get_map_state(MapStateDescriptor("clicks"))  # window start -> n

    def process_element(self, click, ctx):
        start = click["ts"] - click["ts"] % MINUTE
        if start + MINUTE - 1 <= ctx.timer_service.current_watermark():
            return [{"user": ctx.current_key, "late": click["ts"]}]
        self.counts.put(start, self.counts.get(start, 0) + 1)
        ctx.timer_service.register_event_time_timer(start + MINUTE - 1)
        return None

    def on_timer(self, timestamp, ctx):
        start = timestamp + 1 - MINUTE
        clicks = self.counts.get(start)
        self.counts.remove(start)
        return [{"user": ctx.current_key, "window_start": start, "clicks": clicks}]


def build(in_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("clicks-per-minute", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    (p.source(FileSource(in_dir, format="jsonl"), uid="clicks",
              watermarks=WatermarkStrategy(lambda c: c["ts"], max_out_of_orderness=10_000))
       .key_by(lambda c: c["user"])
       .process(ClicksPerMinute(), uid="windows")
       .sink(FileSink(out_dir, format="jsonl"), uid="out"))
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} IN_DIR OUT_DIR")
    return build(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main().run()
