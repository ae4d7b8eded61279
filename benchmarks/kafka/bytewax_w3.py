"""Workload W3 on Bytewax, with its own Kafka connectors, in 2 processes.

Bytewax's ``KafkaSource`` reads topic ``--input`` (each partition owned by
one worker, 10,000 records a poll, ``read_committed``), ``stateful_map``
keeps the running sum of each key ``x % keys`` (the stream re-keyed by
``str(key)``, so each key's records cross to the worker that owns it), and
``KafkaSink`` writes ``json.dumps([key, sum])`` keyed by ``str(key)`` to
``--output``. One worker in each of ``--processes`` processes, a cluster
started with ``bytewax.testing.cluster_main`` (what ``python -m
bytewax.testing -p 2`` does), with recovery on: an epoch every
``--interval`` seconds, each epoch's state snapshots written to the
recovery database (SQLite partitions, made with ``init_db_dir``). That is
Bytewax's strongest guarantee with Kafka: at-least-once (its Kafka sink is
not transactional; after a failure it writes the resume epoch's records
again).

The end: bounded by the source. With ``tail=False`` each partition ends at
the end of the topic that its consumer finds (``enable.partition.eof``): as
the input is written before the run, the end offsets at the start. The
dataflow ends when every partition has, after the sink flushed.

Printed: one JSON line, ``records_per_s`` = N / the wall time from the
first process's start to the last one's exit (start-up included), and the
CPU seconds of the processes. Needs the peers' interpreter
(``benchmarks/kafka/requirements-peers.txt``); run from the repository's
root:

    /work/venv-peers/bin/python -m benchmarks.kafka.bytewax_w3 --bootstrap H:P \
        --input IN --output OUT --n N [--processes 2] [--keys 1000] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.kafka._peer import end_offsets, parse, report, run_workers


def build(args: argparse.Namespace) -> Any:
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow

    keys = args.keys
    dumps = json.dumps

    def keyed(msg: Any) -> tuple[str, int]:
        x = int(msg.value)
        return str(x % keys), x

    def running_sum(total: int | None, x: int) -> tuple[int, int]:
        total = x if total is None else total + x
        return total, total

    def record(key_total: tuple[str, int]) -> Any:
        key, total = key_total
        return KafkaSinkMessage(key.encode(), dumps([int(key), total]).encode())

    flow = Dataflow("w3")
    source = KafkaSource([args.bootstrap], [args.input], tail=False, batch_size=10_000,
                         add_config={"isolation.level": "read_committed"})
    numbers = op.input("in", flow, source)
    sums = op.stateful_map("sum", op.map("key", numbers, keyed), running_sum)
    op.output("out", op.map("record", sums, record),
              KafkaSink([args.bootstrap], args.output, add_config={"linger.ms": "5"}))
    return flow


def _process(index: int, args: argparse.Namespace, addresses: list[str], db: str) -> None:
    from bytewax.recovery import RecoveryConfig
    from bytewax.testing import cluster_main

    cluster_main(build(args), addresses, index,
                 epoch_interval=timedelta(seconds=args.interval),
                 recovery_config=RecoveryConfig(Path(db)), worker_count_per_proc=1)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def main() -> None:
    args = parse(__doc__)
    from bytewax.recovery import init_db_dir

    ends = end_offsets(args.bootstrap, args.input)
    if sum(ends.values()) < args.n:
        raise SystemExit(f"{args.input} holds {sum(ends.values())} records, not --n {args.n}")
    folder = Path(tempfile.mkdtemp(prefix="bytewax-w3-"))
    try:
        init_db_dir(folder, args.processes)
        addresses = [f"127.0.0.1:{port}" for port in _free_ports(args.processes)]
        wall, cpu = run_workers(_process, [(i, args, addresses, str(folder))
                                           for i in range(args.processes)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report("bytewax", "bytewax", "at-least-once", "the source's end (tail=False)", args,
           wall, cpu)


if __name__ == "__main__":
    main()
