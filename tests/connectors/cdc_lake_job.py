"""The flagship's fault-injection job: ``PostgresCdcSource`` over the table
``(id bigint primary key, name text, region text, balance bigint, version
int)`` into three tables at once, until the writer commits the stop message:

- ``<lake>/customers``: Delta, merged by ``id`` (deletes delete), partitioned
  by ``region``;
- ``crm.customers`` (SQL catalog ``<lake>/catalog.db``, warehouse
  ``<lake>/warehouse``): Iceberg, the same;
- ``<lake>/changes``: Delta, every change event appended as
  ``(id, version, op, lsn)``: the record that shows a change applied twice.

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.connectors.*

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import DeltaSink, IcebergSink, PostgresCdcSource
from tests.connectors.cdc_job import STOP, throttle

ROW = pa.schema([("id", pa.int64()), ("name", pa.string()), ("region", pa.string()),
                 ("balance", pa.int64()), ("version", pa.int32()), ("deleted", pa.bool_())])
CHANGE = pa.schema([("id", pa.int64()), ("version", pa.int32()), ("op", pa.string()),
                    ("lsn", pa.int64())])


def catalog(lake: str) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
            "warehouse": f"file://{lake}/warehouse"}


def as_row(e: Any) -> dict:
    return dict(e.row, deleted=e.op == "delete")


def as_change(e: Any) -> dict:
    return {"id": e.row["id"], "version": e.row.get("version"), "op": e.op, "lsn": e.lsn}


def build(args: argparse.Namespace) -> Pipeline:
    p = Pipeline("cdc-lake", parallelism=args.parallelism,
                 checkpoint=CheckpointConfig(interval=args.interval, storage=args.storage,
                                             timeout=60.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    merge = {"mode": "merge", "key": "id", "delete_column": "deleted", "schema": ROW,
             "partition_by": ["region"]}
    changes = (p.source(PostgresCdcSource(args.dsn, [args.table], slot=args.slot,
                                          chunk_rows=args.chunk, stop_message=STOP),
                        uid="cdc")
               .filter(lambda e: e.op != "truncate", uid="no-truncates")
               .map_batch(throttle(args.rate), uid="throttle"))
    rows = changes.map(as_row, uid="rows")
    rows.sink(DeltaSink(f"{args.lake}/customers", **merge), uid="delta")
    rows.sink(IcebergSink("crm.customers", catalog(args.lake), **merge), uid="iceberg")
    changes.map(as_change, uid="changes").sink(
        DeltaSink(f"{args.lake}/changes", schema=CHANGE), uid="log")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--slot", required=True)
    ap.add_argument("--lake", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--interval", type=float, default=0.3)
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = build(args).run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
