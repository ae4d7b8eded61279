"""The windowed fault-injection job: per key and tumbling event-time window,
the sum of the records, with late records to a side output; both written by
file sinks.

Run as the driver process of a fault test::

    python tests/fault/windows_job.py --n 30000 --parallelism 2 --out OUT --late LATE \
        --storage CHK --launcher local

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from lockgate import (
    CheckpointConfig,
    CountTrigger,
    FixedDelayRestart,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, SequenceSource

sys.path.insert(0, str(Path(__file__).parents[2]))
from tests import window_reference as ref

LATE = OutputTag("late")


class WithWindow(ProcessWindowFunction):
    """``[key, window start, sum]``."""

    def process(self, key, context, elements):
        yield [key, context.window.start, elements[0]]


def build(n: int, parallelism: int, keys: int, out: str, late: str, storage: str,
          interval: float = 0.2, rate: float | None = None, unaligned: bool = False,
          slow: float = 0.0, trigger: int = 0) -> Pipeline:
    """``slow``: seconds the window's reduce function sleeps per record
    (backpressure: batches and watermarks queue up in flight); ``trigger``:
    fire every ``trigger``-th record of a window (``CountTrigger``) instead
    of on the watermark."""
    p = Pipeline("windowed-sums", parallelism=parallelism, batch_size=ref.BATCH,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0,
                                             unaligned=unaligned),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))

    def add(a: int, b: int) -> int:
        if slow:
            time.sleep(slow)
        return a + b
    windows = (p.source(SequenceSource(1, n, rate=rate), uid="numbers", parallelism=1,
                        watermarks=WatermarkStrategy(ref.timestamp, ref.OUT_OF_ORDER, interval=0))
               .key_by(lambda x: x % keys)
               .window(TumblingEventTimeWindows.of(ref.SIZE)))
    if trigger:
        windows = windows.trigger(CountTrigger.of(trigger))
    sums = (windows
             .allowed_lateness(ref.LATENESS)
             .side_output_late_data(LATE)
             .reduce(add, WithWindow(), uid="sums"))
    sums.sink(FileSink(out, format="jsonl"), uid="out")
    sums.side_output(LATE).sink(FileSink(late, format="jsonl"), uid="late-out")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--late", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--unaligned", action="store_true")
    ap.add_argument("--slow", type=float, default=0.0)
    ap.add_argument("--trigger", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.keys, args.out, args.late, args.storage,
              args.interval, args.rate, args.unaligned, args.slow, args.trigger)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
