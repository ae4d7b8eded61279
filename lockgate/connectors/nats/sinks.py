"""NATS sinks on the write-ahead base (``lockgate/connectors/writeahead.py``).

* :class:`JetStreamSink`, **exactly-once**: a checkpoint's records are
  published to a JetStream stream after the checkpoint completes, each with
  the ``Nats-Msg-Id`` header set to its de-duplication id
  (``<job>/<uid>/<task>/<checkpoint>/<n>``); records sent again after a
  failure carry the same ids, and the stream drops them — as long as they
  come within its ``duplicate_window``, which must cover a recovery
  (checked in the driver, ``min_duplicate_window``).
* :class:`NatsSink`, **at-least-once**: core NATS publishes (no stream, no
  de-duplication), flushed to the server; a failure may publish a
  checkpoint's records twice. Core NATS itself delivers to the subscribers
  connected at that moment, at most once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import orjson

from lockgate.connectors.base import Sink, TaskInfo
from lockgate.connectors.nats.client import DEFAULT_URL, NatsConnection, redact_url
from lockgate.connectors.writeahead import WriteAheadSinkWriter
from lockgate.errors import ConfigurationError

__all__ = ["JetStreamSink", "NatsSink"]

IN_FLIGHT = 256
"""Publishes awaited together (JetStream acknowledges each)."""


def default_serializer(record: Any) -> bytes:
    """``bytes`` as they are, ``str`` as UTF-8, anything else as JSON."""
    if isinstance(record, bytes):
        return record
    if isinstance(record, str):
        return record.encode()
    return orjson.dumps(record)


class _NatsSinkBase(Sink[Any]):
    def __init__(self, subject: str | Callable[[Any], str], *, url: str,
                 serializer: Callable[[Any], bytes] | None, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 s, got {timeout}")
        self.subject = subject
        self.url = url
        self.serializer = serializer or default_serializer
        self.timeout = timeout


class _NatsWriter(WriteAheadSinkWriter):
    """Encodes records to ``[subject, payload]`` at write time, so the
    checkpoint holds msgpack types whatever the records are."""

    def __init__(self, sink: _NatsSinkBase, info: TaskInfo) -> None:
        super().__init__(info)
        self.sink = sink
        self._conn: NatsConnection | None = None
        self._fixed = sink.subject if isinstance(sink.subject, str) else None

    def encode(self, record: Any) -> Any:
        subject = self._fixed
        if subject is None:
            assert callable(self.sink.subject)
            subject = self.sink.subject(record)
        return [subject, self.sink.serializer(record)]

    def connection(self) -> NatsConnection:
        if self._conn is None:
            self._conn = NatsConnection(self.sink.url, name=f"lockgate-{self.info.uid}")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class JetStreamSink(_NatsSinkBase):
    """Publishes to JetStream, exactly-once (``Nats-Msg-Id`` de-duplication).

    Args:
        subject: the subject, or a function of the record giving it; every
            subject must belong to a stream whose ``duplicate_window`` covers
            the time a failed job takes to recover.
        url: the NATS server.
        serializer: record -> payload bytes (default: bytes as they are, str as
            UTF-8, anything else as JSON).
        min_duplicate_window: refuse to start when the stream keeps message
            ids for less than this many seconds (JetStream's default is 120).
        timeout: seconds a publish may wait for JetStream's acknowledgement.
    """

    exactly_once = True

    def __init__(self, subject: str | Callable[[Any], str], *, url: str = DEFAULT_URL,
                 serializer: Callable[[Any], bytes] | None = None,
                 min_duplicate_window: float = 60.0, timeout: float = 10.0) -> None:
        super().__init__(subject, url=url, serializer=serializer, timeout=timeout)
        self.min_duplicate_window = min_duplicate_window

    def validate(self) -> None:
        """The subject (a fixed one) is in a stream whose duplicate window is
        at least ``min_duplicate_window``."""
        if not isinstance(self.subject, str):
            return  # subjects known per record: each publish is acknowledged by its stream
        conn = NatsConnection(self.url, name="lockgate-driver")
        subject = self.subject

        async def window() -> tuple[str, float]:
            from nats.js.errors import NotFoundError

            try:
                stream = await conn.js.find_stream_name_by_subject(subject)
            except NotFoundError:
                raise ConfigurationError(
                    f"JetStream sink: no stream at {redact_url(self.url)} takes subject "
                    f"{subject!r}; create one (nats stream add --subjects ...)") from None
            info = await conn.js.stream_info(stream)
            return stream, float(info.config.duplicate_window or 0.0)

        try:
            stream, seconds = conn.call(window, 10.0)
        finally:
            conn.close()
        if seconds < self.min_duplicate_window:
            raise ConfigurationError(
                f"JetStream sink: stream {stream!r} drops repeated message ids for "
                f"{seconds:g} s only (duplicate_window), less than min_duplicate_window="
                f"{self.min_duplicate_window:g} s: records sent again after a failure could "
                "be duplicated. Raise it (nats stream edit --dupe-window "
                f"{math.ceil(self.min_duplicate_window)}s {stream}) or lower "
                "min_duplicate_window to a bound on your recovery time")

    def create_writer(self, info: TaskInfo) -> _JetStreamWriter:
        return _JetStreamWriter(self, info)


class _JetStreamWriter(_NatsWriter):
    duplicates = 0
    """Records JetStream answered as duplicates (sent again after a failure)."""

    def send(self, records: list[Any], ids: list[str]) -> None:
        conn = self.connection()
        timeout = self.sink.timeout

        async def publish_all() -> int:
            dup = 0
            for lo in range(0, len(records), IN_FLIGHT):
                acks = await asyncio.gather(*(
                    conn.js.publish(subject, payload, timeout=timeout,
                                    headers={"Nats-Msg-Id": msg_id})
                    for (subject, payload), msg_id in zip(records[lo:lo + IN_FLIGHT],
                                                          ids[lo:lo + IN_FLIGHT], strict=True)))
                dup += sum(1 for ack in acks if ack.duplicate)
            return dup

        # the whole checkpoint's records, each acknowledged within `timeout`
        budget = timeout * (1 + len(records) // IN_FLIGHT) + 5.0
        self.duplicates += conn.call(publish_all, budget)


class NatsSink(_NatsSinkBase):
    """Publishes to core NATS subjects after each checkpoint: at-least-once.

    Args: as :class:`JetStreamSink` (without ``min_duplicate_window``)."""

    exactly_once = False

    def __init__(self, subject: str | Callable[[Any], str], *, url: str = DEFAULT_URL,
                 serializer: Callable[[Any], bytes] | None = None,
                 timeout: float = 10.0) -> None:
        super().__init__(subject, url=url, serializer=serializer, timeout=timeout)

    def validate(self) -> None:
        """The server answers."""
        NatsConnection(self.url, name="lockgate-driver").close()

    def create_writer(self, info: TaskInfo) -> _CoreNatsWriter:
        return _CoreNatsWriter(self, info)


class _CoreNatsWriter(_NatsWriter):
    def send(self, records: list[Any], ids: list[str]) -> None:
        conn = self.connection()
        timeout = self.sink.timeout

        async def publish_all() -> None:
            for (subject, payload), msg_id in zip(records, ids, strict=True):
                await conn.nc.publish(subject, payload, headers={"Nats-Msg-Id": msg_id})
            await conn.nc.flush(timeout=math.ceil(timeout))  # the server has them all

        conn.call(publish_all, timeout + 5.0 + len(records) / 10_000)
