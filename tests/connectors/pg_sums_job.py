"""The fault-injection job of the PostgreSQL and Redis tests: numbers ->
running sums per key -> a PostgreSQL or Redis sink.

Sources: ``sequence`` (``SequenceSource(1, n)``, key ``x % keys``) or
``redis`` (bounded ``RedisStreamSource`` over ``--streams``, whose stream
``i`` holds the numbers ``x % len(streams) == i``; key ``x % len(streams)``,
so each key's numbers come in one stream's order and every running value is
a function of the input prefix: deterministic under replay).

Sinks:

- ``pg2pc``: ``PostgresSink`` into ``--table (k bigint, s bigint)``: one row per
  running sum (exactly-once by two-phase commit);
- ``upsert``: the running ``(k, count, sum)`` upserted by ``(k, count)`` into
  ``PostgresUpsertSink(--table (k, c, s), key (k, c))`` when ``--dsn`` is given and
  into ``RedisUpsertSink`` (``<prefix><k>:<count>`` -> sum, and the hash
  ``<prefix>final:<k>`` -> ``{count, sum}``) when ``--redis`` is given; both
  idempotent, declared exactly-once (deterministic keyed updates).

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from typing import Any

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import (
    PostgresSink,
    PostgresUpsertSink,
    RedisStreamSource,
    RedisUpsertSink,
    SequenceSource,
)


def throttle(rate: float) -> Any:
    """A batch function that lets ``rate`` records per second through per
    task, so that kills land while the job runs."""
    def slow(batch: list) -> list:
        if rate:
            time.sleep(len(batch) / rate)
        return batch
    return slow


def build(args: argparse.Namespace) -> Pipeline:
    p = Pipeline("pg-sums", parallelism=args.parallelism,
                 checkpoint=CheckpointConfig(interval=args.interval, storage=args.storage,
                                             timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    if args.source == "sequence":
        keys = args.keys
        numbers = p.source(SequenceSource(1, args.n), uid="numbers")
    else:
        streams = args.streams.split(",")
        keys = len(streams)
        numbers = (p.source(RedisStreamSource(args.redis, streams, bounded=True), uid="numbers")
                    .map(lambda e: int(e.fields["x"]), uid="ints"))
    numbers = numbers.map_batch(throttle(args.rate), uid="throttle")
    if args.sink == "pg2pc":
        (numbers.map(lambda x: (x % keys, x), uid="pairs")
           .key_by(lambda kv: kv[0])
           .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
           .sink(PostgresSink(args.dsn, args.table, ["k", "s"]), uid=args.uid))
        return p
    sums = (numbers.map(lambda x: (x % keys, 1, x), uid="triples")
              .key_by(lambda t: t[0])
              .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums"))
    if args.dsn:
        sums.sink(PostgresUpsertSink(args.dsn, args.table, ["k", "c"], ["k", "c", "s"],
                                     batch_rows=500, exactly_once=True), uid=args.uid)
    if args.redis_out:
        prefix = args.prefix
        sums.sink(RedisUpsertSink(args.redis, key=lambda t: f"{t[0]}:{t[1]}",
                                  value=lambda t: t[2], prefix=prefix, exactly_once=True),
                  uid=args.uid + "-redis")
        sums.sink(RedisUpsertSink(args.redis, kind="hash", key=lambda t: t[0],
                                  value=lambda t: {"count": t[1], "sum": t[2]},
                                  prefix=prefix + "final:", exactly_once=True),
                  uid=args.uid + "-redis-final")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=["sequence", "redis"], default="sequence")
    ap.add_argument("--sink", choices=["pg2pc", "upsert"], default="pg2pc")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--streams", default="")
    ap.add_argument("--dsn", default="")
    ap.add_argument("--table", default="")
    ap.add_argument("--redis", default="")
    ap.add_argument("--redis-out", action="store_true")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--uid", default="out")
    ap.add_argument("--storage", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float, default=0.0, help="records/s per source task")
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = build(args).run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
