"""Change data capture from PostgreSQL: a snapshot of a table, then its
changes, exactly once, into JSONL files.

    python examples/postgres_cdc.py [N]
    lockgate run examples/postgres_cdc.py [N]

Needs ``pip install 'lockgate[cdc]'`` and a PostgreSQL server with
``wal_level=logical`` (``POSTGRES_CDC_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``; the job refuses to start
otherwise, saying so). It (re)creates the table ``cdc_orders`` with N rows,
then a writer thread updates and deletes rows while the job reads the
snapshot and the change stream; the writer ends with the message that makes
this (bounded) source stop. ``out/changes`` receives every change event
once; ``out/status`` the running count of rows per status. Kill a task
while it runs (``pkill -9 -f lgtask``): the output is the same.
"""

import os
import random
import sys
import threading

import psycopg

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, PostgresCdcSource

DSN = os.environ.get("POSTGRES_CDC_DSN", "postgresql://postgres@127.0.0.1:5432/test")
STOP = "cdc-example-stop"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000

with psycopg.connect(DSN, autocommit=True) as conn:
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 "WHERE slot_name = 'cdc_example'")
    conn.execute("DROP PUBLICATION IF EXISTS cdc_example")
    conn.execute("DROP TABLE IF EXISTS cdc_orders")
    conn.execute("CREATE TABLE cdc_orders (id bigint PRIMARY KEY, status text NOT NULL, "
                 "version int NOT NULL)")
    conn.execute("INSERT INTO cdc_orders SELECT i, 'new', 0 FROM generate_series(1, %s) i", (n,))

source = PostgresCdcSource(DSN, ["cdc_orders"], slot="cdc_example", stop_message=STOP)


def writer(updates: int) -> None:
    """Moves random orders on (new -> paid -> shipped), deletes some, then
    commits the stop message."""
    rng = random.Random(1)
    with psycopg.connect(DSN, autocommit=True) as conn:
        for _ in range(updates):
            order = rng.randint(1, n)
            if rng.random() < 0.1:
                conn.execute("DELETE FROM cdc_orders WHERE id = %s", (order,))
            else:
                conn.execute("UPDATE cdc_orders SET version = version + 1, status = CASE status "
                             "WHEN 'new' THEN 'paid' ELSE 'shipped' END WHERE id = %s", (order,))
        conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (STOP,))


pipeline = Pipeline("postgres-cdc", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
changes = pipeline.source(source, uid="orders")
(changes.map(lambda e: {"op": e.op, "lsn": e.lsn, "commit_ms": e.commit_ms,
                        "before": e.before, "after": e.after}, uid="json")
   .sink(FileSink("out/changes", mode="overwrite"), uid="changes"))

# the slot first, so that it holds every change of the writer; the job finds it
source.validate()
source.prepare("", "orders")
threading.Thread(target=writer, args=(n // 2,), daemon=True).start()

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} change events written to out/changes, "
          f"{result.restarts} restarts, guarantee {result.guarantee}")
