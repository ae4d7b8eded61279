"""A consumer's messages as records, in bulk.

``Consumer.consume`` returns a list of message objects. Reading them one at a
time in a Python loop (eight method calls, a test and a tuple per record)
cost more than the client's own fetch. Here each field is read for the
whole list at once (``map`` of the message type's method: C code does the
per-record work), the records are built the same way, and the list is cut
into runs of one partition (:class:`Chunk`), each with its records'
offsets. A value format (``KafkaSource(value_format=...)``) decodes the
values of a list at once and makes the records the values themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from lockgate.errors import ConfigurationError

__all__ = ["KafkaRecord", "Chunk", "VALUE_FORMATS", "check_value_format", "chunks"]


class KafkaRecord(NamedTuple):
    """One record read from Kafka (immutable; a named tuple, so that a batch of
    them is built at the client's speed)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    """Milliseconds since the epoch, as the broker returned it (create or log
    append time, by the topic's ``message.timestamp.type``)."""
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


_new_record = partial(tuple.__new__, KafkaRecord)
_second = itemgetter(1)

VALUE_FORMATS: dict[str, Callable[[Any], Any] | None] = {
    "bytes": None,
    "str": bytes.decode,
    "int": int,
    "float": float,
    "json": json.loads,
}
"""``KafkaSource(value_format=...)``: what each record is, decoded from the
value (``"bytes"``: the value as it is, ``None`` for a tombstone; ``"str"``:
UTF-8 text; ``"int"``, ``"float"``: a number written as text; ``"json"``:
one JSON document)."""


def check_value_format(value_format: str | None) -> None:
    if value_format is not None and value_format not in VALUE_FORMATS:
        raise ValueError(
            f"value_format must be None (KafkaRecord) or one of {sorted(VALUE_FORMATS)}, "
            f"not {value_format!r}")


class Chunk(NamedTuple):
    """Records of one partition, in offset order, and their offsets."""

    records: list[Any]
    offsets: list[int]


def chunks(message_type: Any, messages: list[Any], topics: list[str],
           value_format: str | None, what: str) -> list[tuple[tuple[str, int], Chunk]]:
    """``messages`` (none of them an error or event) as ``((topic,
    partition), chunk)`` runs, in the order they came. ``topics`` are the
    source's: with one, no message is asked for its topic."""
    m = message_type
    partitions = list(map(m.partition, messages))
    names: list[str] | None = list(map(m.topic, messages)) if len(topics) > 1 else None
    offsets = list(map(m.offset, messages))
    values = list(map(m.value, messages))
    if value_format is None:
        headers: Any = list(map(m.headers, messages))
        if any(headers):
            headers = [tuple(h) if h else () for h in headers]
        else:
            headers = repeat((), len(messages))
        records = list(map(_new_record, zip(
            names or repeat(topics[0], len(messages)), partitions, offsets,
            map(_second, map(m.timestamp, messages)), map(m.key, messages), values, headers,
            strict=True)))
    else:
        records = _decode(values, value_format, partitions, offsets, names, topics[0], what)
    keys: list[Any] = partitions if names is None else list(zip(names, partitions, strict=True))
    runs = [(k, len(list(run))) for k, run in groupby(keys)]
    if names is None:
        runs = [((topics[0], p), n) for p, n in runs]
    if len(runs) == 1:
        return [(runs[0][0], Chunk(records, offsets))]
    out = []
    start = 0
    for split, n in runs:
        end = start + n
        out.append((split, Chunk(records[start:end], offsets[start:end])))
        start = end
    return out


def _decode(values: list[Any], value_format: str, partitions: list[int], offsets: list[int],
            names: list[str] | None, topic: str, what: str) -> list[Any]:
    decode = VALUE_FORMATS[value_format]
    if decode is None:
        return values
    try:
        return list(map(decode, values))
    except (ValueError, TypeError, UnicodeDecodeError):
        pass
    for i, value in enumerate(values):  # the first value that does not decode, named
        try:
            decode(value)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            if names is not None:
                topic = names[i]
            shown = repr(value if value is None or len(value) <= 100 else value[:100] + b"...")
            raise ConfigurationError(
                f"{what}: the value of the record at offset {offsets[i]} of partition "
                f"{partitions[i]} of topic {topic!r} is not {value_format!r} ({shown}: {e}); "
                "read the topic with value_format=None (records are KafkaRecords) or "
                "'bytes' and decode its values in a map") from e
    raise AssertionError("a value failed to decode, then decoded")  # pragma: no cover
