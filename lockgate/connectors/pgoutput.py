"""A decoder of PostgreSQL's ``pgoutput`` logical replication messages
(protocol version 1), as ``pg_logical_slot_peek_binary_changes`` returns
them: pure functions, no I/O.

``decode_transactions`` turns the rows of one peek into whole transactions
(commit order), each with its changes in order; columns come back as
Python values from their text form: integers, floats, booleans and text as
such, every other type as PostgreSQL's text form (``numeric``, dates, JSON:
``str``), NULL as ``None``. Relation messages update the column lists, so a
column added while the job runs is carried in the next changes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lockgate.connectors.cdc import Change
from lockgate.errors import LockgateError

__all__ = ["Relation", "Change", "Transaction", "decode_transactions", "decode_message",
           "parse_value", "native", "PG_EPOCH_MS", "format_lsn", "parse_lsn"]

PG_EPOCH_MS = 946_684_800_000
"""2000-01-01 in milliseconds since the Unix epoch (PostgreSQL's timestamp zero)."""

_INTS = {20, 21, 23, 26}  # int8, int2, int4, oid
_FLOATS = {700, 701}
_BOOL = 16


def parse_value(type_oid: int, text: str | None) -> Any:
    """One column's text form as a Python value (see the module doc)."""
    if text is None:
        return None
    if type_oid in _INTS:
        return int(text)
    if type_oid in _FLOATS:
        return float(text)
    if type_oid == _BOOL:
        return text == "t"
    return text


def native(type_oid: int) -> bool:
    """Whether a column of type ``type_oid`` becomes a Python value of its
    own (integer, float, boolean), not its text form."""
    return type_oid in _INTS or type_oid in _FLOATS or type_oid == _BOOL


def _bool(text: bytes) -> bool:
    return text == b"t"


def _parser(type_oid: int) -> Callable[[bytes], Any]:
    """:func:`parse_value` of a column's text form as the log sends it (UTF-8)."""
    if type_oid in _INTS:
        return int  # int() and float() read ASCII digits from bytes as from str
    if type_oid in _FLOATS:
        return float
    if type_oid == _BOOL:
        return _bool
    return bytes.decode


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` as PostgreSQL writes it: ``0/16B3748``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass
class Relation:
    """A table as the last relation message described it."""

    relid: int
    schema: str
    name: str
    columns: list[str]
    types: list[int]
    key: list[str]
    table: str = field(init=False)
    """``schema.name``."""
    parsers: list[Callable[[bytes], Any]] = field(init=False, repr=False, compare=False)
    """Per column, its value from its text form."""

    def __post_init__(self) -> None:
        self.table = f"{self.schema}.{self.name}"
        self.parsers = [_parser(t) for t in self.types]


@dataclass
class Transaction:
    """A committed transaction: ``final_lsn`` is its commit record's LSN (the
    commit order), ``end_lsn`` the end of it; ``commit_ms`` the commit time."""

    xid: int
    final_lsn: int
    commit_ms: int
    end_lsn: int = 0
    changes: list[Change] = field(default_factory=list)


_STRUCTS: dict[str, struct.Struct] = {}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        st = _STRUCTS.get(fmt)
        if st is None:
            st = _STRUCTS[fmt] = struct.Struct(fmt)
        try:
            value = st.unpack_from(self.data, self.at)
        except struct.error as e:
            raise LockgateError("pgoutput: a message is cut short (a server or plugin "
                                "this decoder does not know?)") from e
        self.at += st.size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise IndexError(self.at)
        text = self.data[self.at:end].decode()
        self.at = end + 1
        return text

    def raw(self, n: int) -> bytes:
        out = self.data[self.at:self.at + n]
        self.at += n
        return out


_I16 = struct.Struct("!h").unpack_from
_I32 = struct.Struct("!i").unpack_from
_NULL, _UNCHANGED, _TEXT, _BINARY = b"nutb"


def _tuple(r: _Reader, rel: Relation) -> dict[str, Any] | None:
    """A TupleData as ``{column: value}``; an unchanged TOASTed value is left
    out (the server did not send it)."""
    data = r.data
    try:
        n = _I16(data, r.at)[0]
        at = r.at + 2
        row: dict[str, Any] = {}
        columns, parsers = rel.columns, rel.parsers
        if n > len(columns):  # more columns than the relation message named
            columns = columns + [f"col{i}" for i in range(len(columns), n)]
            parsers = parsers + [bytes.decode] * (n - len(parsers))
        size = len(data)
        for i in range(n):
            kind = data[at]
            at += 1
            if kind == _TEXT or kind == _BINARY:
                end = at + 4 + _I32(data, at)[0]
                if end > size:
                    raise IndexError(end)
                row[columns[i]] = parsers[i](data[at + 4:end])
                at = end
            elif kind == _NULL:
                row[columns[i]] = None
            elif kind != _UNCHANGED:
                raise LockgateError(f"pgoutput: unknown column kind {bytes([kind])!r}")
    except (struct.error, IndexError) as e:
        raise LockgateError("pgoutput: a message is cut short (a server or plugin "
                            "this decoder does not know?)") from e
    r.at = at
    return row


_OPS = {ord("I"): "insert", ord("U"): "update", ord("D"): "delete"}
_CHANGES = frozenset(b"IUDTM")


_B, _C, _R, _I, _U, _D, _T, _M, _K, _O = b"BCRIUDTMKO"
_BEGIN = struct.Struct("!qqI").unpack_from
_COMMIT = struct.Struct("!bqqq").unpack_from
_RELID = struct.Struct("!I").unpack_from


def decode_transactions(messages: list[bytes], relations: dict[int, Relation],
                        read_up_to: tuple[int, bool] = (0, False),
                        wanted: Callable[[int, int], bool] | None = None
                        ) -> list[Transaction]:
    """The whole transactions in ``messages`` (rows of one peek, in order);
    a transaction cut off at the end (no commit yet) is left out.
    ``relations`` is updated from the relation messages met.
    ``read_up_to``: ``(commit LSN, whole)``: transactions committed before it
    (or at it, if ``whole``) were read already; their changes are not decoded
    and they are left out. ``wanted(xid, commit LSN)``: False leaves a
    transaction out the same way."""
    done: list[Transaction] = []
    current: Transaction | None = None
    skipping = False
    up_to, whole = read_up_to
    ops = _OPS
    for data in messages:
        if not data:
            continue
        tag = data[0]
        if skipping and tag in _CHANGES:
            continue
        try:
            if tag == _I and current is not None:  # the common case, inline
                rel = relations.get(_RELID(data, 1)[0])
                if rel is not None and data[5] == ord("N"):
                    r = _Reader(data)
                    r.at = 6
                    current.changes.append(Change("insert", rel.table, None, _tuple(r, rel),
                                                  rel.key))
                    continue
            r = _Reader(data)
            r.at = 1
            if tag == _B:
                final_lsn, ts, xid = _BEGIN(data, 1)
                skipping = (final_lsn < up_to or (whole and final_lsn == up_to)
                            or (wanted is not None and not wanted(xid, final_lsn)))
                current = Transaction(xid, final_lsn, ts // 1000 + PG_EPOCH_MS)
            elif tag == _C:
                _flags, _commit_lsn, end_lsn, _ts = _COMMIT(data, 1)
                if current is not None and not skipping:
                    current.end_lsn = end_lsn
                    done.append(current)
                current = None
                skipping = False
            elif tag == _R:
                relid = r.take("!I")
                schema, name = r.string(), r.string()
                _identity, ncols = r.take("!bh")
                cols, types, key = [], [], []
                for _ in range(ncols):
                    flags = r.take("!b")
                    col = r.string()
                    type_oid, _typmod = r.take("!Ii")
                    cols.append(col)
                    types.append(type_oid)
                    if flags & 1:
                        key.append(col)
                relations[relid] = Relation(relid, schema or "public", name, cols, types, key)
            elif tag in ops:
                relid = r.take("!I")
                rel = relations.get(relid)
                if rel is None or current is None:
                    raise LockgateError(f"pgoutput: a change of relation {relid} came before "
                                        "its relation message or outside a transaction")
                before = after = None
                kind = data[r.at]
                r.at += 1
                if tag != _I and kind in (_K, _O):
                    before = _tuple(r, rel)
                    if tag == _U:
                        kind = data[r.at]
                        r.at += 1
                if tag != _D:
                    after = _tuple(r, rel)
                current.changes.append(Change(ops[tag], rel.table, before, after, rel.key))
            elif tag == _T:
                nrels, _options = r.take("!ib")
                if current is not None:
                    for _ in range(nrels):
                        rel = relations.get(r.take("!I"))
                        if rel is not None:
                            current.changes.append(Change("truncate", rel.table, None, None,
                                                          rel.key))
            elif tag == _M:
                _flags, _lsn = r.take("!bq")
                prefix = r.string()
                content = r.raw(r.take("!i")).decode(errors="replace")
                if current is not None:
                    current.changes.append(Change("message", "", None,
                                                  {"prefix": prefix, "content": content}, []))
            # 'O' (origin), 'Y' (type): nothing to carry
        except (struct.error, IndexError) as e:
            raise LockgateError("pgoutput: a message is cut short (a server or plugin "
                                "this decoder does not know?)") from e
    return done


def decode_message(data: bytes) -> tuple[str, str] | None:
    """``(prefix, content)`` of a logical decoding message (``M``); None for
    any other message."""
    if bytes(data[:1]) != b"M":
        return None
    r = _Reader(bytes(data))
    r.at = 1
    _flags, _lsn = r.take("!bq")
    try:
        prefix = r.string()
    except IndexError as e:
        raise LockgateError("pgoutput: a message is cut short") from e
    return prefix, r.raw(r.take("!i")).decode(errors="replace")
