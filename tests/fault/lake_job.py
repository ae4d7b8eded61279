"""The lakehouse fault job: numbers into a Delta table, appended or merged.

Run as the driver process of a fault test::

    python tests/fault/lake_job.py --n 20000 --table T --storage CHK --mode append

``append``: the rows ``{"id": x, "k": x % keys}`` for x in 1..n.
``merge``: the running sum and count per key ``x % keys``, upserted by key.
``--partitioned``: every row has ``band`` = its ``k % 3`` too, and the table
is partitioned by ``band``.
Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import DeltaSink, IcebergSink, SequenceSource


def iceberg_catalog(table: str) -> dict[str, str]:
    """The SQL catalog (SQLite) and local warehouse of the job's table folder."""
    return {"type": "sql", "uri": f"sqlite:///{table}/catalog.db",
            "warehouse": f"file://{table}/warehouse"}


def lake_sink(args: argparse.Namespace, **kw: object) -> object:
    if getattr(args, "sink", "delta") == "iceberg":
        import os
        os.makedirs(args.table, exist_ok=True)
        return IcebergSink("lake.t", iceberg_catalog(args.table), **kw)
    return DeltaSink(args.table, **kw)


def build(args: argparse.Namespace) -> Pipeline:
    p = Pipeline("lake", parallelism=args.parallelism,
                 checkpoint=CheckpointConfig(interval=args.interval, storage=args.storage,
                                             timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    numbers = p.source(SequenceSource(1, args.n, rate=args.rate), uid="numbers")
    keys = args.keys
    bands = getattr(args, "partitioned", False)
    parts: dict[str, object] = {"partition_by": ["band"]} if bands else {}

    def banded(row: dict) -> dict:
        return dict(row, band=row["k"] % 3) if bands else row

    if args.mode == "append":
        rows = numbers.map(lambda x: banded({"id": x, "k": x % keys}), uid="rows")
        rows.sink(lake_sink(args, **parts), uid="lake")
    else:
        sums = (numbers.map(lambda x: (x % keys, x, 1), uid="pairs")
                .key_by(lambda t: t[0])
                .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums"))
        rows = sums.map(lambda t: banded({"k": t[0], "total": t[1], "n": t[2]}), uid="rows")
        rows.sink(lake_sink(args, mode="merge", key="k", **parts), uid="lake")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=7)
    ap.add_argument("--table", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--mode", default="append", choices=["append", "merge"])
    ap.add_argument("--sink", default="delta", choices=["delta", "iceberg"])
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--partitioned", action="store_true")
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--from-checkpoint")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = build(args).run(fault_injection=json.loads(args.faults),
                             from_checkpoint=args.from_checkpoint, launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
