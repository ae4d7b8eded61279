"""Which runtime operator runs each kind of operator of the job graph.

An operator's module is imported when a task first makes an operator of its
kind (:func:`operator_class`), not with the task code: the asynchronous
operator's asyncio, the window, join and Arrow operators cost only the jobs
that use them. A task host imports the modules of a job's kinds before it
forks the job's tasks (:func:`modules_of`; the local launcher's fork
server), or all of them (:func:`import_all`; Spark's daemon).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from lockgate.api.plan import OperatorKind

if TYPE_CHECKING:  # the modules this one loads, for the reader and the type checker
    import lockgate.runtime.arrow_ops
    import lockgate.runtime.async_io
    import lockgate.runtime.broadcast_process
    import lockgate.runtime.coprocess
    import lockgate.runtime.interval_join
    import lockgate.runtime.windows  # noqa: F401
    from lockgate.runtime.operators import StreamOperator

__all__ = ["operator_class", "modules_of", "import_all"]

_OPERATORS: dict[OperatorKind, tuple[str, str]] = {
    OperatorKind.SOURCE: ("operators", "SourceOperator"),
    OperatorKind.MAP: ("operators", "MapOperator"),
    OperatorKind.FILTER: ("operators", "FilterOperator"),
    OperatorKind.FLAT_MAP: ("operators", "FlatMapOperator"),
    OperatorKind.MAP_BATCH: ("operators", "MapBatchOperator"),
    OperatorKind.REDUCE: ("operators", "ReduceOperator"),
    OperatorKind.PROCESS: ("operators", "ProcessOperator"),
    OperatorKind.WINDOW: ("windows", "WindowOperator"),
    OperatorKind.ASYNC_MAP: ("async_io", "AsyncOperator"),
    OperatorKind.ARROW: ("arrow_ops", "ArrowStepOperator"),
    OperatorKind.ARROW_AGGREGATE: ("arrow_ops", "ArrowAggregateOperator"),
    OperatorKind.SINK: ("operators", "SinkOperator"),
    OperatorKind.CO_PROCESS: ("coprocess", "CoProcessOperator"),
    OperatorKind.BROADCAST_PROCESS: ("broadcast_process", "BroadcastProcessOperator"),
    OperatorKind.INTERVAL_JOIN: ("interval_join", "IntervalJoinOperator"),
}
"""Per kind, the module (of ``lockgate.runtime``) and the class of its operator."""


def operator_class(kind: OperatorKind) -> type[StreamOperator]:
    """The runtime operator of ``kind`` (its module imported on first use)."""
    module, name = _OPERATORS[kind]
    cls: type[StreamOperator] = vars(importlib.import_module(f"lockgate.runtime.{module}"))[name]
    return cls


def modules_of(kinds: Iterable[OperatorKind]) -> list[str]:
    """The modules of the operators of ``kinds`` (a kind without a runtime
    operator of its own, a union, has none)."""
    found = {f"lockgate.runtime.{_OPERATORS[kind][0]}": None for kind in kinds
             if kind in _OPERATORS}
    return list(found)


def import_all() -> None:
    """Import the module of every kind's operator."""
    for kind in _OPERATORS:
        operator_class(kind)
