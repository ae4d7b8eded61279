"""``KafkaSource``: topics read partition by partition, offsets in Lockgate's checkpoint.

Every partition is a split. A task reads the partitions dealt to it with
``assign()`` at explicit offsets (never ``subscribe``: no group rebalance can
move a partition behind the checkpoint's back), with
``isolation.level=read_committed``. Its operator state is one entry per
partition, ``{"topic", "partition", "next"}``; the state is UNION, so on a
rescale every task sees every partition and takes its own
(:func:`owner_of`). docs/connectors/kafka.md describes the settings.
"""

from __future__ import annotations

import logging
import time
import zlib
from bisect import bisect_left
from typing import Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.kafka.client import (
    TIMEOUT,
    base_config,
    kafka_module,
    topic_partitions,
)
from lockgate.connectors.kafka.fetch import Chunk, KafkaRecord, check_value_format, chunks
from lockgate.errors import CheckpointCorruptError

__all__ = ["KafkaRecord", "KafkaSource", "owner_of"]

log = logging.getLogger("lockgate.connectors.kafka")

Split = tuple[str, int]
"""A partition: ``(topic, partition)``."""

POLL_TIMEOUT = 0.02
"""Seconds one poll may wait for records: the task handles its control
messages (checkpoint triggers) between polls."""

FETCH_PACING = {"queued.min.messages": 1, "fetch.queue.backoff.ms": 5}
"""The consumer's default pacing: a partition is fetched again as soon as
the task took what the last fetch brought, else 5 ms later. With
librdkafka's own defaults a consumer keeps up to 100,000 messages per
partition fetched ahead and, from a broker that answers a fetch at once
(``fetch.min.bytes`` 1), sends a fetch per few records of a trickle: about
ten times the CPU at 10,000 records/s, for a few milliseconds less
latency. The source's ``config`` overrides them."""
LAG_EVERY = 1.0
"""Seconds between two measures of the consumer lag (``backlog``)."""


def owner_of(split: Split, parallelism: int) -> int:
    """The task that reads ``split`` at ``parallelism``: a deal that every
    task computes alike and that does not move a partition when others appear."""
    topic, partition = split
    return (zlib.crc32(topic.encode()) + partition) % parallelism


class KafkaSource(Source[Any]):
    """Reads ``topics`` from the brokers ``bootstrap_servers`` (see
    docs/connectors/kafka.md for every setting)."""

    replayable = True
    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, bootstrap_servers: str, topics: str | list[str], *, bounded: bool = False,
                 starting_offsets: str = "earliest",
                 partition_idle_timeout: float | None = None,
                 discovery_interval: float | None = 10.0,
                 commit_offsets_to_group: bool = False, group_id: str | None = None,
                 value_format: str | None = None,
                 config: dict[str, Any] | None = None) -> None:
        check_value_format(value_format)
        if starting_offsets not in ("earliest", "latest"):
            raise ValueError(
                f"starting_offsets must be 'earliest' or 'latest', not {starting_offsets!r}")
        if partition_idle_timeout is not None and partition_idle_timeout <= 0:
            raise ValueError("partition_idle_timeout must be > 0 seconds, or None")
        self.bootstrap_servers = bootstrap_servers
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ValueError("KafkaSource needs at least one topic")
        self.bounded = bounded
        self.starting_offsets = starting_offsets
        self.partition_idle_timeout = partition_idle_timeout
        self.discovery_interval = discovery_interval
        self.commit_offsets_to_group = commit_offsets_to_group
        self.group_id = group_id
        self.value_format = value_format
        self.config = dict(config or {})
        self.end_offsets: dict[Split, int] | None = None
        """Bounded: the end offset of every partition, fixed by ``prepare``."""

    def _what(self) -> str:
        return f"KafkaSource({', '.join(self.topics)})"

    def task_modules(self) -> tuple[str, ...]:
        return ("confluent_kafka",)

    def validate(self) -> None:
        """A broker answers and every topic exists."""
        topic_partitions(self.bootstrap_servers, self.topics, self.config, self._what())

    def prepare(self, job_dir: str, uid: str) -> None:
        """Bounded: fix the end offsets (the last stable offsets) now, once
        per job, so every attempt ends at the same place."""
        if not self.bounded:
            return
        k = kafka_module()
        splits = topic_partitions(self.bootstrap_servers, self.topics, self.config, self._what())
        consumer = k.Consumer(self._consumer_config(f"lockgate-prepare-{uid}"))
        try:
            ends = {}
            for topic, partition in splits:
                _, high = consumer.get_watermark_offsets(k.TopicPartition(topic, partition),
                                                         timeout=TIMEOUT)
                ends[(topic, partition)] = int(high)
        finally:
            consumer.close()
        self.end_offsets = ends

    def _consumer_config(self, group_id: str) -> dict[str, Any]:
        config = base_config(self.bootstrap_servers, {
            "group.id": group_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "enable.partition.eof": True, **FETCH_PACING})
        config.update(self.config)
        config["isolation.level"] = "read_committed"
        return config

    def create_reader(self, info: TaskInfo) -> KafkaReader:
        return KafkaReader(self, info)


def _entry(entry: Any) -> tuple[Split, int]:
    """A restored partition position, validated (checkpoints are untrusted)."""
    ok = (isinstance(entry, dict) and type(entry.get("topic")) is str and entry["topic"]
          and type(entry.get("partition")) is int and entry["partition"] >= 0
          and type(entry.get("next")) is int and entry["next"] >= 0)
    if not ok:
        raise CheckpointCorruptError(
            f"Kafka source: restored state entry {entry!r} is not a partition position "
            "(topic, partition, next); restore with the source that wrote the checkpoint")
    return (entry["topic"], entry["partition"]), entry["next"]


class KafkaReader(SourceReader[Any]):
    """One task's partitions. ``poll`` returns records of one partition at a
    time (so the task keeps a watermark per partition, ``last_split``):
    ``KafkaRecord``s, or the decoded values with a ``value_format``."""

    def __init__(self, source: KafkaSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.positions: dict[Split, int] = {}
        """Per partition this task reads, the offset of the next record to return."""
        self.restored: dict[Split, int] = {}
        self.ended: set[Split] = set()
        self.buffers: dict[Split, list[Chunk]] = {}
        """Per partition, the records read and not returned yet, in chunks."""
        self._buffered = 0
        self.last_record: dict[Split, float] = {}
        self.snapshots: dict[int, dict[Split, int]] = {}
        self._consumer: Any = None
        self._next_discovery = 0.0
        self._turn = 0
        self._lag: int | None = None
        self._next_lag = 0.0

    # ------------------------------------------------------------ splits
    def _mine(self, split: Split) -> bool:
        return owner_of(split, self.info.parallelism) == self.info.task_index

    def restore(self, state: list[Any] | None) -> None:
        k = kafka_module()
        for entry in state or []:
            split, nxt = _entry(entry)
            self.restored[split] = nxt
        group = self.source.group_id or f"lockgate-{self.info.job_id}-{self.info.uid}"
        self._consumer = k.Consumer(self.source._consumer_config(group))
        self._discover()

    def _discover(self) -> None:
        """Assign the partitions of this task not assigned yet (all of them
        at the first call)."""
        source = self.source
        if source.end_offsets is not None:
            splits = sorted(source.end_offsets)
        else:
            splits = topic_partitions(source.bootstrap_servers, source.topics, source.config,
                                      source._what(), must_exist=False)
        new = [s for s in splits if self._mine(s) and s not in self.positions]
        if not new:
            return
        k = kafka_module()
        assign = []
        for split in new:
            nxt = self.restored.get(split)
            if nxt is None:
                low, high = self._consumer.get_watermark_offsets(k.TopicPartition(*split),
                                                                 timeout=TIMEOUT)
                nxt = int(low if source.starting_offsets == "earliest" else high)
            self.positions[split] = nxt
            self.last_record[split] = time.monotonic()
            if source.end_offsets is not None and nxt >= source.end_offsets[split]:
                self.ended.add(split)
                continue
            assign.append(k.TopicPartition(split[0], split[1], nxt))
        if assign:
            self._consumer.incremental_assign(assign)
        log.debug("Kafka source task %d: reads %s", self.info.task_index, new)

    # ------------------------------------------------------------- reading
    def poll(self, max_records: int) -> list[Any] | None:
        source = self.source
        if source.end_offsets is None and source.discovery_interval is not None:
            now = time.monotonic()
            if now >= self._next_discovery:
                self._next_discovery = now + source.discovery_interval
                self._discover()
        buffered = self._buffered
        if buffered < max_records and self._unended():
            # Keep about a batch of every partition's records at hand, so
            # that the partitions take turns (the consumer returns a fetch
            # of one partition at a time); wait only when nothing is.
            self._fetch(max_records, 0.0 if buffered else POLL_TIMEOUT)
        batch = self._take(max_records)
        now = time.monotonic()
        if now >= self._next_lag:
            self._next_lag = now + LAG_EVERY
            self._lag = self._measure_lag()
        if batch or self._unended():
            return batch
        return None if source.end_offsets is not None else []

    def _measure_lag(self) -> int | None:
        """The records of this task's partitions not returned yet: each
        partition's high watermark (as the consumer's last fetch of it
        learned, no request to the broker; a bounded read's end offset at
        most) minus the next offset to return. None while no partition's is
        known. Offsets count transaction markers too: an estimate."""
        k = kafka_module()
        ends = self.source.end_offsets
        left = self._unended()
        total, known = 0, not left
        for split in left:
            try:
                _, high = self._consumer.get_watermark_offsets(k.TopicPartition(*split),
                                                               cached=True)
            except k.KafkaException:
                continue
            if high is None or high < 0:
                continue
            if ends is not None:
                high = min(high, ends[split])
            total += max(0, int(high) - self.positions[split])
            known = True
        return total if known else None

    def backlog(self) -> int | None:
        """The consumer lag of this task's partitions, as of its last measure
        (about once a second, in ``poll``)."""
        return self._lag

    def _unended(self) -> list[Split]:
        return [s for s in self.positions if s not in self.ended]

    def _fetch(self, max_records: int, timeout: float) -> None:
        """Read what the consumer has into the per-partition buffers."""
        k = kafka_module()
        consume = self._consumer.consume
        # What the consumer has now; when it has nothing, wait for the first
        # record only (a batch-sized consume waits its whole timeout for a
        # batch to fill: latency at low rates) and take what came with it.
        messages = consume(max_records, 0)
        if not messages and timeout:
            messages = consume(1, timeout)
            if messages and max_records > 1:
                messages += consume(max_records - 1, 0)
        eof = False
        if messages:
            errors = list(map(k.Message.error, messages))
            if any(errors):
                records = []
                for msg, error in zip(messages, errors, strict=True):
                    if error is None:
                        records.append(msg)
                    elif error.code() == k.KafkaError._PARTITION_EOF:
                        eof = True
                    elif error.fatal() or not error.retriable():
                        raise k.KafkaException(error)
                messages = records
        if messages:
            self._buffer(chunks(k.Message, messages, self.source.topics,
                                self.source.value_format, self.source._what()))
        if self.source.end_offsets is not None and (eof or not self.buffers):
            self._check_ends()

    def _buffer(self, runs: list[tuple[Split, Chunk]]) -> None:
        """Append each run to its partition's buffer (a bounded read: up to
        the partition's end offset)."""
        ends = self.source.end_offsets
        buffers = self.buffers
        for split, chunk in runs:
            if ends is not None and chunk.offsets[-1] >= ends[split]:
                keep = bisect_left(chunk.offsets, ends[split])
                if not keep:
                    continue  # beyond the end offset of a bounded read
                chunk = Chunk(chunk.records[:keep], chunk.offsets[:keep])
            buffers.setdefault(split, []).append(chunk)
            self._buffered += len(chunk.offsets)

    def _check_ends(self) -> None:
        """Bounded: partitions whose consumer position reached the end
        offset (past transaction markers and aborted records too) and whose
        buffered records were all returned have ended."""
        k = kafka_module()
        ends = self.source.end_offsets
        assert ends is not None
        open_ = [s for s in self._unended() if not self.buffers.get(s)]
        if not open_:
            return
        done = []
        for tp in self._consumer.position([k.TopicPartition(*s) for s in open_]):
            split = (tp.topic, tp.partition)
            if tp.offset >= ends[split]:
                self.ended.add(split)
                self.positions[split] = ends[split]
                done.append(tp)
        if done:
            self._consumer.incremental_unassign(done)

    def _take(self, max_records: int) -> list[Any]:
        """Up to ``max_records`` buffered records of one partition (in turn)."""
        splits = [s for s, b in self.buffers.items() if b]
        if not splits:
            return []
        split = splits[self._turn % len(splits)]
        self._turn += 1
        buffer = self.buffers[split]
        first = buffer[0]
        if len(first.offsets) > max_records:  # a part of the first chunk
            batch, last = first.records[:max_records], first.offsets[max_records - 1]
            buffer[0] = Chunk(first.records[max_records:], first.offsets[max_records:])
        else:  # whole chunks
            batch, last = first.records, first.offsets[-1]
            taken = 1
            while taken < len(buffer) and len(batch) + len(buffer[taken].offsets) <= max_records:
                batch = batch + buffer[taken].records
                last = buffer[taken].offsets[-1]
                taken += 1
            del buffer[:taken]
        self._buffered -= len(batch)
        self.positions[split] = last + 1
        self.last_record[split] = time.monotonic()
        self.last_split = split
        ends = self.source.end_offsets
        if ends is not None and self.positions[split] >= ends[split] and not buffer:
            self.ended.add(split)
        return batch

    def unfinished_splits(self) -> list[Any]:
        timeout = self.source.partition_idle_timeout
        left = self._unended()
        if timeout is None:
            return left
        now = time.monotonic()
        return [s for s in left
                if self.buffers.get(s) or now - self.last_record[s] < timeout]

    # ---------------------------------------------------------- checkpoints
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        known = dict(self.positions)
        if self.source.commit_offsets_to_group:
            self.snapshots[checkpoint_id] = dict(known)
        # A restored partition of this task that it does not read (its topic
        # is gone, or not found yet) keeps its position: never dropped.
        for split, nxt in self.restored.items():
            if self._mine(split):
                known.setdefault(split, nxt)
        return [{"topic": t, "partition": p, "next": n} for (t, p), n in sorted(known.items())]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """With ``commit_offsets_to_group``: commit the offsets of that
        checkpoint to the group, for monitoring (never read back)."""
        done = [c for c in self.snapshots if c <= checkpoint_id]
        if not done or self._consumer is None:
            return
        positions = self.snapshots[max(done)]
        for c in done:
            del self.snapshots[c]
        k = kafka_module()
        offsets = [k.TopicPartition(t, p, n) for (t, p), n in sorted(positions.items())]
        if offsets:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except k.KafkaException as e:  # monitoring only: never fail the job
                log.warning("Kafka source: could not commit offsets to the group: %s", e)

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()
            except RuntimeError:
                pass

