"""The fault-injection job of the CDC tests: ``PostgresCdcSource`` (a
``postgresql://`` DSN) or ``MySqlCdcSource`` (``mysql://``) over one table
``(id bigint primary key, v int, name text)`` -> the change events as
``(op, id, v, name, task)`` (``task``: the number of the task that read it)
-> ``CollectSink`` (exactly once), until the writer commits the stop message
(PostgreSQL) or inserts into the stop table (MySQL).

``--kill-marker PATH``: the task that reads the first row of the second
snapshot chunk SIGKILLs itself once (when PATH does not exist yet; it
creates it): a death right after a snapshot chunk was emitted.

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import time
from typing import Any

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import CollectSink, MySqlCdcSource, PostgresCdcSource

STOP = "lockgate-test-stop"


def task_number() -> int:
    """The number of the task this process runs (its name is
    ``lgtask-<attempt>-<task>`` on both launchers; -1 elsewhere)."""
    try:
        with open("/proc/self/comm") as f:
            name = f.read().strip()
    except OSError:
        return -1
    tail = name.rpartition("-")[2]
    return int(tail) if name.startswith("lgtask-") and tail.isdigit() else -1


def as_tuple(e: Any) -> tuple:
    row = e.row or {}
    return (e.op, row.get("id"), row.get("v"), row.get("name"), task_number())


def killer(marker: str, chunk_rows: int) -> Any:
    def kill_once(batch: list) -> list:
        if marker and not os.path.exists(marker):
            if any(e.op == "read" and e.row and e.row["id"] == chunk_rows + 1 for e in batch):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return batch
    return kill_once


def throttle(rate: float) -> Any:
    def slow(batch: list) -> list:
        if rate:
            time.sleep(len(batch) / rate)
        return batch
    return slow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--slot", default="")
    ap.add_argument("--server-id", type=int, default=0)
    ap.add_argument("--stop-table", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--interval", type=float, default=0.3)
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--kill-marker", default="")
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = Pipeline("cdc", parallelism=args.parallelism,
                 checkpoint=CheckpointConfig(interval=args.interval, storage=args.storage,
                                             timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    source: MySqlCdcSource | PostgresCdcSource
    if args.dsn.startswith("mysql://"):
        source = MySqlCdcSource(args.dsn, [args.table], server_id=args.server_id,
                                chunk_rows=args.chunk, stop_table=args.stop_table)
    else:
        source = PostgresCdcSource(args.dsn, [args.table], slot=args.slot, chunk_rows=args.chunk,
                                   stop_message=STOP)
    (p.source(source, uid="cdc")
       .map_batch(killer(args.kill_marker, args.chunk), uid="kill")
       .map_batch(throttle(args.rate), uid="throttle")
       .map(as_tuple, uid="tuples")
       .sink(CollectSink(args.out), uid="out"))
    result = p.run(fault_injection=json.loads(args.faults), launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
