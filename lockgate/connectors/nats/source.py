"""``JetStreamSource``: a replayable source over a NATS JetStream stream.

The position is the stream sequence, kept in Lockgate's checkpoint (operator
state: stream, subject filter, next sequence, end), never in the server: a
split is read by an *ephemeral* pull consumer (``AckPolicy.NONE``, in
memory, deleted by the server when its task is gone) started at the
checkpointed sequence. Splits are the subject filters given (``subjects``),
or the whole stream as one split. Bounded sources read up to the stream's
last sequence at the job's start, fixed once in the driver (``prepare``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.nats.client import DEFAULT_URL, NatsConnection, redact_url
from lockgate.connectors.nats.splits import check_disjoint, deal_subject_splits, unfinished
from lockgate.errors import ConfigurationError, LockgateError

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["JetStreamSource", "JetStreamMessage"]

log = logging.getLogger("lockgate.connectors.nats")

FETCH_BATCH = 512
"""Messages asked for by one pull request."""
PREFETCH = 4096
"""Messages a split may hold fetched but not yet polled (bounded memory)."""
FETCH_WAIT = 1.0
"""Seconds a pull request waits for messages when there are none."""
CALL_TIMEOUT = 10.0
"""Seconds a request to the server may take."""
_END = object()
"""Marks the end of a bounded split in its buffer."""


@dataclass(frozen=True)
class JetStreamMessage:
    """A record of a ``JetStreamSource(metadata=True)``."""

    subject: str
    sequence: int
    """The stream sequence."""
    timestamp_ms: int
    """When the server stored the message (ms since the epoch)."""
    value: Any
    """The payload, through the source's ``deserializer``."""


class JetStreamSource(Source[Any]):
    """Reads the messages of a JetStream stream, replayably.

    Args:
        stream: the stream's name.
        subjects: subject filters, one split each (they must not overlap),
            dealt round-robin to the tasks; ``None``: the whole stream is one
            split (one task reads; use subjects to read in parallel).
        url: the NATS server (``nats://host:port``; user and password may be
            in it, and are masked in messages).
        bounded: read up to the stream's last sequence at the job's start
            (fixed in the driver before the first attempt), then end; else
            read on forever.
        start_sequence: the first stream sequence to read on a fresh start.
        deserializer: applied to each payload (``bytes``); default: the bytes.
        metadata: emit :class:`JetStreamMessage` records instead of payloads.
    """

    replayable = True
    operator_state_mode = OperatorStateMode.UNION  # every task sees every split

    def __init__(self, stream: str, *, subjects: list[str] | None = None,
                 url: str = DEFAULT_URL, bounded: bool = False, start_sequence: int = 1,
                 deserializer: Callable[[bytes], Any] | None = None,
                 metadata: bool = False) -> None:
        if start_sequence < 1:
            raise ValueError(f"start_sequence must be >= 1, got {start_sequence}")
        if subjects is not None:
            if not subjects:
                raise ValueError("subjects must name at least one filter, or be None")
            check_disjoint(subjects)
        self.stream = stream
        self.subjects = subjects
        self.url = url
        self.bounded = bounded
        self.start_sequence = start_sequence
        self.deserializer = deserializer
        self.metadata = metadata
        self.end_sequence: int | None = None
        """Bounded: the last sequence to read, fixed by ``prepare``."""

    def validate(self) -> None:
        """The stream exists (checked in the driver, before the job starts)."""
        self._last_sequence()

    def prepare(self, job_dir: str, uid: str) -> None:
        """Bounded: fix the end at the stream's last sequence, once per job."""
        if self.bounded and self.end_sequence is None:
            self.end_sequence = self._last_sequence()

    def _last_sequence(self) -> int:
        conn = NatsConnection(self.url, name="lockgate-driver")
        try:
            async def info() -> int:
                from nats.js.errors import NotFoundError

                try:
                    si = await conn.js.stream_info(self.stream)
                except NotFoundError:
                    raise ConfigurationError(
                        f"JetStream source: there is no stream {self.stream!r} at "
                        f"{redact_url(self.url)}; create it (nats stream add) or fix the "
                        "name") from None
                return int(si.state.last_seq)

            return conn.call(info, CALL_TIMEOUT)
        finally:
            conn.close()

    def fresh_splits(self) -> list[dict[str, Any]]:
        """Every split at its start position."""
        end = self.end_sequence if self.bounded else None
        subjects: list[str | None] = list(self.subjects) if self.subjects else [None]
        return [{"stream": self.stream, "subject": s, "next": self.start_sequence, "end": end}
                for s in subjects]

    def create_reader(self, info: TaskInfo) -> JetStreamReader:
        if self.bounded and self.end_sequence is None:
            raise LockgateError("JetStream source: bounded, but prepare() fixed no end")
        return JetStreamReader(self, info)


class _SplitFetcher:
    """Fetches one split's messages on the connection's loop into a buffer of
    at most ``PREFETCH`` messages, which the task thread drains."""

    def __init__(self, source: JetStreamSource, conn: NatsConnection,
                 split: dict[str, Any]) -> None:
        self.source = source
        self.conn = conn
        self.subject: str | None = split["subject"]
        self.start = int(split["next"])
        self.end: int | None = split["end"]
        self.buffer: collections.deque[tuple[int, Any] | object] = collections.deque()
        self.room = asyncio.Event()
        self.lock = threading.Lock()
        self.consumer = f"lockgate-{uuid.uuid4().hex[:16]}"
        self.pending: int | None = None
        """Messages of the split in the stream after the last one fetched (as
        JetStream's last answer said, counted no further than a bounded
        split's end; None before its first)."""
        self.last = self.start - 1
        """The stream sequence of the last message fetched."""
        self.future: Future[Any] = conn.spawn(self._run)

    async def _run(self) -> None:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(
            name=self.consumer, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start, ack_policy=AckPolicy.NONE, filter_subject=self.subject,
            inactive_threshold=30.0, mem_storage=True, num_replicas=1,
            description="lockgate source split (ephemeral)")
        jsm = self.conn.nc.jsm()
        first = int((await jsm.stream_info(self.source.stream)).state.first_seq)
        if first > self.start:  # retention dropped what the checkpoint had not read
            log.warning("JetStream stream %s: sequences %d..%d are gone (retention or a "
                        "purge) before this source read them; it resumes at %d",
                        self.source.stream, self.start, first - 1, first)
        info = await jsm.add_consumer(self.source.stream, config=config)
        self.pending = self._until_end(int(info.num_pending or 0), self.start - 1)
        if self.end is not None and not info.num_pending:
            self.buffer.append(_END)  # nothing of this split up to the end
            return
        sub = await self.conn.js.pull_subscribe_bind(consumer=self.consumer,
                                                     stream=self.source.stream)
        expected = 1  # consumer sequences are contiguous: a gap is a lost message
        while True:
            while len(self.buffer) >= PREFETCH:
                self.room.clear()
                await self.room.wait()
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=FETCH_WAIT)
            except (TimeoutError, NatsTimeout):
                if self.end is not None:
                    ci = await sub.consumer_info()
                    if self._found_nothing(int(ci.num_pending or 0)):
                        self.buffer.append(_END)
                        return
                continue
            for msg in msgs:
                md = msg.metadata
                if md.sequence.consumer != expected:
                    raise LockgateError(
                        f"JetStream stream {self.source.stream}: consumer sequence "
                        f"{md.sequence.consumer} after {expected - 1}: messages were lost "
                        "on the way; the task restarts from its checkpoint")
                expected += 1
                seq = md.sequence.stream
                if self.end is not None and seq > self.end:
                    self.buffer.append(_END)
                    return
                self.buffer.append((seq, self._record(msg, seq)))
                self.last = seq
                self.pending = self._until_end(int(md.num_pending or 0), seq)
                if self.end is not None and (md.num_pending == 0 or seq == self.end):
                    self.buffer.append(_END)
                    return

    def _found_nothing(self, num_pending: int) -> bool:
        """A bounded split's fetch found nothing and JetStream has
        ``num_pending`` messages of it after the last one fetched (some may
        have come since, past the end): whether the split ended."""
        self.pending = self._until_end(num_pending, self.last)
        return num_pending == 0

    def _until_end(self, pending: int, seq: int) -> int:
        """``pending`` messages after stream sequence ``seq``, no further than
        a bounded read's end."""
        return pending if self.end is None else max(0, min(pending, self.end - seq))

    def backlog(self) -> int | None:
        """The split's messages not returned yet: those fetched and buffered,
        and those pending in the stream (None before JetStream's first answer)."""
        pending = self.pending
        return None if pending is None else pending + len(self.buffer)

    def _record(self, msg: Msg, seq: int) -> Any:
        value = self.source.deserializer(msg.data) if self.source.deserializer else msg.data
        if not self.source.metadata:
            return value
        ts = int(msg.metadata.timestamp.timestamp() * 1000)
        return JetStreamMessage(msg.subject, seq, ts, value)

    def take(self, n: int) -> tuple[list[tuple[int, Any]], bool]:
        """Up to ``n`` buffered messages, and whether the split ended."""
        if self.future.done() and not self.future.cancelled():
            error = self.future.exception()
            if error is not None:
                raise LockgateError(f"JetStream source split {self.subject or '(all)'} of "
                                    f"{self.source.stream}: {type(error).__name__}: {error}"
                                    ) from error
        out: list[tuple[int, Any]] = []
        ended = False
        while self.buffer and len(out) < n:
            item = self.buffer.popleft()
            if item is _END:
                ended = True
                break
            assert isinstance(item, tuple)
            out.append(item)
        if len(self.buffer) < PREFETCH:
            self.conn.call_soon(self.room.set)
        return out, ended

    def stop(self) -> None:
        self.future.cancel()


class JetStreamReader(SourceReader[Any]):
    """One task's splits of a :class:`JetStreamSource`."""

    def __init__(self, source: JetStreamSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.splits: list[dict[str, Any]] = []
        self._conn: NatsConnection | None = None
        self._fetchers: list[_SplitFetcher | None] = []
        self._turn = 0

    def restore(self, state: list[Any] | None) -> None:
        i, p = self.info.task_index, self.info.parallelism
        fresh = self.source.fresh_splits()
        if state is None:
            self.splits = fresh[i::p]
        else:
            self.splits = deal_subject_splits(state, fresh, self.source.stream, i, p)
        for split in self.splits:  # this job's end, whatever the checkpoint's job had
            split["end"] = self.source.end_sequence if self.source.bounded else None

    def _start(self) -> None:
        self._conn = NatsConnection(self.source.url, name=f"lockgate-{self.info.uid}")
        self._fetchers = [_SplitFetcher(self.source, self._conn, s) if unfinished(s) else None
                          for s in self.splits]

    def poll(self, max_records: int) -> list[Any] | None:
        if self._conn is None:
            self._start()
        n = len(self.splits)
        for k in range(n):
            j = (self._turn + k) % n
            fetcher, split = self._fetchers[j], self.splits[j]
            if fetcher is None or not unfinished(split):
                continue
            got, ended = fetcher.take(max_records)
            if got:
                split["next"] = got[-1][0] + 1
            if ended:
                split["next"] = split["end"] + 1
                self._fetchers[j] = None
                fetcher.stop()
            if got:
                self._turn = (j + 1) % n
                if split["subject"] is not None:
                    self.last_split = split["subject"]
                return [record for _, record in got]
        if all(not unfinished(s) for s in self.splits):
            return None
        return []

    def unfinished_splits(self) -> list[Any]:
        return [s["subject"] for s in self.splits if unfinished(s) and s["subject"] is not None]

    def backlog(self) -> int | None:
        """The messages of this task's splits not read yet: JetStream's
        ``num_pending`` of each split's consumer after its last fetch, plus the
        split's buffer (None while a split has had no answer)."""
        total = 0
        for fetcher in list(self._fetchers):
            if fetcher is None:
                continue
            left = fetcher.backlog()
            if left is None:
                return None
            total += left
        return total

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        owner, of = self.info.task_index, self.info.parallelism
        return [{**s, "owner": owner, "of": of} for s in self.splits]

    def close(self) -> None:
        for fetcher in self._fetchers:
            if fetcher is not None:
                fetcher.stop()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
