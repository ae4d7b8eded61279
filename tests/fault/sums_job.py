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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fault.rescale_plan

from lockgate import CheckpointConfig, DataStream, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from tests.fault.held_source import HeldSequence


def build(n: int, parallelism: int, keys: int, out: str, storage: str, interval: float | None,
          mode: str = "exactly_once", rate: float | None = None, unaligned: bool = False,
          aligned_timeout: float | None = None, slow_sink: float | None = None,
          batch_size: int | None = None, inline_threshold: int = 0,
          held: bool = False) -> Pipeline:
    """``held``: the source never ends its input by itself (a
    :class:`~tests.fault.held_source.HeldSequence`): the job runs until it is
    stopped, and a job resumed from its savepoint reads the rest."""
    p = Pipeline("sums", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, mode=mode,
                                             timeout=30.0, unaligned=unaligned,
                                             aligned_timeout=aligned_timeout,
                                             inline_threshold=inline_threshold),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0),
                 **({"batch_size": batch_size} if batch_size else {}))
    source = HeldSequence(1, n, rate=rate) if held else SequenceSource(1, n, rate=rate)
    running_sums(p.source(source, uid="numbers"), keys, out,
                 slow_sink=slow_sink)
    return p


def running_sums(numbers: DataStream[int], keys: int, out: str, suffix: str = "",
                 slow_sink: float | None = None) -> None:
    """The running sum of ``numbers`` per key (``x % keys``), written as JSONL
    lines ``[key, sum]`` to the folder ``out``, by operators with the uids
    ``pairs``, ``sums`` and ``out`` (each followed by ``suffix``).
    ``slow_sink``: the sink task takes at least 1/``slow_sink`` s per record
    (backpressure: batches queue up in flight)."""
    sums = (numbers.map(lambda x: (x % keys, x), uid=f"pairs{suffix}")
            .key_by(lambda kv: kv[0])
            .reduce(lambda a, b: (a[0], a[1] + b[1]), uid=f"sums{suffix}"))
    if slow_sink:
        def slow(batch: list) -> list:
            time.sleep(len(batch) / slow_sink)
            return batch
        sums = sums.map_batch(slow, uid=f"slow{suffix}")
    sums.sink(FileSink(out, format="jsonl"), uid=f"out{suffix}")


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
    ap.add_argument("--unaligned", action="store_true")
    ap.add_argument("--aligned-timeout", type=float)
    ap.add_argument("--slow-sink", type=float, help="records/s per sink task")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--inline-threshold", type=int, default=0)
    ap.add_argument("--from-checkpoint")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--plan", help="steps while the job runs, comma-separated: kill, N "
                    "(rescale to N), bad:N (a rescale to N that must be refused)")
    ap.add_argument("--master", help="the Spark launcher's master")
    ap.add_argument("--progress", action="store_true",
                    help="print a JSON line after every completed checkpoint")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.keys, args.out, args.storage, args.interval,
              args.mode, args.rate, args.unaligned, args.aligned_timeout, args.slow_sink,
              args.batch_size, args.inline_threshold)
    def progress(pr) -> None:
        print(json.dumps({"progress": dataclasses.asdict(pr)}), flush=True)

    if args.plan:
        run_plan(p, args)
        return
    result = p.run(fault_injection=json.loads(args.faults), from_checkpoint=args.from_checkpoint,
                   on_progress=progress if args.progress else None, launcher=args.launcher,
                   start_timeout=args.start_timeout)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


def run_plan(p: Pipeline, args: argparse.Namespace) -> None:
    """Run the job while :class:`~tests.fault.rescale_plan.Plan` takes its steps;
    the JobResult printed has the steps' answers as ``plan``."""
    from tests.fault.rescale_plan import Plan

    plan: Plan | None = None

    def progress(pr) -> None:
        if plan is not None:
            plan.on_progress(pr)

    client = p.start(launcher=args.launcher, on_progress=progress,
                     fault_injection=json.loads(args.faults),
                     **({"master": args.master} if args.master else {}))
    plan = Plan(client, args.plan.split(","))
    plan.start()
    plan.join()
    result = dataclasses.asdict(client.result(timeout=600))
    result["plan"], result["plan_error"] = plan.log, plan.error
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
