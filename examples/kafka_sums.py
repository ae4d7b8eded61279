"""Running sums per key from one Kafka topic to another, exactly once.

    LOCKGATE_KAFKA=127.0.0.1:9092 python examples/kafka_sums.py [N]
    LOCKGATE_KAFKA=127.0.0.1:9092 lockgate run examples/kafka_sums.py [N]

The brokers come from ``LOCKGATE_KAFKA`` (default ``127.0.0.1:9092``). If the
topic ``lockgate-numbers`` is missing or empty, the example first fills it
with the numbers 1..N (default 100,000; values ``"x"``, keys ``x % 10``).
The job reads it to the end offsets it finds at start (``bounded=True``),
keeps a running sum per key and writes every update to
``lockgate-sums`` as JSON ``[key, sum]``, in one Kafka transaction per
checkpoint. Read it with any ``read_committed`` consumer, e.g.

    kcat -b 127.0.0.1:9092 -C -t lockgate-sums -X isolation.level=read_committed -e

Kill a task (``pkill -9 -f lgtask``) while it runs: the job restarts from its
latest checkpoint, and a ``read_committed`` consumer still sees every running
sum exactly once. No Kafka at hand? ``pip install noida-db`` and
``noida-db start --only kafka`` start a local Kafka-protocol broker on 9092.
"""

import json
import os
import sys

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors.kafka import KafkaSink, KafkaSource

BOOTSTRAP = os.environ.get("LOCKGATE_KAFKA", "127.0.0.1:9092")
SOURCE, TARGET = "lockgate-numbers", "lockgate-sums"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000


def fill_if_empty(bootstrap: str, topic: str, n: int) -> None:
    """Create ``topic`` (3 partitions) if missing; if it holds nothing, write 1..n."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lockgate-example"})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    held = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
               for p in partitions)
    consumer.close()
    if held:
        return
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    for x in range(1, n + 1):
        producer.produce(topic, str(x).encode(), str(x % 10).encode())
        if x % 10_000 == 0:
            producer.poll(0)
    producer.flush(30)
    print(f"wrote {n} numbers to {topic}")


pipeline = Pipeline("kafka-sums", parallelism=2,
                    checkpoint=CheckpointConfig(interval=1.0, storage="checkpoints/"))
(pipeline.source(KafkaSource(BOOTSTRAP, SOURCE, bounded=True), uid="numbers")
   .map(lambda r: (int(r.key), int(r.value)), uid="pairs")
   .key_by(lambda kv: kv[0])
   .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
   .sink(KafkaSink(BOOTSTRAP, TARGET, create_topic=True, partitions=2,
                   serializer=lambda kv: (str(kv[0]), json.dumps(kv))), uid="out"))

fill_if_empty(BOOTSTRAP, SOURCE, n)

if __name__ == "__main__":
    result = pipeline.run()
    print(f"{result.records_out} running sums committed to {TARGET}, "
          f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts, "
          f"guarantee {result.guarantee}")
