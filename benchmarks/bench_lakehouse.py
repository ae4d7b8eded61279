"""Rows/s into Delta Lake and Iceberg tables: Lockgate's exactly-once sinks
vs a plain write of the same Arrow batches, in alternating runs.

    python benchmarks/bench_lakehouse.py [--n 20000000] [--merge-n 2000000]
                                         [--repeat 3] [--parallelism 2]
                                         [--interval 1.0] [--kinds delta iceberg]
                                         [--modes append merge] [--record]

The input is N rows ``(order, user, amount) = (x, x % 1000, x / 100)`` as
Parquet files of 65,536-row batches. Each run writes a fresh table:

- ``plain``: this process reads the Parquet files and writes the same Arrow
  batches in one call (``write_deltalake`` / pyiceberg ``append``): the
  ceiling (no engine, no checkpoints, one commit);
- ``append``: a Lockgate job ``source_arrow(FileSource) -> DeltaSink /
  IcebergSink`` (Arrow batches all the way: no row conversion), one table
  commit per completed checkpoint;
- ``merge``: the same job upserting by ``order`` into an empty table (every
  row an insert), on the first ``--merge-n`` rows.

Each round runs the plain write and the jobs of a format one after the
other, the plain write first in even rounds and last in odd ones (the
machine may be shared: alternating spreads a change of load over both).
An unmeasured
job runs first (the driver's fork server starts with its first job). Per
run: the whole run's rows/s (wall time from the call to its return: a
job's start-up, final checkpoint and commit included), the *steady* rows/s
(rows committed after the first table commit over the time from the first
commit to the last, read from the table's own log: start-up left out; a
plain write has one commit, its steady rate is its whole rate), the CPU
seconds of every process of the run (driver, fork server, tasks; the plain
write's threads), the median synchronous part of the job's checkpoints (the
task's snapshot: how long the sink's staging holds up the stream) and the
load average. The summary gives medians, and the median of each job's rate
over the plain write's of the same round. Local launcher. ``--record`` appends
one line per run to benchmarks/results/lakehouse.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.nexmark.measure import JobUsage
from benchmarks.record import record
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


def plain(kind: str, src: Path, tmp: Path, name: str) -> None:
    table = pq.read_table(str(src))
    if kind == "delta":
        from deltalake import write_deltalake
        write_deltalake(str(tmp / name), table)
    else:
        from pyiceberg.catalog import load_catalog
        cat = load_catalog("lockgate", **catalog(tmp))
        cat.create_namespace_if_not_exists("bench")
        cat.create_table(f"bench.{name}", schema=table.schema).append(table)


def job(kind: str, mode: str, src: Path, tmp: Path, name: str, n: int, parallelism: int,
        interval: float) -> list[float]:
    """Run the job; the synchronous part of each completed checkpoint (s)."""
    kw: dict[str, Any] = {"mode": mode, "key": "order"} if mode == "merge" else {}
    sink = (DeltaSink(str(tmp / name), **kw) if kind == "delta"
            else IcebergSink(f"bench.{name}", catalog(tmp), **kw))
    p = Pipeline(f"bench-{kind}-{mode}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")))
    p.source_arrow(FileSource(str(src), format="parquet"), uid="orders").sink(sink, uid="lake")
    result = p.run(launcher="local", progress=False)
    assert result.records_in == n, result
    return [c.sync_duration for c in result.completed_checkpoints
            if c.sync_duration is not None]


def commits(kind: str, tmp: Path, name: str) -> list[tuple[float, int]]:
    """Each table commit that added rows: (wall clock in s, rows it added)."""
    out = []
    if kind == "delta":
        for f in sorted((tmp / name / "_delta_log").glob("*.json")):
            actions = [json.loads(line) for line in f.read_text().splitlines() if line]
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            metrics = info.get("operationMetrics") or {}
            if info.get("operation") == "MERGE":
                rows = sum(int(metrics.get(k, 0)) for k in (
                    "num_target_rows_inserted", "num_target_rows_updated",
                    "num_target_rows_deleted"))
            else:
                rows = sum(json.loads(a["add"]["stats"]).get("numRecords", 0)
                           for a in actions if "add" in a and a["add"].get("stats"))
            if rows:
                out.append((info.get("timestamp", 0) / 1000, rows))
        return out
    from pyiceberg.catalog import load_catalog
    table = load_catalog("lockgate", **catalog(tmp)).load_table(f"bench.{name}")
    by_commit: dict[str, list[float]] = {}
    for snap in table.metadata.snapshots:
        summary = snap.summary.additional_properties if snap.summary else {}
        key = summary.get("lockgate.commit", str(snap.snapshot_id))
        entry = by_commit.setdefault(key, [0.0, 0])
        entry[0] = max(entry[0], snap.timestamp_ms / 1000)
        entry[1] += int(summary.get("added-records", 0))
    return sorted((t, int(r)) for t, r in by_commit.values() if r)


def count(kind: str, tmp: Path, name: str) -> int:
    if kind == "delta":
        from deltalake import DeltaTable
        return int(DeltaTable(str(tmp / name)).to_pyarrow_table().num_rows)
    from pyiceberg.catalog import load_catalog
    return int(load_catalog("lockgate", **catalog(tmp)).load_table(f"bench.{name}")
               .scan().to_arrow().num_rows)


def run_one(kind: str, mode: str, src: Path, tmp: Path, n: int,
            args: argparse.Namespace, serial: int) -> dict[str, Any]:
    name = f"{mode}{serial}"
    load = os.getloadavg()[0]
    usage = JobUsage()
    usage.start()
    started = time.time()
    syncs: list[float] = []
    if mode == "plain":
        plain(kind, src, tmp, name)
    else:
        syncs = job(kind, mode, src, tmp, name, n, args.parallelism, args.interval)
    ended = time.time()
    cpu = usage.finish(settle=2.0)["cpu_s"]
    assert count(kind, tmp, name) == n, (kind, mode)
    made = commits(kind, tmp, name)
    steady = None
    if mode == "plain":
        steady = n / (ended - started)
    elif len(made) >= 3 and made[-1][0] > made[0][0]:
        steady = sum(r for _, r in made[1:]) / (made[-1][0] - made[0][0])
    shutil.rmtree(tmp / name, ignore_errors=True)
    shutil.rmtree(tmp / "chk", ignore_errors=True)
    shutil.rmtree(tmp / "warehouse", ignore_errors=True)
    (tmp / "catalog.db").unlink(missing_ok=True)
    return {"kind": kind, "mode": mode, "rows": n, "seconds": round(ended - started, 3),
            "rows_per_s": round(n / (ended - started)),
            "steady_rows_per_s": None if steady is None else round(steady),
            "commits": len(made), "cpu_s": round(cpu, 2),
            "checkpoint_sync_s": (round(statistics.median(syncs), 3) if syncs else None),
            "rows_per_cpu_s": round(n / cpu) if cpu else None,
            "load": [round(load, 1), round(os.getloadavg()[0], 1)]}


def label(kind: str, mode: str) -> str:
    if mode == "plain":
        return "plain write_deltalake" if kind == "delta" else "plain pyiceberg append"
    return f"{'DeltaSink' if kind == 'delta' else 'IcebergSink'} {mode}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--merge-n", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--kinds", nargs="+", default=["delta", "iceberg"])
    ap.add_argument("--modes", nargs="+", default=["append", "merge"])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    runs: list[dict[str, Any]] = []
    try:
        make_input(tmp / "in", args.n)
        if "merge" in args.modes:
            make_input(tmp / "in-merge", args.merge_n)
        # unmeasured: the driver's fork server starts once, with the first job
        make_input(tmp / "in-warm", 65_536)
        job("delta", "append", tmp / "in-warm", tmp, "warm", 65_536, args.parallelism,
            args.interval)
        shutil.rmtree(tmp / "chk", ignore_errors=True)
        serial = 0
        for r in range(args.repeat):
            for kind in args.kinds:
                order = ["plain", *args.modes]
                for mode in (order if r % 2 == 0 else order[::-1]):
                    serial += 1
                    merge = mode == "merge"
                    run = run_one(kind, mode, tmp / ("in-merge" if merge else "in"), tmp,
                                  args.merge_n if merge else args.n, args, serial)
                    run["round"] = r
                    runs.append(run)
                    print(f"round {r} {label(kind, mode):24s} {run['rows_per_s']:>11,} rows/s "
                          f"steady {run['steady_rows_per_s'] or 0:>11,} "
                          f"({run['commits']} commits) cpu {run['cpu_s']:6.1f} s "
                          f"sync {run['checkpoint_sync_s'] or 0:5.2f} s "
                          f"load {run['load']}", flush=True)
                    if args.record:
                        record("lakehouse", [{"parallelism": args.parallelism,
                                              "interval": args.interval,
                                              "run": label(kind, mode), **run}])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nmedians of {args.repeat} rounds, parallelism {args.parallelism}, checkpoint "
          f"every {args.interval} s; % of the plain write's whole-run rate in the same round")
    print(f"{'run':24s} {'whole rows/s':>13s} {'steady rows/s':>14s} {'rows/CPU s':>11s} "
          f"{'whole %':>8s} {'steady %':>9s} {'sync s':>7s}  load")
    for kind in args.kinds:
        plain_of = {x["round"]: x["rows_per_s"] for x in runs
                    if x["kind"] == kind and x["mode"] == "plain"}
        for mode in ["plain", *args.modes]:
            mine = [x for x in runs if x["kind"] == kind and x["mode"] == mode]
            whole = statistics.median(x["rows_per_s"] for x in mine)
            st = [x["steady_rows_per_s"] for x in mine if x["steady_rows_per_s"]]
            of_plain = [100 * x["rows_per_s"] / plain_of[x["round"]] for x in mine]
            steady_of = [100 * x["steady_rows_per_s"] / plain_of[x["round"]] for x in mine
                         if x["steady_rows_per_s"]]
            syncs = [x["checkpoint_sync_s"] for x in mine if x["checkpoint_sync_s"] is not None]
            per_cpu = statistics.median(x["rows_per_cpu_s"] or 0 for x in mine)
            loads = [v for x in mine for v in x["load"]]
            print(f"{label(kind, mode):24s} {whole:>13,.0f} "
                  f"{statistics.median(st) if st else 0:>14,.0f} {per_cpu:>11,.0f} "
                  f"{statistics.median(of_plain):>7.0f}% "
                  f"{statistics.median(steady_of) if steady_of else 0:>8.0f}% "
                  f"{statistics.median(syncs) if syncs else 0:>7.2f}  {min(loads)}-{max(loads)}")


if __name__ == "__main__":
    main()
