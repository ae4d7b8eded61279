"""``WindowedStream``: a keyed stream grouped into windows
(``KeyedStream.window``, ``KeyedStream.count_window``), before its window
function makes it a ``DataStream`` of results again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lockgate.api.functions import OutputTag
from lockgate.api.nodes import Node, StreamGraph, add_node
from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.api.windows import (
    AggregateFunction,
    CountWindows,
    GlobalWindows,
    ProcessWindowFunction,
    WindowAssigner,
    WindowFunctionKind,
    WindowSpec,
)
from lockgate.errors import PipelineDefinitionError

if TYPE_CHECKING:
    from lockgate.api.pipeline import DataStream

__all__ = ["WindowedStream"]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class WindowedStream(Generic[T]):
    """Windows of a keyed stream; each builder method returns a new one."""

    _p: StreamGraph
    _node: Node
    _key: Callable[[T], Any]
    _tag: str | None
    _assigner: WindowAssigner
    _timestamp_of: Callable[[T], int] | None
    _lateness: int = 0
    _late_tag: str | None = None
    _trigger: Any = None
    _evictor: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self._assigner, WindowAssigner):
            raise PipelineDefinitionError(
                f"window() takes a window assigner (TumblingEventTimeWindows.of(size), ...), "
                f"got {self._assigner!r}")

    def allowed_lateness(self, lateness: int) -> WindowedStream[T]:
        """Keep an event-time window ``lateness`` past its end (in event time):
        a late record within it is added and the window fires again with the
        updated result (one more record downstream). The window's state and
        timers go at ``end - 1 + lateness``; a record later than that for every
        window it belongs to is dropped, or sent to ``side_output_late_data``."""
        if isinstance(lateness, bool) or not isinstance(lateness, int) or lateness < 0:
            raise PipelineDefinitionError(f"allowed_lateness must be an int >= 0, got "
                                          f"{lateness!r}")
        if not self._assigner.event_time and lateness:
            raise PipelineDefinitionError("allowed_lateness is for event-time windows only")
        return replace(self, _lateness=lateness)

    def trigger(self, trigger: Any) -> WindowedStream[T]:
        """Fire (and purge) windows by ``trigger`` (a
        :class:`lockgate.api.triggers.Trigger`: ``CountTrigger.of(100)``,
        ``ContinuousEventTimeTrigger.of(10_000)``, your own) instead of the
        assigner's default. Time windows still go at ``end - 1 +
        allowed_lateness``; ``GlobalWindows`` need one. Not for session or
        count windows."""
        from lockgate.api.triggers import Trigger

        if not isinstance(trigger, Trigger):
            raise PipelineDefinitionError(f"trigger() takes a Trigger, got {trigger!r}")
        if self._assigner.merging:
            raise PipelineDefinitionError("session windows take no custom trigger")
        if isinstance(self._assigner, CountWindows):
            raise PipelineDefinitionError(
                "count windows fire by count: use window(GlobalWindows.create())"
                ".trigger(...) for a trigger of your own")
        return replace(self, _trigger=trigger)

    def evictor(self, evictor: Any) -> WindowedStream[T]:
        """Drop records of a window before its ``process`` function sees
        them, and from the window (a :class:`lockgate.api.evictors.Evictor`:
        ``CountEvictor.of(n)``, ``TimeEvictor.of(size)``). Not for session
        or count windows."""
        from lockgate.api.evictors import Evictor, TimeEvictor

        if not isinstance(evictor, Evictor):
            raise PipelineDefinitionError(f"evictor() takes an Evictor, got {evictor!r}")
        if self._assigner.merging or isinstance(self._assigner, CountWindows):
            raise PipelineDefinitionError("session and count windows take no evictor")
        if isinstance(evictor, TimeEvictor) and not self._assigner.event_time:
            raise PipelineDefinitionError("TimeEvictor needs event-time windows")
        return replace(self, _evictor=evictor)

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream[T]:
        """Send records too late for every window they belong to (beyond the
        allowed lateness) to the side output ``tag``, as they came:
        ``result.side_output(tag)``."""
        if not isinstance(tag, OutputTag):
            raise PipelineDefinitionError(f"side_output_late_data takes an OutputTag, got {tag!r}")
        if not self._assigner.event_time:
            raise PipelineDefinitionError("only event-time windows have late records")
        return replace(self, _late_tag=tag.name)

    def reduce(self, fn: Callable[[T, T], T],
               window_function: ProcessWindowFunction[T, U] | None = None, *,
               uid: str | None = None, parallelism: int | None = None) -> DataStream[Any]:
        """Combine a window's records two by two as they arrive (``fn(a, b)``,
        which may change ``a`` in place and return it); emits the reduced value
        when the window fires, or what ``window_function`` makes of it (it gets
        the window and the key)."""
        if not callable(fn):
            raise PipelineDefinitionError(f"reduce takes a function (a, b) -> a, got {fn!r}")
        return self._build(WindowFunctionKind.REDUCE, fn, window_function, uid, parallelism)

    def aggregate(self, fn: AggregateFunction[T, Any, U],
                  window_function: ProcessWindowFunction[U, Any] | None = None, *,
                  uid: str | None = None, parallelism: int | None = None) -> DataStream[Any]:
        """Aggregate a window's records incrementally with an
        :class:`AggregateFunction`; emits ``get_result(accumulator)`` when the
        window fires, or what ``window_function`` makes of it."""
        if not isinstance(fn, AggregateFunction):
            raise PipelineDefinitionError(f"{fn!r} is not an AggregateFunction")
        if self._assigner.merging and type(fn).merge is AggregateFunction.merge:
            raise PipelineDefinitionError(
                f"session windows merge accumulators: {type(fn).__name__} needs a merge method")
        return self._build(WindowFunctionKind.AGGREGATE, fn, window_function, uid, parallelism)

    def process(self, fn: ProcessWindowFunction[T, U], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[U]:
        """Call a :class:`ProcessWindowFunction` with all the records of each
        window when it fires (they are kept in state until then)."""
        if not isinstance(fn, ProcessWindowFunction):
            raise PipelineDefinitionError(f"{fn!r} is not a ProcessWindowFunction")
        return self._build(WindowFunctionKind.PROCESS, fn, None, uid, parallelism)

    def _build(self, kind: WindowFunctionKind, fn: Any,
               window_function: ProcessWindowFunction[Any, Any] | None, uid: str | None,
               parallelism: int | None) -> DataStream[Any]:
        from lockgate.api.pipeline import DataStream

        if window_function is not None and not isinstance(window_function,
                                                          ProcessWindowFunction):
            raise PipelineDefinitionError(f"{window_function!r} is not a ProcessWindowFunction")
        if isinstance(self._assigner, GlobalWindows) and self._trigger is None:
            raise PipelineDefinitionError(
                "GlobalWindows fire only by a trigger: .trigger(CountTrigger.of(n)), ...")
        if self._evictor is not None and kind != WindowFunctionKind.PROCESS:
            raise PipelineDefinitionError("an evictor needs a process window function: "
                                          "reduce and aggregate keep no records to evict")
        spec = WindowSpec(self._assigner, kind, fn, window_function, self._timestamps(),
                          self._lateness, self._late_tag, self._trigger, self._evictor)
        node = add_node(self._p, OperatorKind.WINDOW, spec, uid, parallelism, self._node,
                        Partitioning.HASH, self._key, self._tag)
        return DataStream(self._p, node)

    def _timestamps(self) -> Callable[[Any], int] | None:
        """Event time: the records' timestamps, given or the source's; the
        stream must carry watermarks."""
        if not self._assigner.event_time or isinstance(self._assigner,
                                                       CountWindows | GlobalWindows):
            return None
        nodes = self._p.nodes
        node, only_filters = self._node, self._tag is None
        while node.input is not None:
            only_filters = only_filters and node.kind == OperatorKind.FILTER
            node = nodes[node.input]
        strategy = node.watermarks
        if strategy is None:
            raise PipelineDefinitionError(
                f"event-time windows need watermarks: give the source {node.uid or node.name!r} "
                "watermarks=WatermarkStrategy(...), or use processing-time windows")
        if self._timestamp_of is not None:
            return self._timestamp_of
        if only_filters:
            return strategy.timestamp_of
        raise PipelineDefinitionError(
            "event-time windows need each record's timestamp, and records changed since the "
            "source stamped them: pass window(..., timestamp_of=lambda r: ...)")
