"""The protocol decisions of ``MySqlCdcSource``, as pure functions.

- **Coordinates** (:func:`coordinate`): a binlog place ``(file, offset)`` as
  one integer, file number × 2^32 + offset, in the server's binlog order (one
  server's files share a base name and number upwards).
- **Position** (:func:`check_position`): ``[file, offset, index, gtid, txn]``:
  where the transaction read last in part begins (or the next one, when the
  last was read whole), how many of its row changes were read, the server's
  GTID state before it (``""`` when the server has no GTIDs) and that
  transaction's own GTID while ``index`` > 0 (``""`` else). A restore reads
  from that place again (by GTID state where there is one, else by file and
  offset) and skips ``index`` changes of the first transaction.
- **GTID state** (:func:`next_gtid_state`): MariaDB: the last GTID of each
  replication domain (``0-1-57,1-2-9``); MySQL: the executed GTID set
  (``uuid:1-57``).
- **Values** (:func:`snapshot_values`, :func:`stream_values`): the snapshot
  (PyMySQL) and the binlog (mysql-replication) give a few column types in
  different forms; both are brought to one.
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from lockgate.errors import CheckpointCorruptError

__all__ = ["coordinate", "check_position", "next_gtid_state", "KEY_TYPES", "key_type_ok",
           "column_kind", "snapshot_values", "stream_values", "chunk_select", "boundaries_select",
           "truncated_table",
           "quote"]

KEY_TYPES = ("tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "date",
             "datetime", "char", "varchar", "binary", "varbinary")
"""Primary key column types the snapshot can cut into chunks: their order in
Python is the server's (strings only with a binary collation)."""

_BINLOG_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,200}\.([0-9]{1,10})$")
_MARIADB_GTID = re.compile(r"^([0-9]{1,10})-([0-9]{1,10})-([0-9]{1,20})$")
_MYSQL_GTID_SET = re.compile(r"^[0-9a-fA-F\-]{36}(:[0-9]+(-[0-9]+)?)+"
                             r"(,\s*[0-9a-fA-F\-]{36}(:[0-9]+(-[0-9]+)?)+)*$")


def coordinate(file: str, offset: int) -> int:
    """``(mariadb-bin.000012, 4711)`` as ``12 << 32 | 4711``."""
    m = _BINLOG_FILE.match(file)
    if not m or not 0 <= offset < 2**32:
        raise ValueError(f"not a binlog place: {file!r}, {offset!r}")
    return (int(m.group(1)) << 32) | offset


def gtid_state_ok(state: Any) -> bool:
    if state == "":
        return True
    if not isinstance(state, str) or len(state) > 100_000:
        return False
    parts = [p.strip() for p in state.split(",")]
    if all(_MARIADB_GTID.match(p) for p in parts):
        return True
    return bool(_MYSQL_GTID_SET.match(state.replace("\n", "")))


def check_position(value: Any) -> list[Any]:
    """A position read back from a checkpoint (untrusted)."""
    ok = (isinstance(value, list) and len(value) == 5 and isinstance(value[0], str)
          and _BINLOG_FILE.match(value[0]) is not None
          and type(value[1]) is int and 4 <= value[1] < 2**32
          and type(value[2]) is int and 0 <= value[2] < 2**40
          and gtid_state_ok(value[3])
          and isinstance(value[4], str) and (value[4] == "" or gtid_state_ok(value[4])))
    if not ok:
        raise CheckpointCorruptError(
            f"MySQL CDC source: restored position {value!r:.120} is not [binlog file, offset, "
            "index, GTID state, GTID]: restore with the source that wrote the checkpoint")
    return list(value)


def next_gtid_state(state: str, gtid: str) -> str:
    """The GTID state after the transaction ``gtid`` (MariaDB ``d-s-n`` or
    MySQL ``uuid:n``) committed on top of ``state``."""
    m = _MARIADB_GTID.match(gtid)
    if m:
        domains: dict[int, str] = {}
        for part in (p.strip() for p in state.split(",") if p.strip()):
            pm = _MARIADB_GTID.match(part)
            if pm:
                domains[int(pm.group(1))] = part
        domains[int(m.group(1))] = gtid
        return ",".join(domains[d] for d in sorted(domains))
    from pymysqlreplication.gtid import Gtid, GtidSet

    return str(GtidSet(state.replace("\n", "") or None) + Gtid(gtid))


def key_type_ok(data_type: str, collation: str | None) -> bool:
    """A primary key column of this type (information_schema's
    ``DATA_TYPE``, ``COLLATION_NAME``) orders in Python as on the server."""
    if data_type not in KEY_TYPES:
        return False
    if data_type in ("char", "varchar"):
        return collation is not None and (collation == "binary" or collation.endswith("_bin"))
    return True


def column_kind(data_type: str, column_type: str, octet_length: int | None) -> str | None:
    """How a column's values are brought to one form (see
    :func:`snapshot_values`); None: as the drivers give them."""
    if data_type in ("bit", "set", "uuid", "inet6", "inet4", "json"):
        return data_type
    if data_type == "binary" and octet_length:
        return f"binary:{int(octet_length)}"
    return None


def snapshot_values(row: dict[str, Any], kinds: Mapping[str, str | None]) -> dict[str, Any]:
    """A row as PyMySQL reads it, in the common form: BIT as ``int``, SET
    as a ``set`` of ``str``, MySQL's JSON parsed; everything else as it is."""
    for name, kind in kinds.items():
        v = row.get(name)
        if v is None or kind is None:
            continue
        if kind == "bit" and isinstance(v, bytes | bytearray):
            row[name] = int.from_bytes(v, "big")
        elif kind == "set" and isinstance(v, str):
            row[name] = set(v.split(",")) if v else set()
        elif kind == "json" and isinstance(v, str | bytes):
            row[name] = json.loads(v)
    return row


def _plain_json(v: Any) -> Any:
    """mysql-replication's decoding of MySQL's binary JSON (keys and
    strings as bytes) as ``json.loads`` gives it."""
    if isinstance(v, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _plain_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_json(x) for x in v]
    return v.decode() if isinstance(v, bytes) else v


def stream_values(row: dict[str, Any], kinds: Mapping[str, str | None]) -> dict[str, Any]:
    """A row as mysql-replication decodes it, in the common form: BIT as
    ``int``, BINARY(n) padded to n bytes (the binlog drops trailing zero
    bytes), UUID and INET6 as their text, MySQL's JSON as parsed values."""
    for name, kind in kinds.items():
        v = row.get(name)
        if v is None or kind is None:
            continue
        if kind == "bit" and isinstance(v, str):
            row[name] = int(v, 2) if v else 0
        elif kind.startswith("binary:") and isinstance(v, bytes):
            row[name] = v.ljust(int(kind[7:]), b"\0")
        elif kind == "uuid" and isinstance(v, bytes) and len(v) <= 16:
            row[name] = str(uuid.UUID(bytes=v.ljust(16, b"\0")))  # trailing zeros not logged
        elif kind == "inet6" and isinstance(v, bytes) and len(v) <= 16:
            row[name] = str(ipaddress.IPv6Address(v.ljust(16, b"\0")))
        elif kind == "inet4" and isinstance(v, bytes) and len(v) <= 4:
            row[name] = str(ipaddress.IPv4Address(v.ljust(4, b"\0")))
        elif kind == "set" and isinstance(v, str):
            row[name] = set(v.split(",")) if v else set()
        elif kind == "json":
            row[name] = _plain_json(v)
    return row


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _beyond(key: Sequence[str], bound: Sequence[Any], op: str) -> tuple[str, list[Any]]:
    """``(a, b) > (x, y)`` (``op`` ``>``; ``<=`` likewise) spelled ``a > x OR
    (a = x AND b > y)``, which every version's optimizer turns into a range
    of the primary key."""
    strict = op.rstrip("=")
    terms, params = [], []
    for i in range(len(key)):
        last = i == len(key) - 1
        eq = [f"{quote(k)} = %s" for k in key[:i]]
        terms.append("(" + " AND ".join([*eq, f"{quote(key[i])} {op if last else strict} %s"])
                     + ")")
        params += list(bound[:i + 1])
    return "(" + " OR ".join(terms) + ")", params


def chunk_select(db: str, table: str, columns: Sequence[str], key: Sequence[str],
                 lower: Sequence[Any] | None, upper: Sequence[Any] | None
                 ) -> tuple[str, list[Any]]:
    """The SELECT of the chunk of keys in ``(lower, upper]`` (``None``:
    unbounded), in key order."""
    conds, params = [], []
    for bound, op in ((lower, ">"), (upper, "<=")):
        if bound is not None:
            cond, values = _beyond(key, bound, op)
            conds.append(cond)
            params += values
    sql = (f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(db)}.{quote(table)}"
           + (" WHERE " + " AND ".join(conds) if conds else "")
           + f" ORDER BY {', '.join(quote(k) for k in key)}")
    return sql, params


def boundaries_select(db: str, table: str, key: Sequence[str], chunk_rows: int) -> str:
    """The keys that cut a table into chunks of ``chunk_rows`` rows as it is
    now: every ``chunk_rows``-th key in key order (one scan of the key)."""
    cols = ", ".join(quote(k) for k in key)
    return (f"SELECT {cols} FROM (SELECT {cols}, ROW_NUMBER() OVER (ORDER BY {cols}) AS "
            f"lockgate_chunk_row_ FROM {quote(db)}.{quote(table)}) AS s WHERE "
            f"s.lockgate_chunk_row_ % {int(chunk_rows)} = 0 ORDER BY s.lockgate_chunk_row_")


_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?((?:`[^`]+`|\w+)(?:\s*\.\s*(?:`[^`]+`|\w+))?)",
                       re.IGNORECASE)


def truncated_table(query: str, default_db: str) -> str | None:
    """``db.name`` of the table a ``TRUNCATE`` statement empties, else None."""
    m = _TRUNCATE.match(query)
    if not m:
        return None
    parts = [p.strip().strip("`") for p in m.group(1).split(".")]
    return ".".join(parts) if len(parts) == 2 else f"{default_db}.{parts[0]}"
