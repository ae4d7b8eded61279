"""Which runtime operator runs each kind of operator of the job graph."""

from __future__ import annotations

from lockgate.api.plan import OperatorKind
from lockgate.runtime.arrow_ops import ArrowAggregateOperator, ArrowStepOperator
from lockgate.runtime.async_io import AsyncOperator
from lockgate.runtime.broadcast_process import BroadcastProcessOperator
from lockgate.runtime.coprocess import CoProcessOperator
from lockgate.runtime.interval_join import IntervalJoinOperator
from lockgate.runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    MapBatchOperator,
    MapOperator,
    ProcessOperator,
    ReduceOperator,
    SinkOperator,
    SourceOperator,
    StreamOperator,
)
from lockgate.runtime.windows import WindowOperator

__all__ = ["OPERATORS"]

OPERATORS: dict[OperatorKind, type[StreamOperator]] = {
    OperatorKind.SOURCE: SourceOperator,
    OperatorKind.MAP: MapOperator,
    OperatorKind.FILTER: FilterOperator,
    OperatorKind.FLAT_MAP: FlatMapOperator,
    OperatorKind.MAP_BATCH: MapBatchOperator,
    OperatorKind.REDUCE: ReduceOperator,
    OperatorKind.PROCESS: ProcessOperator,
    OperatorKind.WINDOW: WindowOperator,
    OperatorKind.ASYNC_MAP: AsyncOperator,
    OperatorKind.ARROW: ArrowStepOperator,
    OperatorKind.ARROW_AGGREGATE: ArrowAggregateOperator,
    OperatorKind.SINK: SinkOperator,
    OperatorKind.CO_PROCESS: CoProcessOperator,
    OperatorKind.BROADCAST_PROCESS: BroadcastProcessOperator,
    OperatorKind.INTERVAL_JOIN: IntervalJoinOperator,
}
