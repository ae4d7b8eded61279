"""Orders into Apache Iceberg tables, exactly once: appended as they come, and
the per-user totals merged (upserted) into a second table. Arrow record
batches go into the tables with no row conversion.

    pip install 'lockgate[iceberg]'
    python examples/iceberg_orders.py [N]
    lockgate run examples/iceberg_orders.py [N]

The first run writes N orders (``order`` = 1..N, ``user`` = order % 100,
``amount`` = order / 100) into ``in/`` as Parquet. The job appends every
order to the table ``shop.orders`` and merges each user's running totals into
``shop.totals`` (one row per user), in a SQL catalog on SQLite
(``lake/catalog.db``) with its warehouse in ``lake/warehouse``. Each
completed checkpoint is one table commit per table whose snapshot summary
names the job, the sink and the checkpoint id; kill a task while it runs
(``pkill -9 -f lgtask``): the tables are the same.
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSource, IcebergSink

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000

if not os.path.isdir("in"):
    os.makedirs("in")
    order = np.arange(1, n + 1, dtype=np.int64)
    for part in range(4):
        rows = order[part::4]
        pq.write_table(pa.table({"order": rows, "user": rows % 100, "amount": rows / 100}),
                       f"in/orders-{part}.parquet")

lake = os.path.abspath("lake")
os.makedirs(lake, exist_ok=True)
catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
           "warehouse": f"file://{lake}/warehouse"}

pipeline = Pipeline("iceberg-orders", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
orders = pipeline.source_arrow(FileSource("in/", format="parquet"), uid="orders")
orders.sink(IcebergSink("shop.orders", catalog), uid="orders-table")
(orders.key_by_column("user")
   .aggregate_arrow(orders=("order", "count"), total=("amount", "sum"), uid="per-user")
   .sink(IcebergSink("shop.totals", catalog, mode="merge", key="user"), uid="totals-table"))

if __name__ == "__main__":
    from pyiceberg.catalog import load_catalog

    result = pipeline.run()
    tables = load_catalog("lockgate", **catalog)
    appended = tables.load_table("shop.orders").scan().to_arrow()
    totals = tables.load_table("shop.totals").scan().to_arrow().sort_by("user")
    print(f"{result.records_in} orders in, {appended.num_rows} rows in shop.orders, "
          f"{totals.num_rows} users in shop.totals, user 7: "
          f"{totals.column('orders')[7].as_py()} orders; "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
