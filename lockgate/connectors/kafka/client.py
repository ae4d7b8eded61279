"""The confluent-kafka client, loaded on first use, and the checks both
Kafka connectors make in the driver before a job starts.

``import lockgate`` never imports ``confluent_kafka``: users without the
``kafka`` extra can still import Lockgate; using a Kafka connector without it
is a ``ConfigurationError`` naming the extra.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from lockgate.errors import ConfigurationError

__all__ = ["kafka_module", "admin_module", "base_config", "topic_partitions", "check_broker",
           "ensure_topic", "raise_for"]

log = logging.getLogger("lockgate.connectors.kafka")

TIMEOUT = 10.0
"""Seconds a metadata request, a transaction call or a flush may take before
it is an error."""


def kafka_module() -> ModuleType:
    """``confluent_kafka``, or a ``ConfigurationError`` naming the extra."""
    try:
        import confluent_kafka
    except ImportError as e:
        raise ConfigurationError(
            "the Kafka connectors need confluent-kafka: pip install 'lockgate[kafka]'") from e
    return confluent_kafka


def admin_module() -> ModuleType:
    """``confluent_kafka.admin``."""
    kafka_module()
    import confluent_kafka.admin

    return confluent_kafka.admin


def _log_cb(logger: logging.Logger) -> Any:
    def log_line(record: Any) -> None:  # librdkafka's own lines, at DEBUG
        logger.debug("%s", record)
    return log_line


def base_config(bootstrap_servers: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A client configuration: the servers, librdkafka's log lines through
    Lockgate's logger (not on stderr), and the user's settings last."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers,
                              "logger": log, "log_level": 3}
    config.update(extra or {})
    return config


def raise_for(error: Any, what: str) -> None:
    """Raise ``error`` (a ``KafkaError`` or None) as an exception saying ``what``."""
    if error is not None:
        raise kafka_module().KafkaException(error, f"{what}: {error}")


def _metadata(bootstrap_servers: str, config: dict[str, Any] | None, what: str) -> Any:
    admin = admin_module().AdminClient(base_config(bootstrap_servers, config))
    try:
        return admin, admin.list_topics(timeout=TIMEOUT)
    except kafka_module().KafkaException as e:
        raise ConfigurationError(
            f"{what}: no Kafka broker answered at {bootstrap_servers!r} within {TIMEOUT:.0f} s "
            f"({e.args[0] if e.args else e}); start the broker or fix bootstrap_servers") from e


def check_broker(bootstrap_servers: str, config: dict[str, Any] | None, what: str) -> Any:
    """The cluster's metadata, or a ``ConfigurationError`` saying no broker answered."""
    return _metadata(bootstrap_servers, config, what)[1]


def topic_partitions(bootstrap_servers: str, topics: list[str], config: dict[str, Any] | None,
                     what: str, *, must_exist: bool = True) -> list[tuple[str, int]]:
    """Every ``(topic, partition)`` of ``topics``, sorted; a missing topic is a
    ``ConfigurationError`` (or skipped, with ``must_exist=False``)."""
    metadata = check_broker(bootstrap_servers, config, what)
    out: list[tuple[str, int]] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            if must_exist:
                raise ConfigurationError(
                    f"{what}: the topic {topic!r} does not exist on {bootstrap_servers!r}; "
                    "create it first")
            continue
        out += [(topic, p) for p in meta.partitions]
    return sorted(out)


def ensure_topic(bootstrap_servers: str, topic: str, config: dict[str, Any] | None, what: str,
                 *, create: bool, partitions: int, replication_factor: int) -> None:
    """Check that ``topic`` exists, or create it with ``create=True``."""
    admin, metadata = _metadata(bootstrap_servers, config, what)
    meta = metadata.topics.get(topic)
    if meta is not None and meta.error is None and meta.partitions:
        return
    if not create:
        raise ConfigurationError(
            f"{what}: the topic {topic!r} does not exist on {bootstrap_servers!r}; create it "
            "or pass create_topic=True")
    new = admin_module().NewTopic(topic, partitions, replication_factor)
    future = admin.create_topics([new], operation_timeout=TIMEOUT)[topic]
    try:
        future.result(TIMEOUT)
    except kafka_module().KafkaException as e:
        error = e.args[0] if e.args else None
        if getattr(error, "code", lambda: None)() != kafka_module().KafkaError.TOPIC_ALREADY_EXISTS:
            raise ConfigurationError(
                f"{what}: could not create the topic {topic!r} on {bootstrap_servers!r}: "
                f"{error}") from e
    log.info("%s: created the topic %r (%d partitions)", what, topic, partitions)
