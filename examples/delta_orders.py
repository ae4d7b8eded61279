"""Orders into a Delta Lake table, exactly once: appended as they come, and
the per-user totals merged (upserted) into a second table. Arrow record
batches go into the tables with no row conversion.

    pip install 'lockgate[delta]'
    python examples/delta_orders.py [N]
    lockgate run examples/delta_orders.py [N]

The first run writes N orders (``order`` = 1..N, ``user`` = order % 100,
``amount`` = order / 100) into ``in/`` as Parquet. The job appends every
order to the Delta table ``lake/orders`` and merges each user's running
totals into ``lake/totals`` (one row per user). Each completed checkpoint is
one Delta commit per table carrying the job, the sink and the checkpoint id;
kill a task while it runs (``pkill -9 -f lgtask``): the tables are the same.
Read them with anything that reads Delta (Spark, DuckDB, Polars, delta-rs).
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import DeltaSink, FileSource

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000

if not os.path.isdir("in"):
    os.makedirs("in")
    order = np.arange(1, n + 1, dtype=np.int64)
    for part in range(4):
        rows = order[part::4]
        pq.write_table(pa.table({"order": rows, "user": rows % 100, "amount": rows / 100}),
                       f"in/orders-{part}.parquet")

pipeline = Pipeline("delta-orders", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
orders = pipeline.source_arrow(FileSource("in/", format="parquet"), uid="orders")
orders.sink(DeltaSink("lake/orders"), uid="orders-table")
(orders.key_by_column("user")
   .aggregate_arrow(orders=("order", "count"), total=("amount", "sum"), uid="per-user")
   .sink(DeltaSink("lake/totals", mode="merge", key="user"), uid="totals-table"))

if __name__ == "__main__":
    from deltalake import DeltaTable

    result = pipeline.run()
    appended = DeltaTable("lake/orders").to_pyarrow_table()
    totals = DeltaTable("lake/totals").to_pyarrow_table().sort_by("user")
    print(f"{result.records_in} orders in, {appended.num_rows} rows in lake/orders, "
          f"{totals.num_rows} users in lake/totals, user 7: "
          f"{totals.column('orders')[7].as_py()} orders; "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
