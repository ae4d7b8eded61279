"""The vocabulary of the dataflow graph: operator kinds and partitionings.

A leaf module (it imports nothing of Lockgate), shared by the API that builds
a pipeline, the job graph, the runtime and the job master. ``StrEnum``
members equal their strings (``Partitioning.HASH == "hash"``), so generated
uids (``map-3``) and anything that compares with a literal are unchanged.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["OperatorKind", "Partitioning"]


class OperatorKind(StrEnum):
    """What an operator of the pipeline does (``Node.kind``, ``OperatorSpec.kind``)."""

    SOURCE = "source"
    MAP = "map"
    FILTER = "filter"
    FLAT_MAP = "flat_map"
    MAP_BATCH = "map_batch"
    REDUCE = "reduce"
    """Keyed: combines each record with its key's running value."""
    PROCESS = "process"
    """Keyed: a ``KeyedProcessFunction``."""
    WINDOW = "window"
    """Keyed: windows (``KeyedStream.window``), a ``WindowSpec``."""
    ASYNC_MAP = "async_map"
    """Calls of an ``async def`` per record (``DataStream.async_map``), an ``AsyncSpec``."""
    SINK = "sink"
    ARROW = "arrow"
    """On ``pyarrow.RecordBatch`` es: ``map_arrow``, ``filter_arrow``,
    ``to_rows``, ``to_arrow`` (an ``api.arrow.ArrowStep``)."""
    ARROW_AGGREGATE = "arrow_aggregate"
    """Keyed: ``aggregate_arrow``, running aggregates over record batches."""
    UNION = "union"
    """Several streams as one (``DataStream.union``): no operator of its own;
    its consumer reads every input's edges (``graph/jobgraph.py``)."""
    CO_PROCESS = "co_process"
    """Two inputs: a ``CoProcessFunction`` (``connect(...).process``), keyed or not."""
    BROADCAST_PROCESS = "broadcast_process"
    """Two inputs, the second broadcast: a ``(Keyed)BroadcastProcessFunction``."""
    INTERVAL_JOIN = "interval_join"
    """Two keyed inputs: ``interval_join(...).between(...).process``."""


class Partitioning(StrEnum):
    """How records reach an operator from its input."""

    FORWARD = "forward"
    """Task ``i`` to task ``i``: equal parallelism (chained when possible)."""
    HASH = "hash"
    """By key group of the record's key: equal keys reach the same task."""
    REBALANCE = "rebalance"
    """Whole batches round-robin over the downstream tasks."""
    BROADCAST = "broadcast"
    """Every record to every downstream task (``DataStream.broadcast``)."""
