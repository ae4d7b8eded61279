"""W1 in Arrow form: the sums of ``bench_sums.py`` over record batches from Parquet.

    python benchmarks/bench_arrow_sums.py [--n 100000000] [--parallelism 2] [--keys 1000]
                                          [--runs 3] [--row-n 20000000] [--launcher local]

Input: ``x`` = 1..N as int64 in Parquet files (written once, before the
clock starts; row groups of 1 M rows, snappy, as pyarrow writes them by
default), dealt evenly to the source tasks. Pipeline, exactly-once, a
checkpoint every second::

    source_arrow(FileSource(in, "parquet"))
      .map_arrow(k = x % keys)            # pyarrow.compute
      .key_by_column("k")                 # routed by key group, Arrow IPC frames
      .aggregate_arrow(total=("x", "sum"))  # running sum per key, keyed state
      .sink(FileSink(out, "parquet"))     # two-phase commit, batches as they are

Records/s is N over the job's whole wall time, start-up and the final
checkpoint included (as in ``bench_sums.py``). Each run checks its committed
output: every key's last sum equals the sum of its inputs. With
``--row-n``, the row W1 (``bench_sums.run``) runs between the Arrow runs
(alternating, for a machine shared with others), on its own N. With
``--launcher spark`` a 1,000-row job first starts the SparkSession.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, FileSource
from lockgate.connectors.filesource import assign_file

sys.path.insert(0, str(Path(__file__).parent))
import bench_sums


def write_input(folder: Path, n: int, parallelism: int, files_per_task: int = 4) -> None:
    """x = 1..n in ``parallelism * files_per_task`` files, named so that each
    task reads as many (the file source deals files by a hash of the name)."""
    folder.mkdir(parents=True)
    names: list[str] = []
    per_task = [0] * parallelism
    i = 0
    while len(names) < parallelism * files_per_task:
        name = f"part-{i:05d}.parquet"
        t = assign_file(name, parallelism)
        if per_task[t] < files_per_task:
            per_task[t] += 1
            names.append(name)
        i += 1
    step = -(-n // len(names))
    for j, name in enumerate(names):
        lo, hi = 1 + j * step, min(n, (j + 1) * step)
        xs = pa.array(np.arange(lo, max(hi, lo - 1) + 1, dtype=np.int64))
        pq.write_table(pa.table({"x": xs}), folder / name, row_group_size=1 << 20)


def run_arrow(input: Path, n: int, parallelism: int, keys: int, interval: float | None,
              launcher: str, batch_rows: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-arrow-"))
    try:
        p = Pipeline("bench-arrow-sums", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")))
        (p.source_arrow(FileSource(str(input), format="parquet"), uid="numbers",
                        batch_rows=batch_rows)
           .map_arrow(lambda b: b.append_column("k", pc.remainder(b["x"], keys)), uid="keys")
           .key_by_column("k")
           .aggregate_arrow(total=("x", "sum"), uid="sums")
           .sink(FileSink(str(tmp / "out"), format="parquet"), uid="out"))
        t0 = time.perf_counter()
        result = p.run(launcher=launcher)
        wall = time.perf_counter() - t0
        check(tmp / "out", n, keys)
        durations = [c.duration for c in result.completed_checkpoints if c.duration is not None]
        return {"wall": wall, "records_per_s": n / wall, "checkpoints": durations,
                "restarts": result.restarts}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check(out: Path, n: int, keys: int) -> None:
    """Every key's largest committed sum (sums only grow: x > 0) is the sum of its inputs."""
    files = [str(out / f) for f in os.listdir(out) if not f.startswith((".", "_"))]
    got = pq.read_table(files).group_by("k").aggregate([("total", "max")])
    last = dict(zip(got.column("k").to_pylist(), got.column("total_max").to_pylist(),
                    strict=True))
    for k in range(keys):
        first = k if k else keys
        count = (n - first) // keys + 1 if n >= first else 0
        want = count * (first + first + (count - 1) * keys) // 2
        assert last.get(k, 0) == want, f"key {k}: committed {last.get(k)}, expected {want}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--row-n", type=int, default=0,
                    help="also run the row W1 on this many records, alternating")
    ap.add_argument("--batch-rows", type=int, default=65_536)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="lockgate-bench-arrow-in-"))
    try:
        t0 = time.perf_counter()
        write_input(data / "in", args.n, args.parallelism)
        print(f"input: {args.n:,} rows of Parquet in {time.perf_counter() - t0:.1f} s "
              f"({sum(f.stat().st_size for f in (data / 'in').iterdir()) / 1e6:.0f} MB)",
              flush=True)
        if args.launcher == "spark":  # as bench_sums: the figures are on a warm SparkSession
            write_input(data / "warm", 1000, args.parallelism)
            run_arrow(data / "warm", 1000, args.parallelism, args.keys, args.interval, "spark",
                      args.batch_rows)
        arrow_rates, row_rates = [], []
        for i in range(args.runs):
            r = run_arrow(data / "in", args.n, args.parallelism, args.keys, args.interval,
                          args.launcher, args.batch_rows)
            arrow_rates.append(r["records_per_s"])
            cps = r["checkpoints"]
            print(f"run {i + 1} arrow {args.launcher} p={args.parallelism}: {args.n:,} records "
                  f"in {r['wall']:.2f} s = {r['records_per_s'] / 1e6:.2f} M records/s; "
                  f"{len(cps)} checkpoints, median "
                  f"{statistics.median(cps) * 1000 if cps else 0:.0f} ms; exact", flush=True)
            if args.row_n:
                w = bench_sums.run(args.row_n, args.parallelism, args.keys, args.interval,
                                   args.launcher)
                row_rates.append(w["records_per_s"])
                print(f"run {i + 1} rows  {args.launcher} p={args.parallelism}: "
                      f"{args.row_n:,} records in {w['wall']:.2f} s = "
                      f"{w['records_per_s'] / 1e6:.2f} M records/s", flush=True)
        print(f"arrow median {statistics.median(arrow_rates) / 1e6:.2f} M records/s "
              f"(runs: {', '.join(f'{r / 1e6:.2f}' for r in arrow_rates)})")
        if row_rates:
            print(f"rows  median {statistics.median(row_rates) / 1e6:.2f} M records/s "
                  f"(runs: {', '.join(f'{r / 1e6:.2f}' for r in row_rates)}); arrow/rows "
                  f"{statistics.median(arrow_rates) / statistics.median(row_rates):.1f}x")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
