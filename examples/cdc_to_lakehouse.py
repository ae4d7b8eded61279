"""A PostgreSQL table mirrored into a Delta Lake table and an Apache Iceberg
table, exactly once, while it changes: change data capture into the lakehouse.

    pip install 'lockgate[cdc,delta,iceberg]'
    python examples/cdc_to_lakehouse.py [N]
    lockgate run examples/cdc_to_lakehouse.py [N]

Needs a PostgreSQL server with ``wal_level=logical`` (``POSTGRES_CDC_DSN``,
default ``postgresql://postgres@127.0.0.1:5432/test``; the job refuses to
start otherwise, saying so). It (re)creates the table ``customers`` with N
rows; while the job runs, a writer inserts customers, updates them (each
update adds 1 to ``version``, so a change applied twice or lost would show),
moves some to another region and deletes some, then commits the message that
makes this (bounded) source stop.

One job reads the table's snapshot and then its changes (``PostgresCdcSource``)
and merges them by ``id`` into two tables, both partitioned by ``region``:

- ``lake/customers``: a Delta table (``DeltaSink(mode="merge")``);
- ``crm.customers`` in an Iceberg SQL catalog (``lake/catalog.db``, warehouse
  ``lake/warehouse``; ``IcebergSink(mode="merge")``).

Each completed checkpoint is one commit per table, recorded in the table
itself (Delta's application transaction, Iceberg's snapshot summary), and the
slot advances only then. At the end both tables equal the PostgreSQL table
row for row. Kill a task while it runs (``pkill -9 -f lgtask``): the result is
the same. Read the tables with DuckDB (``delta_scan``, ``iceberg_scan``),
Polars (``read_delta``, ``scan_iceberg``), delta-rs, pyiceberg, or Spark with
its Delta Lake or Iceberg package.
"""

import os
import random
import sys
import threading

import psycopg
import pyarrow as pa

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import DeltaSink, IcebergSink, PostgresCdcSource

DSN = os.environ.get("POSTGRES_CDC_DSN", "postgresql://postgres@127.0.0.1:5432/test")
STOP = "lakehouse-example-stop"
REGIONS = ["eu", "us", "apac"]
n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000

with psycopg.connect(DSN, autocommit=True) as conn:
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 "WHERE slot_name = 'lakehouse_example'")
    conn.execute("DROP PUBLICATION IF EXISTS lakehouse_example")
    conn.execute("DROP TABLE IF EXISTS customers")
    conn.execute("CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, "
                 "region text NOT NULL, balance bigint NOT NULL, version int NOT NULL)")
    conn.execute("INSERT INTO customers SELECT i, 'customer ' || i, "
                 "(ARRAY['eu', 'us', 'apac'])[i %% 3 + 1], 0, 0 FROM generate_series(1, %s) i",
                 (n,))

source = PostgresCdcSource(DSN, ["customers"], slot="lakehouse_example", stop_message=STOP)


def writer(changes: int) -> None:
    """Inserts, updates (``version + 1``), region moves and deletes in small
    transactions; then the stop message."""
    rng = random.Random(1)
    next_id = n + 1
    with psycopg.connect(DSN, autocommit=True) as conn:
        for _ in range(changes // 2):
            with conn.transaction():
                for _ in range(2):
                    r, who = rng.random(), rng.randint(1, next_id - 1)
                    if r < 0.2:
                        conn.execute("INSERT INTO customers VALUES (%s, %s, %s, 0, 0)",
                                     (next_id, f"customer {next_id}", rng.choice(REGIONS)))
                        next_id += 1
                    elif r < 0.8:
                        conn.execute("UPDATE customers SET balance = balance + %s, "
                                     "version = version + 1 WHERE id = %s",
                                     (rng.randint(-50, 100), who))
                    elif r < 0.9:
                        conn.execute("UPDATE customers SET region = %s, version = version + 1 "
                                     "WHERE id = %s", (rng.choice(REGIONS), who))
                    else:
                        conn.execute("DELETE FROM customers WHERE id = %s", (who,))
        conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (STOP,))


def as_row(e) -> dict:
    """A change event as a row of the lake tables; a delete carries the key
    and ``deleted=True``."""
    return dict(e.row, deleted=e.op == "delete")


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("region", pa.string()),
                    ("balance", pa.int64()), ("version", pa.int32()), ("deleted", pa.bool_())])
lake = os.path.abspath("lake")
os.makedirs(lake, exist_ok=True)
CATALOG = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
           "warehouse": f"file://{lake}/warehouse"}
merge = {"mode": "merge", "key": "id", "delete_column": "deleted", "schema": SCHEMA,
         "partition_by": ["region"]}

pipeline = Pipeline("cdc-to-lakehouse", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
# The snapshot's rows (read by any task) are all in checkpoints before the
# first change of the stream, whose changes come from one task in commit order;
# nothing re-partitions them before the sinks, so the last change of a
# customer is the one each table keeps.
rows = (pipeline.source(source, uid="customers-cdc")
        .filter(lambda e: e.op != "truncate", uid="no-truncates")
        .map(as_row, uid="rows"))
rows.sink(DeltaSink(f"{lake}/customers", **merge), uid="delta-customers")
rows.sink(IcebergSink("crm.customers", CATALOG, **merge), uid="iceberg-customers")

# the slot first, so that it holds every change of the writer; the job finds it
source.validate()
source.prepare("", "customers-cdc")
threading.Thread(target=writer, args=(n // 2,), daemon=True).start()

if __name__ == "__main__":
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    result = pipeline.run()
    columns = ["id", "name", "region", "balance", "version"]
    with psycopg.connect(DSN) as conn:
        source_rows = set(conn.execute(f"SELECT {', '.join(columns)} FROM customers"))

    def as_set(table: pa.Table) -> set:
        return {tuple(r[c] for c in columns) for r in table.to_pylist()}

    delta = as_set(DeltaTable(f"{lake}/customers").to_pyarrow_table())
    iceberg = as_set(load_catalog("lockgate", **CATALOG).load_table("crm.customers")
                     .scan().to_arrow())
    print(f"{len(source_rows)} customers in PostgreSQL; Delta lake/customers: {len(delta)} "
          f"rows, equal: {delta == source_rows}; Iceberg crm.customers: {len(iceberg)} rows, "
          f"equal: {iceberg == source_rows}; {result.records_in} change events, "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
