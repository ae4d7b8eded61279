"""The autoscaler's job: numbers due at a rate that steps up and down
(:class:`~tests.fault.stepped_source.SteppedSource`), through an operator
that takes ``--cost`` seconds per record (a sleep: its true rate does not
depend on the machine's load), into running sums per key written by the
file sink. The autoscaler sizes each vertex; the source, the slow operator
and the sums are separate vertices (a rebalance, a key_by).

Run as the driver of a test::

    python tests/fault/autoscale_job.py --out OUT --storage CHK --launcher local

Prints one JSON line: the JobResult, the autoscaler's state and decisions as
``GET /jobs/<id>/autoscaler`` served them, and when the rate stepped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fault.*

from lockgate import AutoscalerConfig, CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.api.client import JobClient
from tests.fault.stepped_source import SteppedSource
from tests.fault.sums_job import running_sums


def build(args: argparse.Namespace) -> tuple[Pipeline, SteppedSource]:
    phases = json.loads(args.phases)
    n = int(sum(seconds * rate for seconds, rate in phases))
    source = SteppedSource(1, n, phases)
    p = Pipeline("autoscaled", parallelism=1, max_parallelism=16,
                 checkpoint=CheckpointConfig(interval=0.5, storage=args.storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=20, delay_s=0.0),
                 batch_size=64,
                 autoscale=AutoscalerConfig(
                     min=1, max=args.max, target_utilization=0.7, utilization_boundary=0.2,
                     stabilization=args.stabilization, window=args.window,
                     cooldown=args.cooldown, catch_up=60.0))
    cost = args.cost

    def slow(batch: list[int]) -> list[int]:
        time.sleep(len(batch) * cost)
        return batch

    numbers = p.source(source, uid="numbers").rebalance().map_batch(slow, uid="slow")
    running_sums(numbers, args.keys, args.out)
    return p, source


def rest_autoscaler(client: JobClient) -> dict | None:
    """``GET /jobs/<id>/autoscaler`` from the job's REST server (None: not
    served, or the job just ended)."""
    served = client.master.dashboard
    if served is None:
        return None
    url, token = served
    request = urllib.request.Request(f"{url[:-len('/ui')]}/jobs/{client.job_id}/autoscaler",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    ap.add_argument("--master")
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--cost", type=float, default=0.004, help="seconds per record of `slow`")
    ap.add_argument("--phases", default="[[8, 100], [25, 400], [15, 100]]",
                    help="[[seconds, records/s], ...]: the last rate lasts to the end")
    ap.add_argument("--max", type=int, default=4)
    ap.add_argument("--stabilization", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--cooldown", type=float, default=5.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("lockgate.autoscaler").setLevel(logging.INFO)
    p, source = build(args)
    client = p.start(launcher=args.launcher, progress=False,
                     **({"master": args.master} if args.master else {}))
    seen: dict = {}
    timeline = []  # what it said, about every half second (a failing test shows it)
    while True:
        try:
            done = client.result(timeout=0.5)
            break
        except TimeoutError:
            seen = rest_autoscaler(client) or seen  # served while the job runs
            timeline.append([round(time.time() - (source.t0 or 0), 1), seen.get("state"),
                             [e["reason"] for e in seen.get("vertices", [])
                              if e["uid"] == "slow"]])
    result = dataclasses.asdict(done)
    result["autoscaler"] = client.master.autoscaler()
    result["autoscaler_seen"] = seen
    result["n"] = source.end
    result["steps"] = source.boundaries()
    result["timeline"] = timeline
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
