"""Rows/s into Delta Lake and Iceberg tables: Lockgate's exactly-once sinks
vs a plain write of the same Arrow batches, side by side.

    python benchmarks/bench_lakehouse.py [--n 2000000] [--parallelism 2]
                                         [--interval 1.0] [--record]

The input is N rows ``(order, user, amount) = (x, x % 1000, x / 100)`` as
Parquet files of 65,536-row batches. Each run writes a fresh table:

- ``plain write_deltalake`` / ``plain pyiceberg append``: this process reads
  the Parquet files and writes the same Arrow batches in one call (the
  ceiling: no engine, no checkpoints, one commit);
- ``DeltaSink append`` / ``IcebergSink append``: a Lockgate job
  ``source_arrow(FileSource) -> sink`` (Arrow batches all the way: no row
  conversion), one table commit per completed checkpoint;
- ``DeltaSink merge`` / ``IcebergSink merge``: the same job upserting by
  ``order`` into an empty table (every row an insert).

Rows/s is N over the wall time (a job's: start to finish, its final
checkpoint and commit included), local launcher. ``--record`` appends one
line per run to benchmarks/results/lakehouse.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import DeltaSink, FileSource, IcebergSink

ROOT = Path(__file__).resolve().parents[1]


def make_input(folder: Path, n: int) -> None:
    folder.mkdir(parents=True)
    order = np.arange(1, n + 1, dtype=np.int64)
    for part in range(4):
        rows = order[part::4]
        pq.write_table(pa.table({"order": rows, "user": rows % 1000, "amount": rows / 100}),
                       str(folder / f"part-{part}.parquet"), row_group_size=65_536)


def catalog(tmp: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
            "warehouse": f"file://{tmp}/warehouse"}


def plain(kind: str, src: Path, tmp: Path) -> float:
    started = time.perf_counter()
    table = pq.read_table(str(src))
    if kind == "delta":
        from deltalake import write_deltalake
        write_deltalake(str(tmp / "plain-delta"), table)
    else:
        from pyiceberg.catalog import load_catalog
        cat = load_catalog("bench", **catalog(tmp))
        cat.create_namespace_if_not_exists("bench")
        cat.create_table("bench.plain", schema=table.schema).append(table)
    return time.perf_counter() - started


def job(kind: str, mode: str, src: Path, tmp: Path, n: int, parallelism: int,
        interval: float) -> float:
    kw = {"mode": mode, "key": "order"} if mode == "merge" else {}
    sink = (DeltaSink(str(tmp / f"delta-{mode}"), **kw) if kind == "delta"
            else IcebergSink(f"bench.{mode}", catalog(tmp), **kw))
    p = Pipeline(f"bench-{kind}-{mode}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")))
    p.source_arrow(FileSource(str(src), format="parquet"), uid="orders").sink(sink, uid="lake")
    started = time.perf_counter()
    result = p.run(launcher="local")
    elapsed = time.perf_counter() - started
    assert result.records_in == n, result
    return elapsed


def count(kind: str, mode: str, tmp: Path) -> int:
    if kind == "delta":
        from deltalake import DeltaTable
        return int(DeltaTable(str(tmp / f"delta-{mode}")).to_pyarrow_table().num_rows)
    from pyiceberg.catalog import load_catalog
    return int(load_catalog("lockgate", **catalog(tmp)).load_table(f"bench.{mode}")
               .scan().to_arrow().num_rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    figures: dict[str, float] = {}
    try:
        src = tmp / "in"
        make_input(src, args.n)
        for kind in ("delta", "iceberg"):
            plain_name = "plain write_deltalake" if kind == "delta" else "plain pyiceberg append"
            figures[plain_name] = args.n / plain(kind, src, tmp)
            for mode in ("append", "merge"):
                name = f"{'DeltaSink' if kind == 'delta' else 'IcebergSink'} {mode}"
                elapsed = job(kind, mode, src, tmp, args.n, args.parallelism, args.interval)
                assert count(kind, mode, tmp) == args.n, name
                figures[name] = args.n / elapsed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name, rate in figures.items():
        print(f"{name:28s} {rate:>12,.0f} rows/s")
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or None
        line = {"date": datetime.date.today().isoformat(), "commit": commit,
                "machine": f"{os.cpu_count()}-core ({platform.machine()})",
                "load": round(os.getloadavg()[0], 1), "rows": args.n,
                "parallelism": args.parallelism, "interval": args.interval,
                "rows_per_s": {k: round(v) for k, v in figures.items()}}
        with open(ROOT / "benchmarks" / "results" / "lakehouse.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
