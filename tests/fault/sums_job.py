"""The fault-injection job: running sums per key, written by the file sink.

Run as the driver process of a fault test::

    python tests/fault/sums_job.py --n 200000 --parallelism 2 --out OUT --storage CHK \
        --faults '[{"point": "snapshot", "attempt": 0}]'

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from lockgate import CheckpointConfig, DataStream, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource


def build(n: int, parallelism: int, keys: int, out: str, storage: str, interval: float | None,
          mode: str = "exactly_once", rate: float | None = None) -> Pipeline:
    p = Pipeline("sums", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, mode=mode,
                                             timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    running_sums(p.source(SequenceSource(1, n, rate=rate), uid="numbers"), keys, out)
    return p


def running_sums(numbers: DataStream[int], keys: int, out: str, suffix: str = "") -> None:
    """The running sum of ``numbers`` per key (``x % keys``), written as JSONL
    lines ``[key, sum]`` to the folder ``out``, by operators with the uids
    ``pairs``, ``sums`` and ``out`` (each followed by ``suffix``)."""
    (numbers.map(lambda x: (x % keys, x), uid=f"pairs{suffix}")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid=f"sums{suffix}")
       .sink(FileSink(out, format="jsonl"), uid=f"out{suffix}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--mode", default="exactly_once")
    ap.add_argument("--rate", type=float)
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--from-checkpoint")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--progress", action="store_true",
                    help="print a JSON line after every completed checkpoint")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.keys, args.out, args.storage, args.interval,
              args.mode, args.rate)
    def progress(pr) -> None:
        print(json.dumps({"progress": dataclasses.asdict(pr)}), flush=True)

    result = p.run(fault_injection=json.loads(args.faults), from_checkpoint=args.from_checkpoint,
                   on_progress=progress if args.progress else None, launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
