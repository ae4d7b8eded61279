"""Throughput and checkpoint durations of the core pipeline.

    python benchmarks/bench_sums.py [--n 2000000] [--parallelism 2] [--keys 1000]

Pipeline: N numbers -> key_by(x % keys) -> reduce(sum) -> JSONL FileSink,
run twice: with a checkpoint every second, and without periodic checkpoints
(a bounded job still takes its final checkpoint). Prints records/s end to end
and the checkpoint durations.
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
    ap.add_argument("--launcher", default="local")
    args = ap.parse_args()
    for label, interval in (("checkpoint every 1 s", 1.0), ("no periodic checkpoints", None)):
        r = run(args.n, args.parallelism, args.keys, interval, args.launcher)
        cps = r["checkpoints"]
        cp_text = (f"{len(cps)} checkpoints, median {statistics.median(cps) * 1000:.0f} ms, "
                   f"max {max(cps) * 1000:.0f} ms" if cps else "no checkpoints")
        print(f"{label:26s} {args.launcher:6s} p={args.parallelism}: {args.n:,} records in "
              f"{r['wall']:.2f} s = {r['records_per_s']:,.0f} records/s; {cp_text}")


if __name__ == "__main__":
    main()
