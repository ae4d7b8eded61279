"""Topics for the Kafka tests: unique names, filled with numbers, read back
with ``read_committed``."""

from __future__ import annotations

import json
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 30.0


def new_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    """Create a topic with a unique name; return the name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result came
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=TIMEOUT)[name].result(
        TIMEOUT)
    return name


def delete_topic(bootstrap: str, name: str) -> None:
    """Delete a topic (and its data: a benchmark's broker may keep it in memory)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([name], operation_timeout=TIMEOUT)[name].result(TIMEOUT)


def produce_numbers(bootstrap: str, topic: str, first: int, last: int,
                    partitions: int) -> None:
    """The values ``"first"`` .. ``"last"``, round-robin over the partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for x in range(first, last + 1):
        while True:
            try:
                producer.produce(topic, str(x).encode(), partition=x % partitions)
                break
            except BufferError:  # the local queue is full: wait for deliveries
                producer.poll(0.05)
        if x % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(TIMEOUT) == 0, "records not delivered"


def end_offsets(bootstrap: str, topic: str, committed: bool = True) -> dict[int, int]:
    """Per partition, the last stable offset (``committed``) or the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lockgate-tests-ends",
                         "isolation.level": "read_committed" if committed
                         else "read_uncommitted"})
    try:
        meta = consumer.list_topics(topic, timeout=TIMEOUT).topics[topic]
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)[1]
                for p in meta.partitions}
    finally:
        consumer.close()


def read_all(bootstrap: str, topic: str, *, committed: bool = True,
             timeout: float = TIMEOUT) -> list[Any]:
    """Every record of ``topic`` up to its current end, as (partition,
    offset, key, value) tuples, with ``read_committed`` (or uncommitted)."""
    ends = end_offsets(bootstrap, topic, committed)
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "lockgate-tests-reader",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": "read_committed" if committed else "read_uncommitted"})
    out: list[Any] = []
    try:
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in left])
        import time
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise AssertionError(msg.error())
                    continue
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            for tp in consumer.position([TopicPartition(topic, p) for p in left]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
        assert not left, f"partitions {left} of {topic} not read to their end in {timeout} s"
    finally:
        consumer.close()
    return out


def sums_of(records: list[Any]) -> list[list[int]]:
    """The ``[key, sum]`` values of the sums job's output records."""
    return [json.loads(value) for _, _, _, value in records]
