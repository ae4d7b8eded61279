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
    EventTimeSessionWindows,
    FixedDelayRestart,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.api.joins import ProcessJoinFunction
from lockgate.connectors import FileSink, SequenceSource

sys.path.insert(0, str(Path(__file__).parents[2]))
from tests import window_reference as ref

LATE = OutputTag("late")
SLIDE = 300
"""``--windows sliding``: windows of ``ref.SIZE`` every ``SLIDE``."""
GAP = 25
"""``--windows session``: the session gap."""
BOUND = 100
"""``--windows join``: numbers pair with those ``BOUND`` apart in event time or less."""


class WithWindow(ProcessWindowFunction):
    """``[key, window start, sum]``."""

    def process(self, key, context, elements):
        yield [key, context.window.start, elements[0]]


class WithEnd(ProcessWindowFunction):
    """``[key, window start, window end, sum]`` (sliding and session
    windows), ``slow`` seconds each (sessions: most hold one record, so
    the reduce function is rarely called)."""

    def __init__(self, slow: float = 0.0) -> None:
        self.slow = slow

    def process(self, key, context, elements):
        if self.slow:
            time.sleep(self.slow)
        yield [key, context.window.start, context.window.end, elements[0]]


class Pair(ProcessJoinFunction):
    """``[left, right]``, ``slow`` seconds each."""

    def __init__(self, slow: float = 0.0) -> None:
        self.slow = slow

    def process_element(self, left, right, ctx):
        if self.slow:
            time.sleep(self.slow)
        yield [left, right]


def assigner(windows: str):
    """The window assigner of ``--windows``."""
    if windows == "sliding":
        return SlidingEventTimeWindows.of(ref.SIZE, SLIDE)
    if windows == "session":
        return EventTimeSessionWindows.with_gap(GAP)
    return TumblingEventTimeWindows.of(ref.SIZE)


def build(n: int, parallelism: int, keys: int, out: str, late: str, storage: str,
          interval: float = 0.2, rate: float | None = None, unaligned: bool = False,
          slow: float = 0.0, trigger: int = 0, windows: str = "tumbling",
          stamps: str = "default") -> Pipeline:
    """``slow``: seconds the window's reduce function sleeps per record
    (backpressure: batches and watermarks queue up in flight); ``trigger``:
    fire every ``trigger``-th record of a window (``CountTrigger``) instead
    of on the watermark); ``windows``: tumbling, sliding or session (these
    two write ``[key, start, end, sum]``), or ``join``: instead of windows,
    an interval join of the numbers with their negatives (``[x, -y]`` for
    ``|t(x) - t(y)| <= BOUND``; late records of both sides to the side
    output); ``stamps``: the event times, ``ref.STAMPS[stamps]``."""
    stamp = ref.STAMPS[stamps]
    p = Pipeline("windowed-sums", parallelism=parallelism, batch_size=ref.BATCH,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0,
                                             unaligned=unaligned),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))

    def add(a: int, b: int) -> int:
        if slow:
            time.sleep(slow)
        return a + b
    numbers = p.source(SequenceSource(1, n, rate=rate), uid="numbers", parallelism=1,
                       watermarks=WatermarkStrategy(stamp, ref.OUT_OF_ORDER, interval=0))
    if windows == "join":
        negatives = (numbers.map(lambda x: -x, uid="negated", parallelism=1)
                     .key_by(lambda y: -y % keys))
        pairs = (numbers.key_by(lambda x: x % keys)
                 .interval_join(negatives, timestamp_of=stamp,
                                other_timestamp_of=lambda y: stamp(-y))
                 .between(-BOUND, BOUND)
                 .side_output_left_late_data(LATE).side_output_right_late_data(LATE)
                 .process(Pair(slow), uid="sums"))
        pairs.sink(FileSink(out, format="jsonl"), uid="out")
        pairs.side_output(LATE).sink(FileSink(late, format="jsonl"), uid="late-out")
        return p
    windowed = numbers.key_by(lambda x: x % keys).window(assigner(windows))
    if trigger:
        windowed = windowed.trigger(CountTrigger.of(trigger))
    sums = (windowed
             .allowed_lateness(ref.LATENESS)
             .side_output_late_data(LATE)
             .reduce(add, WithWindow() if windows == "tumbling"
                     else WithEnd(slow if windows == "session" else 0.0), uid="sums"))
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
    ap.add_argument("--windows", default="tumbling",
                    choices=["tumbling", "sliding", "session", "join"])
    ap.add_argument("--stamps", default="default", choices=sorted(ref.STAMPS))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.keys, args.out, args.late, args.storage,
              args.interval, args.rate, args.unaligned, args.slow, args.trigger, args.windows,
              args.stamps)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
