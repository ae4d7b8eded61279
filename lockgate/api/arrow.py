"""The Arrow path: streams whose elements are ``pyarrow.RecordBatch`` es.

A source that holds columnar data (Parquet files, a Spark DataFrame) gives an
:class:`ArrowStream` (``Pipeline.source_arrow``); its operators take and
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

This module only describes the steps (plain picklable objects); the runtime
runs them (``lockgate/runtime/arrow_ops.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.api.nodes import Node, StreamGraph, add_node
from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.connectors.base import Sink
from lockgate.errors import PipelineDefinitionError

if TYPE_CHECKING:
    from lockgate.api.pipeline import DataStream

__all__ = ["AGGREGATIONS", "ArrowStream", "KeyedArrowStream", "ArrowStep", "ArrowAggregate",
           "ColumnKey"]

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


class ArrowStream:
    """A stream of ``pyarrow.RecordBatch`` es (see the module docstring)."""

    def __init__(self, pipeline: StreamGraph, node: Node,
                 partitioning: Partitioning = Partitioning.FORWARD) -> None:
        self._p = pipeline
        self._node = node
        self._partitioning = partitioning

    def _then(self, kind: OperatorKind, fn: Any, uid: str | None, parallelism: int | None,
              partitioning: Partitioning | None = None, key: ColumnKey | None = None) -> Node:
        if self._node.kind == OperatorKind.SINK:
            raise PipelineDefinitionError("a sink has no output stream")
        part = partitioning or self._partitioning
        p = parallelism or self._p.parallelism
        if part == Partitioning.FORWARD and p != self._node.parallelism:
            part = Partitioning.REBALANCE
        return add_node(self._p, kind, fn, uid, parallelism, self._node, part, key)

    def map_arrow(self, fn: Callable[[Any], Any], *, uid: str | None = None,
                  parallelism: int | None = None) -> ArrowStream:
        """``fn(batch)`` returns a ``pyarrow.RecordBatch`` (any schema, any
        number of rows; a ``pyarrow.Table`` is combined into one batch)."""
        if not callable(fn):
            raise PipelineDefinitionError(f"map_arrow takes a function, got {fn!r}")
        return ArrowStream(self._p, self._then(OperatorKind.ARROW, ArrowStep("map", fn), uid,
                                               parallelism))

    def filter_arrow(self, fn: Callable[[Any], Any], *, uid: str | None = None,
                     parallelism: int | None = None) -> ArrowStream:
        """Keep the rows where ``fn(batch)`` is true: ``fn`` returns a boolean
        mask as long as the batch (a ``pyarrow`` boolean array, a
        ``pyarrow.compute`` expression's result, or a numpy ``bool`` array);
        a null in the mask drops its row, as in ``RecordBatch.filter``.

        >>> big = stream.filter_arrow(lambda b: pc.greater(b["amount"], 100))
        """
        if not callable(fn):
            raise PipelineDefinitionError(f"filter_arrow takes a function, got {fn!r}")
        return ArrowStream(self._p, self._then(OperatorKind.ARROW, ArrowStep("filter", fn), uid,
                                               parallelism))

    def rebalance(self) -> ArrowStream:
        """Spread whole batches round-robin over the next operator's tasks."""
        return ArrowStream(self._p, self._node, Partitioning.REBALANCE)

    def key_by_column(self, column: str) -> KeyedArrowStream:
        """Partition by the values of ``column``: rows with equal keys go to the
        same task, by the same key group as ``key_by(lambda r: r[column])`` on
        the rows gives."""
        if not isinstance(column, str) or not column:
            raise PipelineDefinitionError(f"key_by_column takes a column name, got {column!r}")
        return KeyedArrowStream(self._p, self._node, ColumnKey(column))

    def to_rows(self, *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[dict[str, Any]]:
        """The rows of every batch as dicts (``RecordBatch.to_pylist``), for
        the row operators (``map``, ``key_by``, ``process``, windows...)."""
        from lockgate.api.pipeline import DataStream

        return DataStream(self._p, self._then(OperatorKind.ARROW, ArrowStep("to_rows"), uid,
                                              parallelism))

    def sink(self, sink: Sink[Any], *, uid: str | None = None,
             parallelism: int | None = None) -> ArrowStream:
        """Write the batches to ``sink``. A ``FileSink(format="parquet")``
        writes them as they are, without rows; any other sink gets the rows
        (dicts)."""
        if not isinstance(sink, Sink):
            raise PipelineDefinitionError(f"{sink!r} is not a lockgate Sink")
        return ArrowStream(self._p, self._then(OperatorKind.SINK, sink, uid, parallelism))


class KeyedArrowStream:
    """An Arrow stream partitioned by a key column."""

    def __init__(self, pipeline: StreamGraph, node: Node, key: ColumnKey) -> None:
        self._p = pipeline
        self._node = node
        self._key = key

    def aggregate_arrow(self, *, uid: str | None = None, parallelism: int | None = None,
                        **aggregations: tuple[str, str]) -> ArrowStream:
        """Running aggregates per key, vectorized: ``name=(column, how)`` per
        output column, ``how`` one of ``sum``, ``count``, ``min``, ``max``,
        ``mean`` (pandas' named aggregation)::

            .aggregate_arrow(total=("amount", "sum"), n=("amount", "count"),
                             avg=("amount", "mean"), uid="per-user")

        After each input batch it emits one row per key of that batch: the
        key column, then the named aggregates over everything the key has
        seen (an upsert stream: a key's last row is its current value). The
        state is one tuple of accumulators per key (``mean`` keeps a sum and a
        count), exactly-once through checkpoints like ``reduce``'s.
        """
        if not aggregations:
            raise PipelineDefinitionError(
                "aggregate_arrow needs at least one name=(column, how), e.g. "
                "total=('amount', 'sum')")
        outputs: list[tuple[str, str, str]] = []
        for name, spec in aggregations.items():
            if not (isinstance(spec, tuple) and len(spec) == 2
                    and all(isinstance(s, str) for s in spec)):
                raise PipelineDefinitionError(
                    f"aggregate_arrow: {name}= takes (column, how), got {spec!r}")
            if spec[1] not in AGGREGATIONS:
                raise PipelineDefinitionError(
                    f"aggregate_arrow: {name}=({spec[0]!r}, {spec[1]!r}): how must be one of "
                    f"{', '.join(AGGREGATIONS)}")
            if name == self._key.column:
                raise PipelineDefinitionError(
                    f"aggregate_arrow: the output {name!r} would hide the key column")
            outputs.append((name, spec[0], spec[1]))
        plan = ArrowAggregate(self._key.column, tuple(outputs))
        node = add_node(self._p, OperatorKind.ARROW_AGGREGATE, plan, uid, parallelism,
                        self._node, Partitioning.HASH, self._key)
        return ArrowStream(self._p, node)


def to_arrow_step(schema: Any = None) -> ArrowStep:
    """The step of ``DataStream.to_arrow``: dict rows into one batch per
    input batch (``RecordBatch.from_pylist``, with ``schema`` if given; rows
    that are not dicts become a column ``value``)."""
    return ArrowStep("to_arrow", None, schema)
