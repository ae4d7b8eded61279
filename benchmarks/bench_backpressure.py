"""Checkpoints under backpressure: aligned vs unaligned vs aligned-timeout.

    python benchmarks/bench_backpressure.py [--n 1200000] [--parallelism 2]
                                            [--interval 1.0] [--launcher local]

W1 (the sums pipeline of bench_sums.py: numbers -> key_by(x % keys) ->
reduce(sum) -> JSONL FileSink) with the sink slowed to half the source's
rate: the source task's rate is measured first without checkpoints (an
unslowed run), then every sink task sleeps ``len(batch) / (rate / 2 / p)``
per batch, so batches queue up in every channel. For each checkpointing mode
it prints the checkpoint durations (p50, p99, max), the alignment time (the
longest any task took from a checkpoint's first barrier to its last), and
the in-flight data stored per checkpoint (unaligned ones).
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


def run(n: int, parallelism: int, keys: int, interval: float | None, launcher: str,
        sink_rate: float | None, **checkpointing: object) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bp-"))
    try:
        p = Pipeline("bench-backpressure", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk"),
                                                 timeout=120.0, **checkpointing))  # type: ignore[arg-type]
        sums = (p.source(SequenceSource(1, n), uid="numbers")
                 .key_by(lambda x: x % keys)
                 .reduce(lambda a, b: a + b, uid="sums"))
        if sink_rate:
            def slow(batch: list) -> list:
                time.sleep(len(batch) / sink_rate)
                return batch
            sums = sums.map_batch(slow, uid="slow")
        sums.sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out")
        t0 = time.perf_counter()
        result = p.run(launcher=launcher)
        wall = time.perf_counter() - t0
        done = [c for c in result.completed_checkpoints if c.duration is not None
                and "final" not in c.kind]
        return {"wall": wall, "rate": n / wall, "durations": [c.duration for c in done],
                "alignments": [c.alignment or 0.0 for c in done],
                "sizes": [c.in_flight for c in done], "restarts": result.restarts}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_200_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=0.2, help="aligned_timeout (s)")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    free = run(args.n // 2, args.parallelism, args.keys, None, args.launcher, None)
    sink_rate = free["rate"] / 2 / args.parallelism
    print(f"unslowed: {free['rate']:,.0f} records/s; sink slowed to {sink_rate:,.0f} "
          f"records/s per task (half the source's rate)", flush=True)
    print("| mode | checkpoints | duration p50 | p99 | max | alignment p50 | max | "
          "in flight per checkpoint (median) | records/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    modes: list[tuple[str, dict]] = [
        ("aligned", {}),
        ("unaligned", {"unaligned": True}),
        (f"aligned, timeout {args.timeout:g} s", {"aligned_timeout": args.timeout}),
    ]
    for label, config in modes:
        r = run(args.n, args.parallelism, args.keys, args.interval, args.launcher, sink_rate,
                **config)
        d, a, s = r["durations"], r["alignments"], r["sizes"]
        if not d:
            print(f"| {label} | 0 | - | - | - | - | - | - | {r['rate']:,.0f} |", flush=True)
            continue
        print(f"| {label} | {len(d)} | {statistics.median(d):.2f} s | {pct(d, 0.99):.2f} s | "
              f"{max(d):.2f} s | {statistics.median(a):.2f} s | {max(a):.2f} s | "
              f"{statistics.median(s) / 1024:,.0f} KiB | {r['rate']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
