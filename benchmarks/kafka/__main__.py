"""Workload W3, Kafka → running sums → Kafka, side by side on one broker:
Lockgate (exactly-once, both launchers) and the bare confluent-kafka loop
(``bare_loop.py``, with and without transactions), interleaved round by
round; medians of the rounds.

    python -m benchmarks.kafka [--n 2000000] [--rounds 3] [--parallelism 2]
        [--interval 1.0] [--launchers local spark] [--bootstrap host:port] [--record]

Topic ``in`` has 4 partitions holding the integers 1..N; key ``x % 1000``;
one ``[key, sum]`` record per input to a fresh output topic; a checkpoint
(or transaction) every ``--interval`` seconds. Lockgate's output is checked
(every key's running sums exact, read with ``read_committed``). Without
``--bootstrap`` (or ``LOCKGATE_KAFKA``) the benchmark starts its own
noida-db broker. ``--record`` appends a line per system to
``benchmarks/results/kafka.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kafka import bare_loop  # noqa: E402
from benchmarks.record import record  # noqa: E402
from tests.connectors.kafka_server import noida_broker  # noqa: E402
from tests.connectors.kafka_sums_job import build  # noqa: E402
from tests.connectors.kafka_topics import new_topic, produce_numbers, read_all, sums_of  # noqa: E402
from tests.fixtures import check_running_sums  # noqa: E402


def lockgate_round(args: argparse.Namespace, bootstrap: str, source: str,
                   launcher: str) -> float:
    out = new_topic(bootstrap, f"w3-{launcher}", 4)
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-w3-"))
    try:
        p = build(bootstrap, source, out, parallelism=args.parallelism, keys=args.keys,
                  storage=str(tmp / "chk"), interval=args.interval)
        t0 = time.perf_counter()
        result = p.run(launcher=launcher, progress=False)
        wall = time.perf_counter() - t0
        assert result.status == "finished", result
        if args.check:
            check_running_sums(sums_of(read_all(bootstrap, out, timeout=300)), args.n, args.keys)
        return wall
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bare_round(args: argparse.Namespace, bootstrap: str, source: str,
               transactions: bool) -> float:
    out = new_topic(bootstrap, "w3-bare", 4)
    loop = argparse.Namespace(bootstrap=bootstrap, input=source, output=out,
                              workers=args.parallelism, keys=args.keys,
                              interval=args.interval, transactions=transactions)
    return bare_loop.run(loop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--launchers", nargs="+", default=["local", "spark"])
    ap.add_argument("--no-bare", action="store_true")
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--bootstrap", default=os.environ.get("LOCKGATE_KAFKA"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    systems = [] if args.no_bare else [("bare loop, transactions", "exactly-once"),
                                       ("bare loop", "none")]
    systems += [(f"lockgate {launcher}", "exactly-once") for launcher in args.launchers]
    walls: dict[str, list[float]] = {name: [] for name, _ in systems}
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(noida_broker())
        source = new_topic(bootstrap, "w3-in", 4)
        produce_numbers(bootstrap, source, 1, args.n, 4)
        for r in range(args.rounds):
            for name, _ in systems:
                if name.startswith("bare"):
                    wall = bare_round(args, bootstrap, source, "transactions" in name)
                else:
                    wall = lockgate_round(args, bootstrap, source, name.split()[-1])
                walls[name].append(wall)
                print(f"round {r + 1}: {name}: {args.n / wall:,.0f} records/s", flush=True)
    print(f"\nW3: N={args.n:,}, 4 partitions, p={args.parallelism}, keys={args.keys}, "
          f"interval {args.interval} s, median of {args.rounds} rounds")
    print(f"{'system':<26}{'guarantee':<14}{'records/s':>12}")
    for name, guarantee in systems:
        rate = args.n / statistics.median(walls[name])
        print(f"{name:<26}{guarantee:<14}{rate:>12,.0f}")
        if args.record:
            record("kafka", [{"workload": "W3", "records": args.n, "partitions": 4,
                              "parallelism": args.parallelism, "interval_s": args.interval,
                              "system": name, "guarantee": guarantee,
                              "records_per_s": round(rate), "rounds": args.rounds,
                              "stat": "median"}])


if __name__ == "__main__":
    main()
