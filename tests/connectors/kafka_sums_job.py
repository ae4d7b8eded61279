"""The Kafka fault-injection job: running sums per key, Kafka to Kafka.

A bounded ``KafkaSource`` reads the numbers of ``--input`` (values ``"x"``,
read as ints: ``value_format="int"``), a keyed reduce keeps a running sum
per ``x % keys``, and a ``KafkaSink`` writes ``[key, sum]`` as JSON to
``--output``. Run as the driver of a fault
test (``tests/fault/checks.drive``); prints the JobResult as one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors.kafka import KafkaSink, KafkaSource


def build(bootstrap: str, source_topic: str, output: str, *, parallelism: int, keys: int,
          storage: str, interval: float, delivery: str = "exactly_once",
          rate: float | None = None, batch_size: int | None = None) -> Pipeline:
    extra = {} if batch_size is None else {"batch_size": batch_size}
    p = Pipeline("kafka-sums", parallelism=parallelism, **extra,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    per_task = rate / parallelism if rate else None

    def throttle(batch: list) -> list:
        if per_task:
            time.sleep(len(batch) / per_task)
        return batch

    (p.source(KafkaSource(bootstrap, source_topic, bounded=True, value_format="int"),
              uid="numbers")
       .map_batch(throttle, uid="throttle")
       .map(lambda x: (x % keys, x), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(KafkaSink(bootstrap, output, delivery=delivery,
                       serializer=lambda kv: (str(kv[0]), json.dumps(kv))), uid="out"))
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--delivery", default="exactly_once")
    ap.add_argument("--rate", type=float)
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.bootstrap, args.input, args.output, parallelism=args.parallelism,
              keys=args.keys, storage=args.storage, interval=args.interval,
              delivery=args.delivery, rate=args.rate)
    result = p.run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
