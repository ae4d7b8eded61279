"""The reference for every Kafka benchmark: workload W3 as a bare
confluent-kafka loop, with no engine around it.

Each of ``--workers`` processes is assigned its share of the input topic's
partitions, consumes up to 10,000 records at a time, keeps a running sum per
``x % keys`` in a dict and produces one ``[key, sum]`` JSON record per input
to the output topic. With ``--transactions`` (exactly-once), every
``--interval`` seconds it sends the consumed offsets to its transaction and
commits it (Kafka's consume-transform-produce loop); without, a plain
producer. The sums live only in memory: nothing is durable, so a crash
loses them (this is the speed of the client, not a fault-tolerant job).
The producer lingers ``--linger`` milliseconds (librdkafka's default, 5,
unless given).

    python -m benchmarks.kafka.bare_loop --bootstrap host:port --input T --output U \
        [--workers 2] [--keys 1000] [--interval 1.0] [--transactions] [--linger 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def _worker(index: int, args: argparse.Namespace, partitions: list[int],
            ends: dict[int, int]) -> None:
    group = f"bare-loop-{args.run}"
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    config = {"bootstrap.servers": args.bootstrap, "linger.ms": args.linger}
    if args.transactions:
        config["transactional.id"] = f"{group}-{index}"
    producer = Producer(config)
    if args.transactions:
        producer.init_transactions()
        producer.begin_transaction()
    consumer.assign([TopicPartition(args.input, p, 0) for p in partitions])
    left = {p for p in partitions if ends[p] > 0}
    position = dict.fromkeys(partitions, 0)
    sums: dict[int, int] = {}
    keys = args.keys
    produce = producer.produce
    output = args.output
    next_commit = time.monotonic() + args.interval

    def commit() -> None:
        if args.transactions:
            offsets = [TopicPartition(args.input, p, o) for p, o in position.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            producer.commit_transaction()
            producer.begin_transaction()
        else:
            producer.flush()

    while left:
        for msg in consumer.consume(10_000, 0.1):
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(msg.error())
                continue
            partition, offset = msg.partition(), msg.offset()
            if offset >= ends[partition]:
                continue
            x = int(msg.value())
            k = x % keys
            total = sums.get(k, 0) + x
            sums[k] = total
            while True:
                try:
                    produce(output, json.dumps([k, total]).encode(), str(k).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            position[partition] = offset + 1
            if offset + 1 >= ends[partition]:
                left.discard(partition)
        producer.poll(0)
        if time.monotonic() >= next_commit:
            commit()
            next_commit = time.monotonic() + args.interval
    commit()
    if args.transactions:
        producer.abort_transaction()  # the empty one begun after the last commit
    producer.flush()
    consumer.close()


def run(args: argparse.Namespace) -> float:
    """Run the loop to the input's end; return the wall time in seconds."""
    args.run = uuid.uuid4().hex[:8]
    probe = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"bare-{args.run}",
                      "isolation.level": "read_committed"})
    meta = probe.list_topics(args.input, timeout=30).topics[args.input]
    ends = {p: probe.get_watermark_offsets(TopicPartition(args.input, p), timeout=30)[1]
            for p in meta.partitions}
    probe.close()
    shares = [[p for p in sorted(ends) if p % args.workers == i] for i in range(args.workers)]
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(i, args, shares[i], ends))
               for i in range(args.workers)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"a bare-loop worker exited with {w.exitcode}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--transactions", action="store_true")
    ap.add_argument("--linger", type=int, default=5,
                    help="the producer's linger.ms (default 5, librdkafka's own)")
    args = ap.parse_args()
    wall = run(args)
    print(json.dumps({"wall": wall}))


if __name__ == "__main__":
    main()
