"""Throughput and checkpoint durations of the core pipeline.

    python benchmarks/bench_sums.py [--n 2000000] [--parallelism 2] [--keys 1000]
                                    [--launcher local|spark|both]

Pipeline: N numbers -> key_by(x % keys) -> reduce(sum) -> JSONL FileSink,
run twice: with a checkpoint every second, and without periodic checkpoints
(a bounded job still takes its final checkpoint). Prints records/s end to end
and the checkpoint durations. With ``--launcher both`` (the default) the local
and the Spark launcher run side by side; the Spark figures are taken on a warm
SparkSession (started, and one tiny job run, before the clock starts), and the
start-up overhead of a job on it (submit to every task running, and a whole
tiny job) is printed too.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource


def warm_spark(parallelism: int) -> dict:
    """Start the SparkSession the benchmark's jobs run on and measure what a job
    costs on it besides its records: a 10-record job, end to end."""
    t0 = time.perf_counter()
    run(10, parallelism, 2, None, "spark")  # cold: starts the JVM and the Python workers
    cold = time.perf_counter() - t0
    walls = [run(10, parallelism, 2, None, "spark")["wall"] for _ in range(3)]
    return {"cold": cold, "warm_job": statistics.median(walls)}


def run(n: int, parallelism: int, keys: int, interval: float | None, launcher: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-"))
    try:
        p = Pipeline("bench-sums", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")))
        (p.source(SequenceSource(1, n), uid="numbers")
           .key_by(lambda x: x % keys)
           .reduce(lambda a, b: a + b, uid="sums")
           .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
        t0 = time.perf_counter()
        result = p.run(launcher=launcher)
        wall = time.perf_counter() - t0
        durations = [c.duration for c in result.completed_checkpoints if c.duration is not None]
        return {"wall": wall, "records_per_s": n / wall, "checkpoints": durations,
                "restarts": result.restarts}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--launcher", default="both", choices=["local", "spark", "both"])
    args = ap.parse_args()
    launchers = ["local", "spark"] if args.launcher == "both" else [args.launcher]
    if "spark" in launchers:
        w = warm_spark(args.parallelism)
        print(f"spark session: first job (cold, JVM start) {w['cold']:.1f} s; a 10-record job "
              f"on the warm session {w['warm_job']:.2f} s (start-up overhead per job)")
    rates: dict[tuple[str, str], float] = {}
    for label, interval in (("checkpoint every 1 s", 1.0), ("no periodic checkpoints", None)):
        for launcher in launchers:
            r = run(args.n, args.parallelism, args.keys, interval, launcher)
            rates[(label, launcher)] = r["records_per_s"]
            cps = r["checkpoints"]
            cp_text = (f"{len(cps)} checkpoints, median {statistics.median(cps) * 1000:.0f} ms, "
                       f"max {max(cps) * 1000:.0f} ms" if cps else "no checkpoints")
            print(f"{label:26s} {launcher:6s} p={args.parallelism}: {args.n:,} records in "
                  f"{r['wall']:.2f} s = {r['records_per_s']:,.0f} records/s; {cp_text}",
                  flush=True)
        if len(launchers) == 2:
            ratio = rates[(label, "spark")] / rates[(label, "local")]
            print(f"{label:26s} spark/local throughput: {ratio:.0%}")


if __name__ == "__main__":
    main()
