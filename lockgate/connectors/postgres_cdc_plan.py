"""The protocol decisions of ``PostgresCdcSource``, as pure functions.

- **Visibility** (:class:`Snapshot`): a chunk is read in a REPEATABLE READ
  transaction whose snapshot (``pg_current_snapshot()``) says which
  transactions it saw. The high watermark is a log position taken after
  the SELECT. The committed transactions the SELECT did not see but that
  commit before the high watermark are merged into the chunk's rows
  (:func:`merge_chunk`); the ones that commit at or after it are the
  stream's. So every change is in the chunk or in the stream, never both.
- **Stream filter** (:func:`emit_change`): a change of key ``k`` is emitted
  iff its transaction commits at or after the high watermark of the chunk
  that holds ``k``.
- **Position** (:func:`after_position`): ``[final_lsn, index, end_lsn]``:
  the commit LSN of the transaction read last, how many of its changes were
  read, and its end LSN once all were (0 before). The replication slot may
  advance to :func:`slot_target` of a completed checkpoint's position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lockgate.connectors.cdc import Key, chunk_high, emit_change, in_range, key_of
from lockgate.connectors.pgoutput import Transaction
from lockgate.errors import CheckpointCorruptError

__all__ = ["Snapshot", "key_of", "merge_chunk", "chunk_high", "emit_change", "after_position",
           "skip", "slot_target", "check_position"]


@dataclass(frozen=True)
class Snapshot:
    """``pg_current_snapshot()``: full (64-bit) transaction ids."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def full(self, xid32: int) -> int:
        """A 32-bit xid (as the log carries it) widened with the epoch of
        ``xmax`` (the xid is at most 2^31 old)."""
        epoch, low = self.xmax >> 32, self.xmax & 0xFFFFFFFF
        if xid32 > low and epoch > 0 and xid32 - low > 0x7FFFFFFF:
            epoch -= 1
        return (epoch << 32) | xid32

    def sees(self, xid32: int) -> bool:
        xid = self.full(xid32)
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)


def merge_chunk(rows: dict[Key, dict[str, Any]], txns: Sequence[Transaction],
                snapshot: Snapshot, high: int, table: str, key: Sequence[str],
                lower: Key | None, upper: Key | None) -> dict[Key, dict[str, Any]]:
    """The chunk's rows as of ``high``: the SELECT's ``rows`` (by key), with
    the changes of ``table`` in ``(lower, upper]`` of every transaction that
    committed before ``high`` and that ``snapshot`` did not see applied in
    commit order."""
    out = dict(rows)
    for txn in txns:
        if txn.final_lsn >= high or snapshot.sees(txn.xid):
            continue
        for c in txn.changes:
            if c.table != table:
                continue
            if c.op == "truncate":
                out.clear()
                continue
            old, new = key_of(c.before, key), key_of(c.after, key)
            if c.op == "delete" or (old is not None and old != new):
                if in_range(old, lower, upper):
                    out.pop(old, None)
            if c.after is not None and in_range(new, lower, upper):
                out[new] = dict(c.after)
    return out


def skip(position: Sequence[int], txn: Transaction) -> int:
    """How many of ``txn``'s changes are at or before ``position`` (read already)."""
    final, index, end = position
    if txn.final_lsn < final or (txn.final_lsn == final and end):
        return len(txn.changes)
    if txn.final_lsn == final:
        return min(index, len(txn.changes))
    return 0


def after_position(txn: Transaction, index: int) -> list[int]:
    """The position after the first ``index`` changes of ``txn``."""
    return [txn.final_lsn, index, txn.end_lsn if index >= len(txn.changes) else 0]


def slot_target(position: Sequence[int]) -> int:
    """Where the slot may advance to: past a transaction read whole, to the
    start of one read in part (the slot then decodes it again)."""
    final, _index, end = position
    return end if end else final


def check_position(value: Any) -> list[int]:
    """A position read back from a checkpoint (untrusted)."""
    if (not isinstance(value, (list, tuple)) or len(value) != 3
            or not all(type(v) is int and 0 <= v < 2**64 for v in value)):
        raise CheckpointCorruptError(
            f"PostgreSQL CDC source: restored position {value!r:.80} is not "
            "[commit LSN, index, end LSN]: restore with the source that wrote the checkpoint")
    return list(value)
