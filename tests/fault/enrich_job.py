"""The multi-input fault-injection job: broadcast state, a side output,
windows and an interval join in one pipeline, every stage exactly-once.

    numbers (1..n, event time) ─ key_by(x % KEYS) ─┐
                                                   ├ Enrich (KeyedBroadcastProcessFunction)
    rules (versions, event time) ─ broadcast ──────┘   │ main: (key, ts, x * factor)
                                                       │ side REJECTED: x (factor 0 or no rule)
      enriched ─ key_by ─ tumbling window sum ─────────┤
      enriched ─ key_by ─ interval_join(window sums, between(0, SIZE - 1))
                        ─ [key, ts, value, window sum] ─ file sink "out"
      REJECTED ─ file sink "rejected"

Enrich holds each number until the watermark (the smaller of both inputs')
passes its timestamp, then applies the rule of its class in force at that
time: by then every rule version up to it has arrived, on every task, so
the result does not depend on how the two inputs interleave.
``reference(n)`` computes both outputs in plain Python.

Run as the driver process of a fault test::

    python tests/fault/enrich_job.py --n 20000 --parallelism 2 --out OUT --rejected REJ \
        --storage CHK --launcher local

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fault.held_source

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    MapStateDescriptor,
    OutputTag,
    Pipeline,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.api.broadcast import KeyedBroadcastProcessFunction
from lockgate.api.joins import ProcessJoinFunction
from lockgate.connectors import FileSink, SequenceSource
from tests.fault.held_source import HeldSequence

KEYS = 5
CLASSES = 3
SIZE = 1_000
"""Tumbling windows of the enriched numbers."""
OUT_OF_ORDER = 50
RULE_EVERY = 7_000
"""A new version of every class's rule each RULE_EVERY of event time."""
RULES = MapStateDescriptor("rules")
REJECTED = OutputTag("rejected")


def timestamp(x: int) -> int:
    """Event time of number ``x``: 10 per number, up to OUT_OF_ORDER out of order."""
    return 10 * x - (x * 7) % OUT_OF_ORDER


def rule(v: int) -> tuple[int, int, int]:
    """Rule record ``v``: ``(valid from, class, factor)``; factor 0 rejects."""
    version, cls = divmod(v, CLASSES)
    return (version * RULE_EVERY, cls, (version + cls) % 4)


def rule_count(n: int) -> int:
    return (timestamp(n) // RULE_EVERY + 1) * CLASSES


def factor_of(rules: list[tuple[int, int, int]], cls: int, ts: int) -> int | None:
    best = None
    for valid_from, c, factor in rules:
        if c == cls and valid_from <= ts and (best is None or valid_from > best[0]):
            best = (valid_from, factor)
    return None if best is None else best[1]


class Enrich(KeyedBroadcastProcessFunction):
    """Holds each number (by timestamp, in keyed map state) until the
    watermark passes it, then applies the rule version in force."""

    def open(self, ctx):
        self.waiting = ctx.get_map_state(MapStateDescriptor("waiting"))

    def process_element(self, x, ctx):
        ts = timestamp(x)
        self.waiting.put(ts, self.waiting.get(ts, ()) + (x,))
        ctx.timer_service.register_event_time_timer(ts)

    def process_broadcast_element(self, r, ctx):
        ctx.get_broadcast_state(RULES).put((r[0], r[1]), r[2])

    def on_timer(self, ts, ctx):
        rules = ctx.get_broadcast_state(RULES)
        version = ts - ts % RULE_EVERY
        for x in self.waiting.get(ts, ()):
            factor = rules.get((version, x % CLASSES))
            if not factor:
                ctx.output(REJECTED, x)
            else:
                yield (x % KEYS, ts, x * factor)
        self.waiting.remove(ts)


class WindowSum(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield (key, context.window.end - 1, elements[0][2])


class Share(ProcessJoinFunction):
    def process_element(self, record, window, ctx):
        yield [record[0], record[1], record[2], window[2]]


def build(n: int, parallelism: int, out: str, rejected: str, storage: str,
          interval: float = 0.2, rate: float | None = None, held: bool = False) -> Pipeline:
    """``held``: the numbers never end by themselves (a
    :class:`~tests.fault.held_source.HeldSequence`): the job runs until it is
    stopped, and a job resumed from its savepoint reads the rest."""
    p = Pipeline("enrich-join", parallelism=parallelism, batch_size=50,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    numbers = p.source(HeldSequence(1, n, rate=rate) if held else SequenceSource(1, n, rate=rate),
                       uid="numbers", parallelism=1,
                       watermarks=WatermarkStrategy(timestamp, OUT_OF_ORDER, interval=0))
    rules = (p.source(SequenceSource(0, rule_count(n) - 1), uid="rules", parallelism=1,
                      watermarks=WatermarkStrategy(lambda v: rule(v)[0], 0, interval=0))
              .map(rule, uid="rule"))
    enriched = (numbers.key_by(lambda x: x % KEYS).connect(rules.broadcast(RULES))
                .process(Enrich(), uid="enrich"))
    sums = (enriched.key_by(lambda r: r[0])
            .window(TumblingEventTimeWindows.of(SIZE), timestamp_of=lambda r: r[1])
            .reduce(lambda a, b: (a[0], a[1], a[2] + b[2]), WindowSum(), uid="sums"))
    (enriched.key_by(lambda r: r[0])
     .interval_join(sums.key_by(lambda s: s[0]), timestamp_of=lambda r: r[1],
                    other_timestamp_of=lambda s: s[1])
     .between(0, SIZE - 1)
     .process(Share(), uid="share")
     .sink(FileSink(out, format="jsonl"), uid="out"))
    enriched.side_output(REJECTED).sink(FileSink(rejected, format="jsonl"), uid="rejected",
                                        parallelism=1)
    return p


def reference(n: int) -> tuple[Counter, list[int]]:
    """The committed records of "out" (as tuples) and "rejected" (sorted)."""
    rules = [rule(v) for v in range(rule_count(n))]
    enriched, rejected = [], []
    for x in range(1, n + 1):
        ts = timestamp(x)
        factor = factor_of(rules, x % CLASSES, ts)
        if not factor:
            rejected.append(x)
        else:
            enriched.append((x % KEYS, ts, x * factor))
    sums: Counter = Counter()
    for k, ts, v in enriched:
        sums[(k, ts - ts % SIZE)] += v
    out = Counter((k, ts, v, sums[(k, ts - ts % SIZE)]) for k, ts, v in enriched)
    return out, sorted(rejected)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rejected", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.out, args.rejected, args.storage, args.interval,
              args.rate)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
