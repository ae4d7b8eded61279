"""Change data capture from MariaDB / MySQL: a snapshot of a table, then
its changes from the binlog, exactly once, into JSONL files.

    python examples/mysql_cdc.py [N]
    lockgate run examples/mysql_cdc.py [N]

Needs ``pip install 'lockgate[cdc]'`` and a server with the binlog on in row
format (``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``,
``binlog_row_metadata=FULL``): ``MYSQL_CDC_DSN``, default
``mysql://root@127.0.0.1:3306``; the job refuses to start otherwise, saying
which setting is missing. It (re)creates the database ``cdc_example`` with
the table ``orders`` (N rows) and the table ``stop``, then a writer thread
updates and deletes orders while the job reads the snapshot and the binlog;
the writer ends with a row in ``stop``, which makes this (bounded) source
stop. ``out/changes`` receives every change event once. Kill a task while
it runs (``pkill -9 -f lgtask``): the output is the same.
"""

import os
import random
import sys
import threading
from urllib.parse import urlsplit

import pymysql

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, MySqlCdcSource

DSN = os.environ.get("MYSQL_CDC_DSN", "mysql://root@127.0.0.1:3306")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
url = urlsplit(DSN)


def connect() -> pymysql.Connection:
    return pymysql.connect(host=url.hostname, port=url.port or 3306, user=url.username or "root",
                           password=url.password or "", autocommit=True)


with connect() as conn, conn.cursor() as cur:
    cur.execute("DROP DATABASE IF EXISTS cdc_example")
    cur.execute("CREATE DATABASE cdc_example")
    cur.execute("CREATE TABLE cdc_example.orders (id bigint PRIMARY KEY, "
                "status varchar(10) NOT NULL, version int NOT NULL)")
    cur.execute("CREATE TABLE cdc_example.stop (at datetime)")
    cur.executemany("INSERT INTO cdc_example.orders VALUES (%s, 'new', 0)",
                    [(i,) for i in range(1, n + 1)])

source = MySqlCdcSource(DSN, ["cdc_example.orders"], server_id=5401,
                        stop_table="cdc_example.stop")


def writer(updates: int) -> None:
    """Moves random orders on (new -> paid -> shipped), deletes some, then
    inserts the stop row."""
    rng = random.Random(1)
    with connect() as conn, conn.cursor() as cur:
        for _ in range(updates):
            order = rng.randint(1, n)
            if rng.random() < 0.1:
                cur.execute("DELETE FROM cdc_example.orders WHERE id = %s", (order,))
            else:
                cur.execute("UPDATE cdc_example.orders SET version = version + 1, status = "
                            "IF(status = 'new', 'paid', 'shipped') WHERE id = %s", (order,))
        cur.execute("INSERT INTO cdc_example.stop VALUES (NOW())")


pipeline = Pipeline("mysql-cdc", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
changes = pipeline.source(source, uid="orders")
(changes.map(lambda e: {"op": e.op, "lsn": e.lsn, "commit_ms": e.commit_ms,
                        "before": e.before, "after": e.after}, uid="json")
   .sink(FileSink("out/changes", mode="overwrite"), uid="changes"))

# the binlog position first, so that the job reads every change of the writer
source.validate()
source.prepare("", "orders")
threading.Thread(target=writer, args=(n // 2,), daemon=True).start()

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} change events written to out/changes, "
          f"{result.restarts} restarts, guarantee {result.guarantee}")
