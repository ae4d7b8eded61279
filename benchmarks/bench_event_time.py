"""What event time costs: watermarks and event-time timers.

    python benchmarks/bench_event_time.py [--n 2000000] [--parallelism 2] [--keys 1000]
                                          [--window 10000] [--launcher local|spark]

The same keyed job three times, N numbers -> key_by(x % keys) -> a
KeyedProcessFunction -> JSONL FileSink, checkpoint every second:

- ``no event time``: the function counts per key and window in map state
  and emits nothing (the baseline: the state updates alone);
- ``timers, watermark every 0.2 s``: the same counts, and each window is
  emitted by an event-time timer once the watermark passes it (timestamps are
  the numbers themselves, in order per source task) — the default strategy;
- ``timers, watermark every batch``: the same with ``interval=0``, which shows
  why watermarks are periodic: each one sends the buffered records before it.

Prints records/s end to end and the number of windows emitted (the two timer
runs emit the same windows; only when differs).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from lockgate import (
    CheckpointConfig,
    KeyedProcessFunction,
    MapStateDescriptor,
    Pipeline,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, SequenceSource


class Windows(KeyedProcessFunction):
    def __init__(self, window: int, timers: bool) -> None:
        self.window = window
        self.timers = timers

    def open(self, ctx):
        self.counts = ctx.get_map_state(MapStateDescriptor("counts"))

    def process_element(self, x, ctx):
        end = (x // self.window + 1) * self.window
        self.counts.put(end, self.counts.get(end, 0) + 1)
        if self.timers:
            ctx.timer_service.register_event_time_timer(end - 1)

    def on_timer(self, ts, ctx):
        end = ts + 1
        n = self.counts.get(end)
        self.counts.remove(end)
        return [(ctx.current_key, end, n)]


def run(n: int, parallelism: int, keys: int, window: int, mode: str, launcher: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-et-"))
    try:
        p = Pipeline("bench-event-time", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp / "chk")))
        strategy = None
        if mode != "none":
            strategy = WatermarkStrategy(lambda x: x, interval=0.2 if mode == "periodic" else 0)
        (p.source(SequenceSource(1, n), uid="numbers", watermarks=strategy)
           .key_by(lambda x: x % keys)
           .process(Windows(window, timers=mode != "none"), uid="windows")
           .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
        t0 = time.perf_counter()
        result = p.run(launcher=launcher)
        wall = time.perf_counter() - t0
        return {"wall": wall, "records_per_s": n / wall, "windows": result.records_out}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--window", type=int, default=10_000)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    for label, mode in (("no event time", "none"),
                        ("timers, watermark every 0.2 s", "periodic"),
                        ("timers, watermark every batch", "batch")):
        r = run(args.n, args.parallelism, args.keys, args.window, mode, args.launcher)
        print(f"{label:30s} {args.launcher} p={args.parallelism}: {args.n:,} records in "
              f"{r['wall']:.2f} s = {r['records_per_s']:,.0f} records/s; "
              f"{r['windows']:,} windows emitted", flush=True)


if __name__ == "__main__":
    main()
