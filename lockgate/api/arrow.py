"""The Arrow path: streams whose elements are ``pyarrow.RecordBatch`` es.

A source that holds columnar data (Parquet files, a Spark DataFrame) gives an
:class:`~lockgate.api.stream.ArrowStream` (``Pipeline.source_arrow``); its operators take and
return whole record batches, so no record becomes a Python object::

    import pyarrow.compute as pc

    (p.source_arrow(FileSource("in/", format="parquet"), uid="numbers")
       .map_arrow(lambda b: b.append_column("k", pc.remainder(b["x"], 1000)), uid="keys")
       .key_by_column("k")
       .aggregate_arrow(total=("x", "sum"), n=("x", "count"), uid="sums")
       .sink(FileSink("out/", format="parquet"), uid="out"))

``aggregate_arrow`` keeps one accumulator per key in the same keyed state as
``reduce`` (one tuple per key, by key group: checkpoints, savepoints,
rescaling, ``read_state``), computes each batch's partial aggregates with
Arrow's group-by, merges them into the state and emits, per input batch, one
row per key that batch touched: the key's updated aggregates. Rows go from
one task to the next as Arrow IPC frames, routed by the key group of each
row's key (the very key group the row path gives the same key). docs/arrow.md.

This module describes the steps (plain picklable objects) that
:class:`~lockgate.api.stream.ArrowStream` adds; the runtime runs them
(``lockgate/runtime/arrow_ops.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["AGGREGATIONS", "ArrowStep", "ArrowAggregate", "ColumnKey", "to_arrow_step"]

AGGREGATIONS = ("sum", "count", "min", "max", "mean")
"""What ``aggregate_arrow`` computes per key: Arrow's hash aggregations of the
same names. Nulls are skipped (``count`` counts non-null values); the sum,
min, max or mean of a key that has only seen nulls is null."""


@dataclass(frozen=True)
class ArrowStep:
    """A stateless step on record batches: ``map`` (fn: batch -> batch),
    ``filter`` (fn: batch -> boolean mask), ``to_rows`` (batch -> dicts) or
    ``to_arrow`` (dicts -> batch of ``schema``)."""

    op: str
    fn: Callable[[Any], Any] | None = None
    schema: Any = None

    @property
    def __name__(self) -> str:  # the node's name in the job graph
        return f"{self.op}_arrow" if self.op in ("map", "filter") else self.op


@dataclass(frozen=True)
class ColumnKey:
    """The key of a keyed Arrow stream: a column. Called on a row (a dict) it
    is that row's value of the column, the key ``to_rows()`` would give."""

    column: str

    def __call__(self, row: Any) -> Any:
        return row[self.column]


@dataclass(frozen=True)
class ArrowAggregate:
    """``aggregate_arrow``'s plan: output name, input column and aggregation
    of each output column, in order."""

    key: str
    outputs: tuple[tuple[str, str, str], ...]

    __name__ = "aggregate_arrow"


def to_arrow_step(schema: Any = None) -> ArrowStep:
    """The step of ``DataStream.to_arrow``: dict rows into one batch per
    input batch (``RecordBatch.from_pylist``, with ``schema`` if given; rows
    that are not dicts become a column ``value``)."""
    return ArrowStep("to_arrow", None, schema)
