"""The fault-injection job of the NATS tests: JetStream -> running sums per
key -> JetStreamSink (exactly-once by ``Nats-Msg-Id``), or with ``--dsn``
-> PostgresSink (two-phase commit) into ``--table (k bigint, s bigint)``.

Run as the driver process of a fault test::

    python tests/connectors/nats_sums_job.py --url nats://127.0.0.1:4222 \
        --stream IN --subjects IN.0,IN.1 --out OUT.sums --storage CHK \
        --faults '[{"point": "acked", "attempt": 0}]'

The source is bounded (the input stream's last sequence at the start);
records are ``int`` payloads, the output ``[key, sum]`` JSON messages. Prints
the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import JetStreamSink, JetStreamSource, PostgresSink


def slowly(x: int, pause: float) -> int:
    """Throttle the source tasks, so that kills land while the job runs."""
    if pause:
        time.sleep(pause)
    return x


def build(args: argparse.Namespace) -> Pipeline:
    p = Pipeline("nats-sums", parallelism=args.parallelism,
                 checkpoint=CheckpointConfig(interval=args.interval, storage=args.storage,
                                             timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    keys, pause = args.keys, args.pause
    (p.source(JetStreamSource(args.stream, subjects=args.subjects.split(","), url=args.url,
                              bounded=True, deserializer=int), uid="numbers")
       .map(lambda x: (x % keys, slowly(x, pause)), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(JetStreamSink(args.out, url=args.url) if not args.dsn
             else PostgresSink(args.dsn, args.table, ["k", "s"]), uid="out"))
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--subjects", required=True)
    ap.add_argument("--out", help="the output subject")
    ap.add_argument("--dsn", help="write to PostgreSQL (PostgresSink) instead")
    ap.add_argument("--table", help="with --dsn: the table (k bigint, s bigint)")
    ap.add_argument("--storage", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds per record")
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = build(args).run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
