"""The in-place mutation job: running sums per key, computed four ways by
ordinary Python that mutates what it got from state and emits it.

Each branch writes its own folder ``OUT/<branch>`` of JSONL records
``{"k": key, "sum": running sum}`` (``[key, sum]`` for ``reduce``):

- ``value``: ``acc = state.value(); acc["sum"] += x; state.update(acc); emit acc``,
  with a mutable default ``{"sum": 0}``;
- ``list``: a list state of one dict, mutated through ``get()`` and written back;
- ``map``: a map state's dict value, mutated through ``get()`` and ``put`` back;
- ``reduce``: ``a[1] += b[1]; return a``, the fold style of PySpark.

Run as the driver process of a fault test::

    python tests/fault/mutation_job.py --n 100000 --parallelism 2 --out OUT --storage CHK

Prints the JobResult as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from lockgate import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Pipeline,
    ValueStateDescriptor,
)
from lockgate.connectors import FileSink, SequenceSource

BRANCHES = ("value", "list", "map", "reduce")


class ValueSums(KeyedProcessFunction):
    def open(self, ctx):
        self.acc = ctx.get_state(ValueStateDescriptor("acc", default={"sum": 0}))

    def process_element(self, e, ctx):
        acc = self.acc.value()
        acc["k"] = ctx.current_key
        acc["sum"] += e[1]
        self.acc.update(acc)
        return [acc]


class ListSums(KeyedProcessFunction):
    def open(self, ctx):
        self.items = ctx.get_list_state(ListStateDescriptor("items"))

    def process_element(self, e, ctx):
        items = self.items.get() or [{"k": ctx.current_key, "sum": 0}]
        items[0]["sum"] += e[1]
        self.items.update(items)
        return [items[0]]


class MapSums(KeyedProcessFunction):
    def open(self, ctx):
        self.m = ctx.get_map_state(MapStateDescriptor("m"))

    def process_element(self, e, ctx):
        acc = self.m.get("acc") or {"k": ctx.current_key, "sum": 0}
        acc["sum"] += e[1]
        self.m.put("acc", acc)
        return [acc]


def fold(a: list, b: list) -> list:
    a[1] += b[1]
    return a


def build(n: int, parallelism: int, keys: int, out: str, storage: str, interval: float,
          rate: float | None) -> Pipeline:
    p = Pipeline("mutation", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, timeout=30.0),
                 restart=FixedDelayRestart(max_attempts=100, delay_s=0.0))
    pairs = (p.source(SequenceSource(1, n, rate=rate), uid="numbers")
               .map(lambda x: [x % keys, x], uid="pairs"))
    functions = {"value": ValueSums, "list": ListSums, "map": MapSums}
    for branch in BRANCHES:
        keyed = pairs.key_by(lambda kv: kv[0])
        result = (keyed.reduce(fold, uid=branch) if branch == "reduce"
                  else keyed.process(functions[branch](), uid=branch))
        result.sink(FileSink(f"{out}/{branch}", format="jsonl"), uid=f"out-{branch}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--launcher", default="local", choices=["local", "spark"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    p = build(args.n, args.parallelism, args.keys, args.out, args.storage, args.interval,
              args.rate)
    result = p.run(launcher=args.launcher)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()
