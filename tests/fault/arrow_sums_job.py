"""The Arrow fault-injection job: running aggregates per key over record
batches read from Parquet, and a copy of every row, both to Parquet file sinks.

    python tests/fault/arrow_sums_job.py --input IN --n 120000 --parallelism 2 \
        --out OUT --copy COPY --storage CHK [--launcher spark]

The input is written by :func:`write_input` (``x`` = 1..n over several files
of several row groups). Prints the JobResult as one JSON line on stdout.
:func:`check_output` checks what was committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fault.held_source

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, FileSource
from tests.fault.held_source import HeldArrow

FILES = 5
ROW_GROUP = 7_000


def write_input(folder: Path, n: int) -> None:
    """``x`` = 1..n as int64 over :data:`FILES` Parquet files (rows dealt
    round-robin), row groups of :data:`ROW_GROUP` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    for i in range(FILES):
        xs = list(range(1 + i, n + 1, FILES))
        pq.write_table(pa.table({"x": pa.array(xs, pa.int64())}),
                       folder / f"part-{i}.parquet", row_group_size=ROW_GROUP)


def build(input: str, parallelism: int, keys: int, out: str, copy: str, storage: str,
          interval: float, rate: float | None, batch_rows: int,
          held: int | None = None) -> Pipeline:
    """``held``: each source task reads at most that many rows, then idles
    and never ends (:class:`~tests.fault.held_source.HeldArrow`): the job runs
    until it is stopped, and a job resumed from its savepoint reads the rest."""
    import pyarrow.compute as pc

    p = Pipeline("arrow-sums", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    files = FileSource(input, format="parquet")
    source = (files if held is None
              else HeldArrow(files, most=held, batch_rows=batch_rows, rate=rate))
    keyed = (p.source_arrow(source, uid="numbers", batch_rows=batch_rows, rate=rate)
             .map_arrow(lambda b: b.append_column("k", pc.remainder(b["x"], keys)), uid="keys"))
    keyed.sink(FileSink(copy, format="parquet"), uid="copy")
    (keyed.key_by_column("k")
          .aggregate_arrow(total=("x", "sum"), n=("x", "count"), lo=("x", "min"),
                           hi=("x", "max"), avg=("x", "mean"), uid="sums")
          .sink(FileSink(out, format="parquet"), uid="out"))
    return p


_PART = re.compile(r"^part-(?P<uid>.+)-(?P<task>\d+)-(?P<attempt>\d+)-(?P<seq>\d+)\.parquet$")


def committed_rows(folder: Path) -> list[dict]:
    """The rows of the committed part files, in commit order per task
    (attempt, then sequence number); tasks one after the other."""
    import pyarrow.parquet as pq

    parts = []
    for name in os.listdir(folder):
        m = _PART.match(name)
        if m:
            parts.append((int(m["task"]), int(m["attempt"]), int(m["seq"]), name))
    rows: list[dict] = []
    for *_, name in sorted(parts):
        rows += pq.read_table(folder / name).to_pylist()
    return rows


def check_output(out: Path, copy: Path, n: int, keys: int, in_commit_order: bool = True) -> None:
    """Record by record: the committed copy holds every input row exactly
    once (with its key); for every key, the committed aggregates grow
    strictly in commit order (a checkpoint's output committed twice, or
    output of a rolled-back epoch, would step back) and the last equals the
    aggregates of all of that key's inputs. No hidden file is left. Across
    jobs (a rescale through a savepoint: part names do not order jobs),
    ``in_commit_order=False``: no count twice, and the largest is exact."""
    copied = committed_rows(copy)
    xs = sorted(r["x"] for r in copied)
    assert len(xs) == n and xs == list(range(1, n + 1)), (
        f"copy: {len(xs)} rows for {n} inputs, {len(set(xs))} distinct")
    assert all(r["k"] == r["x"] % keys for r in copied)
    per_key: dict[int, list[dict]] = defaultdict(list)
    for r in committed_rows(out):
        per_key[r["k"]].append(r)
    assert sorted(per_key) == list(range(keys)), sorted(per_key)
    for k, rows in per_key.items():
        if not in_commit_order:
            rows = sorted(rows, key=lambda r: r["n"])
        counts = [r["n"] for r in rows]
        assert all(a < b for a, b in zip(counts, counts[1:], strict=False)), (
            f"key {k}: counts in commit order step back or repeat: {counts}")
        mine = range(k if k else keys, n + 1, keys)
        last = rows[-1]
        want = {"n": len(mine), "total": sum(mine), "lo": min(mine), "hi": max(mine)}
        assert {c: last[c] for c in want} == want, f"key {k}: {last} != {want}"
        assert abs(last["avg"] - sum(mine) / len(mine)) < 1e-6
    for folder in (out, copy):
        hidden = sorted(f for f in os.listdir(folder) if f.startswith("."))
        assert hidden == [], f"in-progress or pending files were left in {folder}: {hidden}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--copy", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--batch-rows", type=int, default=1000)
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.input, args.parallelism, args.keys, args.out, args.copy, args.storage,
              args.interval, args.rate, args.batch_rows)
    result = p.run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
