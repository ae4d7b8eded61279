"""The async I/O fault-injection job: numbers from one source task, spread
over the tasks of an ``async_map`` that asks a real TCP service
(``tests/async_service.py``, started by the test) for each number's answer,
written by a file sink: ``[x, answer(x)]`` per number.

Run as the driver process of a fault test::

    python tests/fault/async_job.py --n 12000 --parallelism 2 --service 127.0.0.1:PORT \
        --out OUT --storage CHK --launcher local [--unordered]

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource

sys.path.insert(0, str(Path(__file__).parents[2]))
from tests.async_service import ask

CAPACITY = 12


def delay_ms(x: int) -> int:
    """How long the service takes for ``x``: 0 to 12 ms, so results of a
    task complete out of input order and many are in flight at a barrier."""
    return (x * 37) % 13


def build(n: int, parallelism: int, service: str, out: str, storage: str, *,
          ordered: bool = True, interval: float = 0.2, rate: float | None = None,
          slow_ms: int | None = None) -> Pipeline:
    """``slow_ms``: every request takes that long (instead of ``delay_ms``)."""
    async def lookup(x: int) -> list[int]:
        return [x, await ask(service, x, delay_ms(x) if slow_ms is None else slow_ms)]

    p = Pipeline("async-lookups", parallelism=parallelism, batch_size=50,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    (p.source(SequenceSource(1, n, rate=rate), uid="numbers", parallelism=1)
      .rebalance()
      .async_map(lookup, capacity=CAPACITY, ordered=ordered, timeout=30.0, uid="lookup")
      .sink(FileSink(out, format="jsonl"), uid="out"))
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--service", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--unordered", action="store_true")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.service, args.out, args.storage,
              ordered=not args.unordered, interval=args.interval, rate=args.rate)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
