"""What the change data capture sources share (``PostgresCdcSource``,
``MySqlCdcSource``): the record (:class:`ChangeEvent`), one row change of a
log (:class:`Change`), and the decision between a snapshot chunk and the
stream (:func:`emit_change`): a change of key ``k`` is emitted iff its
transaction is at or after the high watermark of the chunk that holds
``k`` (the chunk holds every change before it). The chunks as splits and
the hand-over to the stream: :mod:`lockgate.connectors.cdc_splits`.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from lockgate.errors import LockgateError

__all__ = ["ChangeEvent", "Change", "Key", "key_of", "in_range", "chunk_high", "emit_change",
           "take_chunk", "take_buffered"]

Key = tuple[Any, ...]
"""A row's primary key values, in the key's column order."""


class ChangeEvent(NamedTuple):
    """One change: ``op`` is ``read`` (a snapshot row), ``insert``, ``update``,
    ``delete`` or ``truncate``; ``table`` is ``schema.name`` (MySQL:
    ``database.name``); ``before`` / ``after`` the row (PostgreSQL: ``before``
    of an update only with ``REPLICA IDENTITY FULL`` or a changed key);
    ``lsn`` the log position of the change's transaction (PostgreSQL: its
    commit LSN; MySQL: its binlog coordinate, file number × 2^32 + offset of
    its end; a read: its chunk's high watermark); ``commit_ms`` the commit
    time in ms since the Unix epoch (a read: when its chunk was read), usable
    as event time."""

    op: str
    table: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    lsn: int
    commit_ms: int

    @property
    def row(self) -> dict[str, Any] | None:
        """The row as it is after the change (``before`` for a delete)."""
        return self.after if self.after is not None else self.before


@dataclass
class Change:
    """One row change of a log: ``op`` is ``insert``, ``update``, ``delete``
    or ``truncate``; or ``message`` (a PostgreSQL logical decoding message:
    ``after`` is ``{"prefix", "content"}``, ``table`` empty)."""

    op: str
    table: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    key_columns: list[str]


def key_of(row: dict[str, Any] | None, key: Sequence[str]) -> Key | None:
    if row is None:
        return None
    try:
        return tuple([row[k] for k in key])
    except KeyError:  # a key column the log did not carry
        return None


def in_range(k: Key | None, lower: Key | None, upper: Key | None) -> bool:
    return (k is not None and (lower is None or k > lower)
            and (upper is None or k <= upper))


def chunk_high(chunks: list[list[Any]], k: Key | None) -> int:
    """The high watermark of the chunk holding ``k``: ``chunks`` are a
    table's ``[upper, high]`` in key order, the last one's upper ``None``."""
    if k is None:
        return int(max(c[1] for c in chunks))
    at = bisect.bisect_left(chunks, k, hi=len(chunks) - 1, key=lambda c: tuple(c[0]))
    return int(chunks[at][1])


def emit_change(change: Change, position: int, chunks: dict[str, list[list[Any]]]
                ) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """What of ``change`` (of a transaction at log ``position``) the stream
    emits: ``[(op, before, after)]`` (empty: a snapshot chunk holds it
    already). An update that moves a row from one chunk to another may come
    out as its delete or insert half alone. A truncate between the chunks'
    watermarks (some chunks hold the rows from before it, some not: no event
    can say that) fails."""
    table = chunks.get(change.table)
    if not table:
        return []
    if change.op == "truncate":
        if position >= chunk_high(table, None):
            return [("truncate", None, None)]
        if position >= min(c[1] for c in table):
            raise LockgateError(
                f"CDC source: table {change.table!r} was truncated while its snapshot was "
                "read, after some of its chunks were: start the job fresh (a new snapshot)")
        return []
    if len(table) == 1:  # one chunk (no snapshot, or the stream is past it): no key decides
        return [(change.op, change.before, change.after)] if position >= table[0][1] else []
    old = key_of(change.before, change.key_columns)
    new = key_of(change.after, change.key_columns)
    if change.op == "update" and old is not None and old != new:
        old_ok = position >= chunk_high(table, old)
        new_ok = position >= chunk_high(table, new)
        if old_ok and new_ok:
            return [("update", change.before, change.after)]
        if old_ok:
            return [("delete", change.before, None)]
        return [("insert", None, change.after)] if new_ok else []
    k = new if change.after is not None else old
    if position >= chunk_high(table, k):
        return [(change.op, change.before, change.after)]
    return []


def take_chunk(todo: deque[dict[str, Any]], done: list[dict[str, Any]], max_records: int,
               read: Callable[[dict[str, Any]], None]) -> list[ChangeEvent]:
    """Up to ``max_records`` reads of the first chunk of ``todo`` (a
    :mod:`~lockgate.connectors.cdc_splits` chunk entry; unread: ``read``
    fills its ``rows``, ``hw`` and ``ms`` first), taken from its rows; a
    chunk with no rows left moves to ``done``."""
    chunk = todo[0]
    if chunk["hw"] is None:
        read(chunk)
    rows = chunk["rows"]
    take, chunk["rows"] = rows[:max_records], rows[max_records:]
    if not chunk["rows"]:
        done.append(todo.popleft())
    return [ChangeEvent("read", chunk["table"], None, row, chunk["hw"], chunk["ms"])
            for row in take]


def take_buffered(buffer: deque[tuple[ChangeEvent | None, Any]], stream: dict[str, Any],
                  max_records: int, stopped: bool) -> list[ChangeEvent]:
    """Up to ``max_records`` events of the stream's ``buffer`` (``(event or
    None, position after it)``; None: a change that moves the position
    only), the stream entry's position moved past them; ``ended`` once the
    buffer is empty after the stop marker was read (kept in the checkpoint:
    a restore ends too)."""
    out: list[ChangeEvent] = []
    while buffer and len(out) < max_records:
        event, pos = buffer.popleft()
        stream["pos"] = pos
        if event is not None:
            out.append(event)
    if stopped and not buffer:
        stream["ended"] = True
    return out
