"""Per-user totals of orders read from Parquet as Arrow record batches,
exactly once, into Parquet: no order ever becomes a Python object.

    python examples/arrow_sums.py [N]
    lockgate run examples/arrow_sums.py [N]

The first run writes N orders (``order`` = 1..N, ``user`` = order % 100,
``amount`` = order / 100) into ``in/`` as Parquet. The job keeps the orders
of at least 1.00, sums them per user with Arrow, and writes one row per user
and input batch to ``out/`` (the user's totals so far: an upsert stream; a
user's row with the largest ``orders`` is its current total). Kill a task
while it runs (``pkill -9 -f lgtask``): the committed output is the same.
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, FileSource

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000

if not os.path.isdir("in"):
    os.makedirs("in")
    order = np.arange(1, n + 1, dtype=np.int64)
    for part in range(4):
        rows = order[part::4]
        pq.write_table(pa.table({"order": rows, "user": rows % 100, "amount": rows / 100}),
                       f"in/orders-{part}.parquet")

pipeline = Pipeline("arrow-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source_arrow(FileSource("in/", format="parquet"), uid="orders")
   .filter_arrow(lambda b: pc.greater_equal(b["amount"], 1.0), uid="at-least-1")  # a mask
   .key_by_column("user")
   .aggregate_arrow(orders=("order", "count"), total=("amount", "sum"),
                    largest=("amount", "max"), mean=("amount", "mean"), uid="per-user")
   .sink(FileSink("out/", format="parquet"), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    current = (pq.read_table("out/").group_by("user")
               .aggregate([("orders", "max"), ("total", "max")]).sort_by("user"))
    print(f"{result.records_in} orders in, {len(current)} users, user 7: "
          f"{current.column('orders_max')[7].as_py()} orders, "
          f"total {current.column('total_max')[7].as_py():.2f}; "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
