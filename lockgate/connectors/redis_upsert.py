"""``RedisUpsertSink``: idempotent key writes into Redis (``SET`` or ``HSET``),
at least once per checkpoint.

Writes are buffered per key (the last record of a key wins) and sent in one
``MULTI``/``EXEC`` pipeline when the buffer is full and at every snapshot,
before the barrier moves on: once a checkpoint completes, everything before
it is in Redis (as durable as the server's persistence: AOF with
``appendfsync always`` for a crash of Redis itself). A replay after a
failure writes the same keys again; with deterministic keyed values (a
running aggregate keyed by the Redis key) the result is exactly what a
failure-free run writes, and ``exactly_once=True`` says so
(docs/connectors/redis.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.errors import ConfigurationError, LockgateError
from lockgate.redact import redact

if TYPE_CHECKING:
    import redis

__all__ = ["RedisUpsertSink", "RedisUpsertWriter", "import_redis", "redis_client",
           "redact_url"]

KINDS = ("string", "hash")


def import_redis() -> Any:
    """The ``redis`` module, or a ConfigurationError naming the extra to install."""
    try:
        import redis
    except ImportError as e:
        raise ConfigurationError(
            f"the Redis connectors need redis-py ({e}): pip install 'lockgate[redis]'") from e
    return redis


def redact_url(url: str) -> str:
    """``url`` without its password (:func:`lockgate.redact.redact`)."""
    return redact(url)


def redis_client(url: str) -> redis.Redis:
    """A client of ``url`` (``redis://host:port/db``) that answers a PING, or
    a ConfigurationError naming the server."""
    lib = import_redis()
    client: redis.Redis = lib.Redis.from_url(url, socket_connect_timeout=10,
                                             socket_timeout=60)
    try:
        client.ping()
    except lib.RedisError as e:
        client.close()
        raise ConfigurationError(f"cannot reach Redis at {redact_url(url)!r}: {e}") from e
    return client


def _pair_key(record: Any) -> Any:
    return record[0]


def _pair_value(record: Any) -> Any:
    return record[1]


class RedisUpsertWriter(SinkWriter[Any]):
    """One task's writes: the last value per key, flushed in one transaction."""

    def __init__(self, info: TaskInfo, sink: RedisUpsertSink) -> None:
        self.info = info
        self.sink = sink
        self._client: redis.Redis | None = None
        self._buffer: dict[str, Any] = {}

    def restore(self, state: list[Any]) -> None:
        """Nothing to recover: the replayed records write their keys again."""
        if self._client is None:
            self._client = redis_client(self.sink.url)

    def write_batch(self, batch: list[Any]) -> None:
        sink = self.sink
        prefix, key_of, value_of = sink.prefix, sink.key, sink.value
        buffer = self._buffer
        for record in batch:
            buffer[prefix + str(key_of(record))] = value_of(record)
        if len(buffer) >= sink.batch_keys:
            self.flush()

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Write everything before the barrier; no state."""
        self.flush()
        return []

    def finish(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Send the buffer in one MULTI/EXEC (all or nothing on the server)."""
        if not self._buffer:
            return
        if self._client is None:
            self._client = redis_client(self.sink.url)
        items, self._buffer = self._buffer, {}
        pipe = self._client.pipeline(transaction=True)
        if self.sink.kind == "hash":
            for key, fields in items.items():
                if not isinstance(fields, dict) or not fields:
                    raise LockgateError(
                        f"RedisUpsertSink (hash): the value for {key!r} is {fields!r:.100}, "
                        "not a non-empty dict of fields")
                if self.sink.replace:
                    pipe.delete(key)
                pipe.hset(key, mapping=fields)
        else:
            for key, value in items.items():
                pipe.set(key, value)
        pipe.execute()

    def close(self) -> None:
        self._buffer = {}
        if self._client is not None:
            self._client.close()
            self._client = None


class RedisUpsertSink(Sink[Any]):
    """Values written by key into Redis at every checkpoint (at least once;
    exactly once for deterministic keyed updates).

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
        kind: ``"string"`` (``SET key value``: the value is str, bytes or a
            number) or ``"hash"`` (``HSET key field value ...``: the value is
            a dict of fields).
        key: the record's key (default: ``record[0]``); the Redis key is
            ``prefix + str(key)``.
        value: the value to write (default: ``record[1]``).
        prefix: prepended to every key.
        replace: (hash) delete the hash before writing its fields, so fields
            a later value lacks do not remain (``DEL`` + ``HSET`` in the
            same transaction).
        batch_keys: flush when this many keys are buffered (and at every
            checkpoint).
        exactly_once: declare that the value written for a key is a function
            of the input up to that record, keyed by the sink's key: the job's
            guarantee is then exactly-once. Leave False otherwise.
    """

    def __init__(self, url: str, *, kind: str = "string",
                 key: Callable[[Any], Any] = _pair_key,
                 value: Callable[[Any], Any] = _pair_value, prefix: str = "",
                 replace: bool = False, batch_keys: int = 5_000,
                 exactly_once: bool = False) -> None:
        if kind not in KINDS:
            raise ConfigurationError(f"RedisUpsertSink: kind {kind!r} is not one of {KINDS}")
        if batch_keys < 1:
            raise ConfigurationError(f"RedisUpsertSink: batch_keys must be >= 1, got {batch_keys}")
        self.url = url
        self.kind = kind
        self.key = key
        self.value = value
        self.prefix = prefix
        self.replace = replace
        self.batch_keys = batch_keys
        self.exactly_once = exactly_once

    def validate(self) -> None:
        """In the driver: the server answers."""
        redis_client(self.url).close()

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        return RedisUpsertWriter(info, self)

    def __repr__(self) -> str:
        return f"RedisUpsertSink({redact_url(self.url)!r}, kind={self.kind!r})"
