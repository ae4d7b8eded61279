"""How a file sink's records become file bytes: JSON lines or Parquet.

A :class:`RecordFormat` either encodes every batch as it arrives (streaming:
JSON lines) or writes the whole file at pre-commit (buffered: Parquet).
"""

from __future__ import annotations

import functools
import json
from typing import IO, Any

import orjson

from lockgate.errors import LockgateError

__all__ = ["RecordFormat", "JsonlFormat", "ParquetFormat"]


class RecordFormat:
    """How records become file bytes. Streaming formats encode every batch as it
    arrives (one ``write`` call per batch); buffered formats (Parquet) keep the
    records and write the whole file at pre-commit."""

    ext: str = ""
    streaming: bool = True

    def encode_batch(self, batch: list[Any]) -> bytes:
        """Bytes of ``batch`` (streaming formats)."""
        raise NotImplementedError

    def write_file(self, f: IO[bytes], records: list[Any]) -> None:
        """Write all ``records`` into ``f`` (buffered formats)."""
        raise NotImplementedError

    def write_batches(self, f: IO[bytes], batches: list[Any], records: list[Any]) -> None:
        """Write ``pyarrow.RecordBatch`` es (and any ``records``) into ``f``
        (buffered formats)."""
        raise NotImplementedError


class JsonlFormat(RecordFormat):
    """One compact JSON document per line."""

    ext = "jsonl"
    streaming = True

    def __init__(self) -> None:
        """Precompile the encoders (this is the hot path)."""
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def encode_batch(self, batch: list[Any]) -> bytes:
        """``batch`` as newline-terminated JSON lines: orjson (a C encoder, about
        ten times faster than ``json``; NaN and infinities become ``null``),
        falling back to ``json`` for what orjson refuses (integers beyond 64 bits)."""
        try:
            return _encode_flat(batch) or b"\n".join(map(_orjson_dumps, batch)) + b"\n"
        except (TypeError, ValueError):
            pass
        try:
            text = "\n".join(map(self._encode, batch))
        except (TypeError, ValueError) as e:
            raise LockgateError(
                f"file sink (jsonl): a record cannot be written as JSON ({e}); map records "
                "to dicts/lists of str, int, float, bool and None before the sink"
            ) from e
        return (text + "\n").encode("utf-8")


_orjson_dumps = functools.partial(orjson.dumps, option=orjson.OPT_NON_STR_KEYS)


def _encode_flat(batch: list[Any]) -> bytes | None:
    """JSON lines of a batch of numbers, booleans and nulls, or of flat rows
    (tuples/lists) of them, with ONE encoder call for the whole batch. The
    encoded array is split into lines only when it provably has that shape:
    no string or object anywhere, and either no bracket inside (scalars) or
    exactly one ``[`` per record and ``],[`` between records (flat rows).
    ``None`` when the batch has another shape."""
    if not batch:
        return None
    inner = orjson.dumps(batch)[1:-1]
    if b'"' in inner or b"{" in inner:
        return None
    if b"[" not in inner:
        return inner.replace(b",", b"\n") + b"\n"
    n = len(batch)
    if inner.count(b"[") == n and inner.count(b"],[") == n - 1:
        return inner.replace(b"],[", b"]\n[") + b"\n"
    return None


class ParquetFormat(RecordFormat):
    """A Parquet file per transaction, written with pyarrow at pre-commit.
    Dict records become columns; any other records become one column ``value``."""

    ext = "parquet"
    streaming = False

    def write_file(self, f: IO[bytes], records: list[Any]) -> None:
        """Write ``records`` as one Parquet table into ``f``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if all(isinstance(r, dict) for r in records):
                table = pa.Table.from_pylist(records)
            else:
                table = pa.table({"value": records})
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise LockgateError(
                f"file sink (parquet): the records cannot form an Arrow table ({e}); emit "
                "dicts with the same keys and consistently typed values"
            ) from e
        pq.write_table(table, f)

    def write_batches(self, f: IO[bytes], batches: list[Any], records: list[Any]) -> None:
        """The batches as one Parquet table, no row made (batches of different
        schemas are unified); with records too, everything as rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if records:
            self.write_file(f, records + [r for b in batches for r in b.to_pylist()])
            return
        try:
            table = pa.Table.from_batches(batches)
        except pa.ArrowInvalid:
            table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                                     promote_options="permissive")
        pq.write_table(table, f)
