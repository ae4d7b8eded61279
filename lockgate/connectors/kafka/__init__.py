"""Kafka connectors: ``KafkaSource`` (replayable: offsets in Lockgate's
checkpoint) and ``KafkaSink`` (exactly-once: transactional + write-ahead; or
at-least-once). Importing this package does not import ``confluent_kafka``:
the tasks and the driver's checks do, on first use
(``pip install 'lockgate[kafka]'``). docs/connectors/kafka.md."""

from lockgate.connectors.kafka.sink import KafkaSink
from lockgate.connectors.kafka.source import KafkaRecord, KafkaSource

__all__ = ["KafkaRecord", "KafkaSink", "KafkaSource"]
