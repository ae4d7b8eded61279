"""Stream enrichment with broadcast rules: payments checked against the
spending limit of their category that was in force when they happened.

Payments (``{"id", "account", "category", "ts", "amount"}``) and limit
changes (``{"ts", "category", "limit"}``, a small stream) come as JSONL
files, each in event time. The limits are *broadcast*: every task of the
check keeps all of them in broadcast state, and its checkpoints keep them
too (exactly-once, rescalable). Each payment waits in keyed state until the
watermark (the smaller of both streams') passes its time, so every limit
change up to then has arrived, and is checked against the latest of them:
the output does not depend on how the two streams interleave.

Every payment goes to OUT_DIR/checked with its limit; payments over it also
to the side output OUT_DIR/alerts; payments of a category without a limit
yet to OUT_DIR/unchecked.

    python examples/enrich_with_rules.py PAYMENTS_DIR LIMITS_DIR OUT_DIR
    lockgate run examples/enrich_with_rules.py PAYMENTS_DIR LIMITS_DIR OUT_DIR
"""

import os
import sys

from lockgate import (
    CheckpointConfig,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    OutputTag,
    Pipeline,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, FileSource

LIMITS = MapStateDescriptor("limits")
"""Broadcast state: category -> [[valid from, limit], ...] in time order."""
ALERTS = OutputTag("alerts")
UNCHECKED = OutputTag("unchecked")


class CheckLimits(KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.waiting = ctx.get_map_state(MapStateDescriptor("waiting"))  # ts -> payments

    def process_broadcast_element(self, change, ctx):
        limits = ctx.get_broadcast_state(LIMITS)
        history = limits.get(change["category"], [])
        history.append([change["ts"], change["limit"]])
        limits.put(change["category"], sorted(history))

    def process_element(self, payment, ctx):
        ts = payment["ts"]
        self.waiting.put(ts, self.waiting.get(ts, []) + [payment])
        ctx.timer_service.register_event_time_timer(ts)  # fires when the watermark passes ts

    def on_timer(self, ts, ctx):
        limits = ctx.get_broadcast_state(LIMITS)
        for payment in self.waiting.get(ts, []):
            history = [limit for since, limit in limits.get(payment["category"], [])
                       if since <= ts]
            if not history:
                ctx.output(UNCHECKED, payment)
                continue
            checked = dict(payment, limit=history[-1])
            if payment["amount"] > checked["limit"]:
                ctx.output(ALERTS, checked)
            yield checked
        self.waiting.remove(ts)


def build(payments_dir: str, limits_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline("enrich-with-rules", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
    payments = p.source(FileSource(payments_dir, format="jsonl"), uid="payments",
                        watermarks=WatermarkStrategy(lambda r: r["ts"],
                                                     max_out_of_orderness=5_000, interval=0))
    limits = p.source(FileSource(limits_dir, format="jsonl"), uid="limits", parallelism=1,
                      watermarks=WatermarkStrategy(lambda r: r["ts"], 0, interval=0))
    checked = (payments.key_by(lambda r: r["account"])
               .connect(limits.broadcast(LIMITS))
               .process(CheckLimits(), uid="check"))
    checked.sink(FileSink(os.path.join(out_dir, "checked"), format="jsonl"), uid="checked-out")
    checked.side_output(ALERTS).sink(FileSink(os.path.join(out_dir, "alerts"), format="jsonl"),
                                     uid="alerts-out")
    checked.side_output(UNCHECKED).sink(
        FileSink(os.path.join(out_dir, "unchecked"), format="jsonl"), uid="unchecked-out")
    return p


def main() -> Pipeline:
    """The pipeline of the command line's folders (``lockgate run`` calls this)."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} PAYMENTS_DIR LIMITS_DIR OUT_DIR")
    return build(*sys.argv[1:])


if __name__ == "__main__":
    main().run()
