"""``KafkaSink``: exactly-once (transactional + write-ahead) or at-least-once.

The design, and the failure cases it covers, are in docs/connectors/kafka.md
("Design"). In short, per sink task: one transactional producer whose id is
stable across attempts (fencing), one Kafka transaction per checkpoint, the
checkpoint's records kept in its handle (operator state) so that recovery can
redo a transaction the crash aborted, and a marker — the checkpoint id as
the committed offset of a group named after the transactional id — committed
in the same transaction, so recovery knows whether it committed.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import islice, repeat
from operator import length_hint
from typing import Any

from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.kafka.client import base_config, ensure_topic, kafka_module
from lockgate.connectors.kafka.sink_plan import (
    KafkaEntry,
    KafkaOwner,
    KafkaTxnHandle,
    check_entry,
    committed,
    plan_recovery,
    transactional_id,
)
from lockgate.connectors.kafka.source import KafkaRecord
from lockgate.connectors.twophase import Precommitted, TwoPhaseCommitSinkWriter

__all__ = ["KafkaSink", "default_serializer"]

log = logging.getLogger("lockgate.connectors.kafka")

_drain: Callable[[Any], object] = partial(deque, maxlen=0)
"""Runs an iterator to its end, keeping nothing."""

TXN_TIMEOUT = 30.0
"""Seconds ``init_transactions``, ``commit_transaction`` and the marker's
calls may take (a new id's init waits for the coordinator to abort what an
older producer of that id left open)."""



TXN_LINGER_MS = 50
"""The transactional producer's ``linger.ms`` (librdkafka's default is 5):
its records become visible only when the checkpoint's commit flushes and
commits them, and a flush sends at once whatever lingers, so a longer
linger costs no visibility and makes fewer, larger produce requests (in W3,
about a tenth more records per second). Kafka Streams lingers 100 ms for
the same reason. ``KafkaSink(config={"linger.ms": ...})`` overrides it."""


def _bytes(x: Any) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, bytearray | memoryview):
        return bytes(x)
    raise TypeError(f"Kafka sink: a key or value must be bytes, str or None, not {type(x)}")


def _serialized(serializer: Any, batch: list[Any]) -> tuple[list[bytes | None],
                                                             list[bytes | None]]:
    """The keys and the values of a batch as bytes (str encoded, bytes as
    they are), in two lists: the transaction's write-ahead lists are
    extended with them, no tuple kept per record."""
    pairs = list(map(serializer, batch))
    encode = str.encode
    try:  # every key and value a str, the common case
        return [encode(k) for k, _ in pairs], [encode(v) for _, v in pairs]
    except TypeError:  # bytes, None or another type among them (or no pair)
        pass
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    add_key, add_value = keys.append, values.append
    for k, v in pairs:
        add_key(k if k is None or k.__class__ is bytes else
                k.encode() if k.__class__ is str else _bytes(k))
        add_value(v if v.__class__ is bytes else v.encode() if v.__class__ is str else _bytes(v))
    return keys, values


def default_serializer(record: Any) -> tuple[Any, Any]:
    """``bytes``/``str`` as the value; a ``(key, value)`` tuple; a
    ``KafkaRecord``'s key and value; anything else as JSON."""
    if isinstance(record, bytes | str):
        return None, record
    if isinstance(record, KafkaRecord):
        return record.key, record.value
    if isinstance(record, tuple) and len(record) == 2:
        return record
    return None, json.dumps(record)


class KafkaSink(Sink[Any]):
    """Writes records to ``topic`` (see docs/connectors/kafka.md)."""

    def __init__(self, bootstrap_servers: str, topic: str, *,
                 delivery: str = "exactly_once",
                 serializer: Callable[[Any], tuple[Any, Any]] = default_serializer,
                 create_topic: bool = False, partitions: int = 1, replication_factor: int = 1,
                 transactional_id_prefix: str = "lockgate", transaction_timeout: float = 900.0,
                 config: dict[str, Any] | None = None) -> None:
        if delivery not in ("exactly_once", "at_least_once"):
            raise ValueError(
                f"delivery must be 'exactly_once' or 'at_least_once', not {delivery!r}")
        if not topic:
            raise ValueError("KafkaSink needs a topic")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.delivery = delivery
        self.exactly_once = delivery == "exactly_once"
        self.serializer = serializer
        self.create_topic = create_topic
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.transactional_id_prefix = transactional_id_prefix
        self.transaction_timeout = transaction_timeout
        self.config = dict(config or {})

    def task_modules(self) -> tuple[str, ...]:
        return ("confluent_kafka",)

    def validate(self) -> None:
        """A broker answers; the topic exists (or is created)."""
        ensure_topic(self.bootstrap_servers, self.topic, self.config, f"KafkaSink({self.topic})",
                     create=self.create_topic, partitions=self.partitions,
                     replication_factor=self.replication_factor)

    def producer_config(self, tid: str | None) -> dict[str, Any]:
        """A producer's settings: transactional with id ``tid``, else idempotent."""
        config = base_config(self.bootstrap_servers, {"acks": "all", "linger.ms": 5,
                                                      "enable.idempotence": True})
        if tid is not None:
            config["transactional.id"] = tid
            config["transaction.timeout.ms"] = int(self.transaction_timeout * 1000)
            config["linger.ms"] = TXN_LINGER_MS
        config.update(self.config)
        return config

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        if self.exactly_once:
            return KafkaTransactionalWriter(self, info)
        return KafkaAtLeastOnceWriter(self, info)


class _Delivery:
    """Delivery errors of a producer, raised at the next flush (the
    producer reports failed deliveries only: ``configure``)."""

    def __init__(self) -> None:
        self.errors: list[Any] = []

    def __call__(self, error: Any, msg: Any) -> None:
        if error is not None:
            self.errors.append(error)

    def configure(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with this as its delivery callback, called for failed
        deliveries only (a call per record sent cost as much as the sending)."""
        config["on_delivery"] = self
        config["delivery.report.only.error"] = True
        return config

    def flush(self, producer: Any, what: str) -> None:
        left = producer.flush(TXN_TIMEOUT)
        if self.errors or left:
            first = self.errors[0] if self.errors else f"{left} records not delivered"
            self.errors.clear()
            raise kafka_module().KafkaException(f"Kafka sink: {what} failed: {first}")


def _produce(producer: Any, topic: str, keys: list[bytes | None],
             values: list[bytes | None]) -> None:
    """Send the records (``keys[i]``, ``values[i]``); a full local queue
    waits for deliveries. One C-speed pass (``map``) over the records: on a
    full queue the count of topics left says which record to send again."""
    produce, poll = producer.produce, producer.poll
    n = len(values)
    sent = 0
    while sent < n:
        topics = repeat(topic, n - sent)
        try:
            _drain(map(produce, topics, islice(values, sent, None), islice(keys, sent, None)))
            break
        except BufferError:
            sent = n - length_hint(topics) - 1  # the record that did not fit
            poll(0.05)
    poll(0)


class KafkaAtLeastOnceWriter(SinkWriter[Any]):
    """Sends records as they come; ``flush()`` at every snapshot."""

    def __init__(self, sink: KafkaSink, info: TaskInfo) -> None:
        self.sink = sink
        self.delivery = _Delivery()
        self.producer: Any = None

    def restore(self, state: list[Any]) -> None:
        config = self.delivery.configure(self.sink.producer_config(None))
        self.producer = kafka_module().Producer(config)

    def write_batch(self, batch: list[Any]) -> None:
        _produce(self.producer, self.sink.topic, *_serialized(self.sink.serializer, batch))

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self.delivery.flush(self.producer, "a flush")
        return []

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(1.0)
            self.producer = None


@dataclass
class _Txn:
    """One checkpoint's transaction: its records (serialized) as they came,
    keys and values in two lists (as its handle keeps them)."""

    seq: int
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)


class KafkaTransactionalWriter(TwoPhaseCommitSinkWriter[_Txn, KafkaEntry]):
    """One task of an exactly-once ``KafkaSink`` (see the module docstring)."""

    def __init__(self, sink: KafkaSink, info: TaskInfo) -> None:
        super().__init__(info)
        self.sink = sink
        self.tid = transactional_id(sink.transactional_id_prefix, info.job_id, info.uid,
                                    info.task_index)
        self.nonce = secrets.token_hex(8)
        """Names this writer's own handles: only those can be the live one."""
        self.delivery = _Delivery()
        self.producer: Any = None
        self.live: _Txn | None = None
        """The transaction whose records are in the producer's open Kafka transaction."""
        self._seq = 0
        self._groups: dict[str, Any] = {}

    # ------------------------------------------------------------ clients
    def _producer(self, tid: str) -> Any:
        """A transactional producer with id ``tid``, initialized: any older
        producer of that id is fenced and its open transaction aborted."""
        config = self.delivery.configure(self.sink.producer_config(tid))
        producer = kafka_module().Producer(config)
        producer.init_transactions(TXN_TIMEOUT)
        return producer

    def _group(self, tid: str) -> Any:
        """A consumer of the marker group ``tid`` (never subscribed)."""
        consumer = self._groups.get(tid)
        if consumer is None:
            config = base_config(self.sink.bootstrap_servers, {
                "group.id": tid, "enable.auto.commit": False,
                "isolation.level": "read_committed"})
            config.update({k: v for k, v in self.sink.config.items()
                           if k.startswith(("security.", "sasl.", "ssl."))})
            consumer = self._groups[tid] = kafka_module().Consumer(config)
        return consumer

    def _marker(self, tid: str) -> int | None:
        """The checkpoint id the group ``tid`` committed last, or None."""
        k = kafka_module()
        [tp] = self._group(tid).committed([k.TopicPartition(self.sink.topic, 0)],
                                          timeout=TXN_TIMEOUT)
        return int(tp.offset) if tp.offset >= 0 else None

    def _commit_kafka(self, producer: Any, tid: str, checkpoint_id: int) -> None:
        """Step 4: the marker in the transaction, then commit it."""
        k = kafka_module()
        self.delivery.flush(producer, "sending a transaction's records")
        producer.send_offsets_to_transaction(
            [k.TopicPartition(self.sink.topic, 0, checkpoint_id)],
            self._group(tid).consumer_group_metadata(), TXN_TIMEOUT)
        producer.commit_transaction(TXN_TIMEOUT)

    def _redo(self, producer: Any, entry: Precommitted[KafkaTxnHandle]) -> None:
        """Send a handle's records in a new transaction, with its marker, and commit."""
        producer.begin_transaction()
        _produce(producer, self.sink.topic, entry.handle.keys, entry.handle.values)
        self._commit_kafka(producer, entry.handle.tid, entry.checkpoint_id)

    # -------------------------------------------------------------- hooks
    def decode_handle(self, entry: dict[str, Any]) -> KafkaEntry:
        """A restored transaction or owner entry, checked: it names one of
        this sink's transactional ids."""
        return check_entry(entry, self.sink.transactional_id_prefix, self.info.uid)

    def recover(self, handles: list[Precommitted[KafkaEntry]]) -> None:
        """Step 5 of the design: fence, find what committed, redo the rest."""
        info = self.info
        plan = plan_recovery(handles, info.task_index, info.parallelism, self.tid)
        self.producer = self._producer(self.tid)
        others: dict[str, Any] = {}
        for tid in plan.fence:  # old tasks' ids: abort what they left open
            self._producer(tid)
        for entry in plan.handles:
            tid = entry.handle.tid
            if tid == self.tid:
                producer = self.producer
            else:
                producer = others.get(tid) or others.setdefault(tid, self._producer(tid))
            if committed(self._marker(tid), entry):
                continue
            log.info("Kafka sink %s task %d: redoing checkpoint %d's transaction of %s "
                     "(%d records)", info.uid, info.task_index, entry.checkpoint_id,
                     tid, len(entry.handle.keys))
            self._redo(producer, entry)

    def begin_transaction(self) -> _Txn:
        self._seq += 1
        txn = _Txn(self._seq)
        if self.live is None and not self.pending_checkpoints:
            self.producer.begin_transaction()
            self.live = txn
        return txn

    def write(self, txn: _Txn, batch: list[Any]) -> None:
        keys, values = _serialized(self.sink.serializer, batch)
        txn.keys += keys
        txn.values += values
        if txn is self.live:
            _produce(self.producer, self.sink.topic, keys, values)

    def pre_commit(self, txn: _Txn) -> KafkaTxnHandle:
        """Step 3: the handle keeps the records to redo the transaction, which
        makes it durable with the checkpoint (write-ahead). No flush here:
        the records already sent are delivered while the checkpoint
        completes, and the commit flushes (a delivery error fails it, and
        recovery redoes the transaction from this handle)."""
        # the lists themselves: nothing appends to a transaction once pre-committed
        return KafkaTxnHandle(self.tid, self.nonce, txn.seq, txn.keys, txn.values)

    def commit(self, entry: Precommitted[KafkaEntry]) -> None:
        """Step 4: commit the live transaction, or redo one from its handle."""
        handle = entry.handle
        assert isinstance(handle, KafkaTxnHandle)  # owner entries are never pending
        live = self.live
        if live is not None and handle.writer == self.nonce and handle.seq == live.seq:
            self._commit_kafka(self.producer, self.tid, entry.checkpoint_id)
            self.live = None
            return
        self._redo(self.producer, Precommitted(entry.checkpoint_id, entry.task_index, handle))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_complete(checkpoint_id)
        self._catch_up()

    def _catch_up(self) -> None:
        """The producer is free and no handle waits: the open transaction's
        records so far go out now, in a Kafka transaction of its own."""
        txn = self._txn
        if txn is None or self.live is not None or self.pending_checkpoints:
            return
        self.producer.begin_transaction()
        self.live = txn
        _produce(self.producer, self.sink.topic, txn.keys, txn.values)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        entries = super().snapshot_state(checkpoint_id)
        entries.append(Precommitted(checkpoint_id, self.info.task_index,
                                    KafkaOwner(self.tid)).to_state())
        return entries

    def abort(self, txn: _Txn) -> None:
        """Abort the open Kafka transaction if it is ``txn``'s (on close);
        otherwise nothing: the next attempt's fencing aborts it."""
        if txn is self.live and self.producer is not None:
            self.live = None
            try:
                self.producer.abort_transaction(TXN_TIMEOUT)
            except kafka_module().KafkaException as e:
                log.debug("Kafka sink: abort on close failed: %s", e)

    def close(self) -> None:
        try:
            super().close()
        finally:
            for consumer in self._groups.values():
                try:
                    consumer.close()
                except RuntimeError:
                    pass
            self._groups.clear()
            self.producer = None
