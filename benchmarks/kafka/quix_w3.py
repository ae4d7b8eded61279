"""Workload W3 on Quix Streams, with its own Kafka consumer and producer, in
2 processes.

Each of ``--processes`` processes runs one ``Application`` of the same
consumer group (``processing_guarantee="exactly-once"``,
``commit_interval`` ``--interval`` seconds, ``auto_offset_reset="earliest"``,
its state in RocksDB with changelog topics: Quix's defaults). Its
StreamingDataFrame reads ``--input`` (the values JSON-decoded: ASCII
decimals are JSON integers), ``group_by`` re-keys each record by
``str(x % keys)`` (Quix's shuffle: a repartition topic it creates), a
stateful ``apply`` keeps each key's running sum and ``to_topic`` writes
``json.dumps([key, sum])`` keyed by ``str(key)`` to ``--output``.

The end: Quix's ``run(count=...)`` counts one process's outputs, and which
keys a process gets is the group's choice, so neither process knows its
share. Each process counts the records its stateful step emitted into a
slot of shared memory; a thread of each stops its ``Application``
(``Application.stop()``, a graceful stop that commits the last checkpoint,
the transaction holding the rest of the output) once the slots add up to N.
So the run ends when ``--output`` holds N committed records (the benchmark
reads them back and checks that it holds exactly N, and the sums).

Printed: one JSON line, ``records_per_s`` = N / the wall time from the
first process's start to the last one's exit (start-up included), and the
CPU seconds of the processes. Needs the peers' interpreter
(``benchmarks/kafka/requirements-peers.txt``); run from the repository's
root:

    /work/venv-peers/bin/python -m benchmarks.kafka.quix_w3 --bootstrap H:P \
        --input IN --output OUT --n N [--processes 2] [--keys 1000] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
import uuid
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from benchmarks.kafka._peer import end_offsets, parse, report, run_workers


def _process(index: int, args: argparse.Namespace, group: str, state_dir: str,
             counts: Any) -> None:
    from quixstreams import Application

    app = Application(broker_address=args.bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      commit_interval=args.interval, state_dir=state_dir,
                      loglevel="WARNING")
    source = app.topic(args.input, value_deserializer="json", key_deserializer="bytes")
    sink = app.topic(args.output, value_serializer="bytes", key_serializer="str")
    keys = args.keys
    dumps = json.dumps
    emitted = [0]

    def running_sum(x: int, state: Any) -> bytes:
        total = state.get("sum", 0) + x
        state.set("sum", total)
        emitted[0] += 1
        return dumps([x % keys, total]).encode()

    sdf = app.dataframe(source)
    sdf = sdf.group_by(lambda x: str(x % keys), name="key", key_serializer="str",
                       key_deserializer="str")
    sdf = sdf.apply(running_sum, stateful=True)
    sdf.to_topic(sink)

    def stopper() -> None:
        while True:
            counts[index] = emitted[0]
            if sum(counts[:]) >= args.n:
                app.stop()
                return
            time.sleep(0.02)

    threading.Thread(target=stopper, daemon=True).start()
    app.run()


def main() -> None:
    args = parse(__doc__)
    ends = end_offsets(args.bootstrap, args.input)
    if sum(ends.values()) != args.n:
        raise SystemExit(f"{args.input} holds {sum(ends.values())} records, not --n {args.n}")
    counts = get_context("spawn").RawArray("q", args.processes)
    group = f"quix-w3-{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="quix-w3-"))
    try:
        wall, cpu = run_workers(_process, [(i, args, group, str(folder / str(i)), counts)
                                           for i in range(args.processes)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report("quixstreams", "quixstreams", "exactly-once", "out holds N records", args,
           wall, cpu)


if __name__ == "__main__":
    main()
