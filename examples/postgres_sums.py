"""Running count and sum per remainder mod 100 into PostgreSQL, exactly once
(two-phase commit).

    python examples/postgres_sums.py [N]
    lockgate run examples/postgres_sums.py [N]

Needs ``pip install 'lockgate[postgres]'`` and a PostgreSQL server that can
prepare transactions (``max_prepared_transactions`` > 0 in postgresql.conf;
the job refuses to start otherwise, saying so): ``POSTGRES_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``. It creates the table
``POSTGRES_TABLE`` (default ``lockgate_sums``) if missing and appends one row
``(remainder, count, sum)`` per number: each task writes its rows in one
transaction per checkpoint, prepared at the checkpoint and committed when the
checkpoint completes, so a reader sees every checkpoint's rows at once and
never a row that a failure takes back. Kill a task while it runs
(``pkill -9 -f lgtask``): the table still ends with exactly N rows, and
``SELECT * FROM pg_prepared_xacts`` shows nothing left behind.
"""

import os
import sys

import psycopg

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import PostgresSink, SequenceSource

DSN = os.environ.get("POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TABLE = os.environ.get("POSTGRES_TABLE", "lockgate_sums")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000

with psycopg.connect(DSN, autocommit=True) as conn:
    conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                 "(remainder int NOT NULL, count bigint NOT NULL, sum bigint NOT NULL)")

pipeline = Pipeline("postgres-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(SequenceSource(1, n), uid="numbers")
   .map(lambda x: (x % 100, 1, x), uid="triples")
   .key_by(lambda t: t[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), uid="sums")
   .sink(PostgresSink(DSN, TABLE, ["remainder", "count", "sum"]), uid="out"))

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} rows committed to {TABLE}, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
