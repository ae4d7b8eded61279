"""The keyed task of W3 in one process, without a broker: the reduce
(``ReduceOperator``, heap state) and the exactly-once ``KafkaSink``'s writer
(the job's serializer, the transaction's write-ahead records, the sends) into
a producer that keeps nothing, a checkpoint every ``--batches`` batches (the
pre-commit, the handle's state packed as the snapshot writes it, the commit).

    python benchmarks/bench_keyed_sink.py [--records 1024] [--batches 100]

Prints nanoseconds per record of each part and of the whole (the best of 31
repeats: the least disturbed by other work on the machine), beside the
serializer alone (``json.dumps``: the bare loop pays it too), so that what
Lockgate adds around the user's functions shows.
"""

from __future__ import annotations

import argparse
import json
import timeit
from typing import Any

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.kafka import KafkaSink
from lockgate.connectors.kafka.sink import KafkaTransactionalWriter
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.operators import ReduceOperator
from lockgate.state.serde import StateSerializer


class NullProducer:
    """A transactional producer that sends nothing (its calls cost nothing)."""

    def produce(self, topic: str, value: Any = None, key: Any = None) -> None:
        pass

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float = 0.0) -> int:
        return 0

    def init_transactions(self, timeout: float = 0.0) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, *args: Any) -> None:
        pass

    def commit_transaction(self, timeout: float = 0.0) -> None:
        pass


class NullGroup:
    def consumer_group_metadata(self) -> None:
        return None


class Writer(KafkaTransactionalWriter):
    def _producer(self, tid: str) -> Any:
        return NullProducer()

    def _group(self, tid: str) -> Any:
        return NullGroup()


def serializer(kv: tuple[int, int]) -> tuple[str, str]:
    return str(kv[0]), json.dumps(kv)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1024, help="records per batch")
    ap.add_argument("--batches", type=int, default=100, help="batches per checkpoint")
    args = ap.parse_args()
    batches = [[(x % 1000, x) for x in range(b * args.records, (b + 1) * args.records)]
               for b in range(args.batches)]
    n = args.records * args.batches
    info = TaskInfo(task_index=0, parallelism=1, max_parallelism=128, attempt=0,
                    job_id="bench", uid="sums")
    op = ReduceOperator(OperatorSpec(uid="sums", kind="reduce",
                                     fn=lambda a, b: (a[0], a[1] + b[1]),
                                     key_selector=lambda kv: kv[0]), info)
    op.open(StateSerializer())
    sink = KafkaSink("localhost:9092", "out", serializer=serializer)
    writer = Writer(sink, TaskInfo(task_index=0, parallelism=1, max_parallelism=128,
                                   attempt=0, job_id="bench", uid="out"))
    writer.restore([])
    packer = StateSerializer()
    outputs = [op.process(b) for b in batches]
    checkpoint = iter(range(1, 1 << 30))

    def reduce() -> None:
        for b in batches:
            op.process(b)

    def serialize() -> None:
        for out in outputs:
            list(map(serializer, out))

    def write() -> None:
        for out in outputs:
            writer.write_batch(out)
        cid = next(checkpoint)
        packer.dumps(writer.snapshot_state(cid))
        writer.notify_checkpoint_complete(cid)

    def whole() -> None:
        for b in batches:
            writer.write_batch(op.process(b))
        cid = next(checkpoint)
        packer.dumps(writer.snapshot_state(cid))
        writer.notify_checkpoint_complete(cid)

    for name, run in [("reduce", reduce), ("serializer alone (json.dumps)", serialize),
                      ("sink: write, checkpoint, commit", write), ("reduce + sink", whole)]:
        run()
        best = min(timeit.repeat(run, number=1, repeat=31))
        print(f"{name:<34}{best / n * 1e9:7.1f} ns per record", flush=True)


if __name__ == "__main__":
    main()
