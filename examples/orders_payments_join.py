"""Joins: orders with their payments, in event time.

Orders (``{"order", "customer", "ts", "total"}``) and payments
(``{"order", "ts", "amount"}``) come as JSONL files, each up to 5 s out of
order. Two joins of the same streams:

* an **interval join**: every payment made within 10 minutes after its
  order -> OUT_DIR/paid (``{"order", "customer", "total", "amount",
  "delay_ms"}``). Each side waits in keyed state only as long as a match
  can still come (until the watermark passes it by the interval), then goes;
* a **window join**: every order with every payment of the same order in
  the same tumbling hour of event time -> OUT_DIR/hourly (``{"order",
  "hour", "amount"}``).

    python examples/orders_payments_join.py ORDERS_DIR PAYMENTS_DIR OUT_DIR
    lockgate run examples/orders_payments_join.py ORDERS_DIR PAYMENTS_DIR OUT_DIR
"""

import os
import sys

from lockgate import (
    CheckpointConfig,
    Pipeline,
    ProcessJoinFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, FileSource

MINUTE = 60_000


class Paid(ProcessJoinFunction):
    def process_element(self, order, payment, ctx):
        yield {"order": order["order"], "customer": order["customer"],
               "total": order["total"], "amount": payment["amount"],
               "delay_ms": ctx.right_timestamp - ctx.left_timestamp}


def build(orders_dir: str, payments_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("orders-payments", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))

    def events(folder: str, uid: str):
        return p.source(FileSource(folder, format="jsonl"), uid=uid,
                        watermarks=WatermarkStrategy(lambda r: r["ts"],
                                                     max_out_of_orderness=5_000, interval=0))

    orders, payments = events(orders_dir, "orders"), events(payments_dir, "payments")
    (orders.key_by(lambda o: o["order"])
     .interval_join(payments.key_by(lambda pay: pay["order"]))
     .between(0, 10 * MINUTE)
     .process(Paid(), uid="paid")
     .sink(FileSink(os.path.join(out_dir, "paid"), format="jsonl"), uid="paid-out"))
    (orders.join(payments)
     .where(lambda o: o["order"]).equal_to(lambda pay: pay["order"])
     .window(TumblingEventTimeWindows.of(60 * MINUTE))
     .apply(lambda o, pay: {"order": o["order"], "hour": o["ts"] // (60 * MINUTE),
                            "amount": pay["amount"]}, uid="hourly")
     .sink(FileSink(os.path.join(out_dir, "hourly"), format="jsonl"), uid="hourly-out"))
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} ORDERS_DIR PAYMENTS_DIR OUT_DIR")
    return build(*sys.argv[1:])


if __name__ == "__main__":
    main().run()
