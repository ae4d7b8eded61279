"""The streams of a pipeline: ``DataStream`` (stateless steps, partitioning,
side outputs, sinks), ``KeyedStream`` (keyed state: ``reduce``, ``process``,
windows, interval joins), ``WindowedStream`` (a keyed stream grouped into
windows, before its window function makes it a ``DataStream`` of results
again), and the Arrow path's ``ArrowStream`` and ``KeyedArrowStream``
(``DataStream.to_arrow``, ``ArrowStream.to_rows``; :mod:`lockgate.api.arrow`
holds their steps). They return one another, so they live together. A
``Pipeline``'s ``source`` gives the first stream; :mod:`lockgate.api.pipeline`
re-exports ``DataStream`` and ``KeyedStream``.

The operators over two streams (``connect``, ``broadcast``, ``join``,
``interval_join``) are built in the modules above this one
(:mod:`~lockgate.api.connected`, :mod:`~lockgate.api.broadcast`,
:mod:`~lockgate.api.joins`), whose builders return ``DataStream``s: a stream
reaches them through :class:`TwoStreamBuilders`, which
:mod:`lockgate.api.pipeline` hands over (every stream comes from a
``Pipeline``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from lockgate.api.arrow import AGGREGATIONS, ArrowAggregate, ArrowStep, ColumnKey, to_arrow_step
from lockgate.api.functions import KeyedProcessFunction, OutputTag
from lockgate.api.nodes import Node, StreamGraph, StreamInput, add_multi_input_node, add_node
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
from lockgate.connectors.base import Sink
from lockgate.errors import PipelineDefinitionError

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["DataStream", "KeyedStream", "WindowedStream", "ArrowStream", "KeyedArrowStream",
           "TwoStreamBuilders", "set_two_stream_builders", "input_of"]


def _edge(pipeline: StreamGraph, node: Node, partitioning: Partitioning,
          parallelism: int | None) -> Partitioning:
    """How records go from ``node`` to an operator of ``parallelism`` (None:
    the pipeline's): forward stays forward only between equal parallelisms,
    else records are rebalanced. A sink has no output to follow."""
    if node.kind == OperatorKind.SINK:
        raise PipelineDefinitionError("a sink has no output stream")
    p = parallelism or pipeline.parallelism
    if partitioning == Partitioning.FORWARD and p != node.parallelism:
        return Partitioning.REBALANCE
    return partitioning


class DataStream(Generic[T]):
    """A stream of records of type ``T``."""

    def __init__(self, pipeline: StreamGraph, node: Node,
                 partitioning: Partitioning = Partitioning.FORWARD,
                 tag: str | None = None) -> None:
        self._p = pipeline
        self._node = node
        self._partitioning = partitioning
        self._tag = tag
        """None: the node's main output; else the side output of this name."""

    def _then(self, kind: OperatorKind, fn: Any, uid: str | None, parallelism: int | None,
              partitioning: Partitioning | None = None,
              key_selector: Callable[[Any], Any] | None = None) -> Node:
        part = _edge(self._p, self._node, partitioning or self._partitioning, parallelism)
        return add_node(self._p, kind, fn, uid, parallelism, self._node, part, key_selector,
                        self._tag)

    def map(self, fn: Callable[[T], U], *, uid: str | None = None,
            parallelism: int | None = None) -> DataStream[U]:
        """Apply ``fn`` to every record."""
        return DataStream(self._p, self._then(OperatorKind.MAP, fn, uid, parallelism))

    def filter(self, fn: Callable[[T], bool], *, uid: str | None = None,
               parallelism: int | None = None) -> DataStream[T]:
        """Keep the records for which ``fn`` is true."""
        return DataStream(self._p, self._then(OperatorKind.FILTER, fn, uid, parallelism))

    def flat_map(self, fn: Callable[[T], Iterable[U]], *, uid: str | None = None,
                 parallelism: int | None = None) -> DataStream[U]:
        """Replace every record by the records of the iterable ``fn`` returns."""
        return DataStream(self._p, self._then(OperatorKind.FLAT_MAP, fn, uid, parallelism))

    def map_batch(self, fn: Callable[[list[T]], list[U]], *, uid: str | None = None,
                  parallelism: int | None = None) -> DataStream[U]:
        """Apply ``fn`` to a whole batch (a list) at once; it returns a list."""
        return DataStream(self._p, self._then(OperatorKind.MAP_BATCH, fn, uid, parallelism))

    def async_map(self, fn: Any, *, capacity: int = 100, ordered: bool = True,
                  timeout: float | None = None,
                  on_timeout: Callable[[T], Any] | None = None, uid: str | None = None,
                  parallelism: int | None = None) -> DataStream[Any]:
        """Call an external service per record (Flink's ``AsyncDataStream``):
        ``fn`` is an ``async def`` (or an ``AsyncFunction``) whose result is
        the output record; at most ``capacity`` requests in flight per task,
        results in input order (``ordered``) or as they complete; a request
        longer than ``timeout`` seconds gives ``on_timeout(record)`` or fails
        the attempt. Requests in flight at a checkpoint are part of it and are
        issued again on recovery (:mod:`lockgate.api.async_io`).

        >>> enriched = clicks.async_map(lookup, capacity=64, timeout=2.0, uid="lookup")
        """
        from lockgate.api.async_io import as_async_function

        spec = as_async_function(fn, capacity=capacity, ordered=ordered, timeout=timeout,
                                 on_timeout=on_timeout)
        return DataStream(self._p, self._then(OperatorKind.ASYNC_MAP, spec, uid, parallelism))

    def to_arrow(self, schema: Any = None, *, uid: str | None = None,
                 parallelism: int | None = None) -> ArrowStream:
        """Each batch of records as one ``pyarrow.RecordBatch`` (dict records
        become columns, ``schema`` if given; other records one column
        ``value``): an :class:`ArrowStream`."""
        return ArrowStream(self._p, self._then(OperatorKind.ARROW, to_arrow_step(schema), uid,
                                               parallelism))

    def rebalance(self) -> DataStream[T]:
        """Spread the records round-robin over the next operator's tasks."""
        return DataStream(self._p, self._node, Partitioning.REBALANCE, self._tag)

    def key_by(self, key_selector: Callable[[T], Any]) -> KeyedStream[T]:
        """Partition by key: records with equal keys go to the same task."""
        return KeyedStream(self._p, self._node, key_selector, self._tag)

    def side_output(self, tag: OutputTag) -> DataStream[Any]:
        """The values this stream's operator emitted to the side output ``tag``
        (``ctx.output(tag, value)`` in a process or window function; a
        window's late records with ``side_output_late_data(tag)``).

        A side output travels on an edge of its own from the operator, with the
        same barriers and watermarks as its main output, so it is exactly-once
        like any stream.

        >>> late = windowed.side_output(OutputTag("late"))
        """
        if not isinstance(tag, OutputTag):
            raise PipelineDefinitionError(f"side_output takes an OutputTag, got {tag!r}")
        if self._tag is not None or self._node.kind not in (
                OperatorKind.PROCESS, OperatorKind.WINDOW, OperatorKind.CO_PROCESS,
                OperatorKind.BROADCAST_PROCESS, OperatorKind.INTERVAL_JOIN):
            raise PipelineDefinitionError(
                "side_output(tag) needs the stream of a process or window operator "
                "(.process(...), .window(...)....): only they emit side outputs")
        return DataStream(self._p, self._node, tag=tag.name)

    def union(self, *others: DataStream[T]) -> DataStream[T]:
        """One stream of this stream's records and those of ``others`` (same
        type), in no particular order between them (:mod:`lockgate.api.connected`)."""
        if not others:
            return self
        streams: Sequence[DataStream[T]] = [self, *others]
        for s in streams:
            if not isinstance(s, DataStream):
                raise PipelineDefinitionError(
                    f"union takes DataStreams (key the union afterwards), got {s!r}")
        node = add_multi_input_node(self._p, OperatorKind.UNION, None, None,
                                    max(s._node.parallelism for s in streams),
                                    [input_of(s) for s in streams])
        node.name = "union"
        return DataStream(self._p, node)

    def connect(self, other: Any) -> Any:
        """Two streams into one operator: ``ConnectedStreams`` (then
        ``.process(CoProcessFunction)``), or with a ``BroadcastStream`` a
        ``BroadcastConnectedStream`` (``.process(BroadcastProcessFunction)``)."""
        return _builders().connect(self, other)

    def broadcast(self, *descriptors: Any) -> Any:
        """This stream sent to every task of the operator it is connected to,
        with broadcast state ``descriptors`` (``MapStateDescriptor``s):
        a ``BroadcastStream`` (:mod:`lockgate.api.broadcast`)."""
        return _builders().broadcast(self, descriptors)

    def join(self, other: DataStream[Any]) -> Any:
        """A window join: ``a.join(b).where(ka).equal_to(kb).window(assigner)
        .apply(fn)`` (:mod:`lockgate.api.joins`)."""
        return _builders().join(self, other)

    def sink(self, sink: Sink[T], *, uid: str | None = None,
             parallelism: int | None = None) -> DataStream[T]:
        """Write the stream to ``sink``."""
        if not isinstance(sink, Sink):
            raise PipelineDefinitionError(f"{sink!r} is not a lockgate Sink")
        return DataStream(self._p, self._then(OperatorKind.SINK, sink, uid, parallelism))


class KeyedStream(Generic[T]):
    """A stream partitioned by key; its operators see keyed state."""

    def __init__(self, pipeline: StreamGraph, node: Node, key_selector: Callable[[T], Any],
                 tag: str | None = None) -> None:
        self._p = pipeline
        self._node = node
        self._key = key_selector
        self._tag = tag

    def _keyed(self, kind: OperatorKind, fn: Any, uid: str | None,
               parallelism: int | None) -> Node:
        return add_node(self._p, kind, fn, uid, parallelism, self._node, Partitioning.HASH,
                        self._key, self._tag)

    def window(self, assigner: WindowAssigner, *,
               timestamp_of: Callable[[T], int] | None = None) -> WindowedStream[T]:
        """Group each key's records into windows (:mod:`lockgate.api.windows`);
        then ``.reduce``, ``.aggregate`` or ``.process`` the windows.

        Event-time windows need each record's timestamp (records do not carry
        one): ``timestamp_of``, by default the ``WatermarkStrategy``'s of the
        source, when only filters stand between it and the window.

        >>> counts = (clicks.key_by(lambda c: c["user"])
        ...                 .window(TumblingEventTimeWindows.of(60_000))
        ...                 .aggregate(Count(), uid="clicks-per-minute"))
        """
        return WindowedStream(self._p, self._node, self._key, self._tag, assigner, timestamp_of)

    def count_window(self, size: int, slide: int | None = None) -> WindowedStream[T]:
        """A window per ``size`` records of a key, in their arrival order
        (Flink's ``countWindow(size)``): it fires when its last record arrives.
        A key's last incomplete window never fires (and stays in state).
        With ``slide``: every ``slide``-th record of a key fires a window of
        its last ``size`` records (fewer at first), as Flink's
        ``countWindow(size, slide)``."""
        return WindowedStream(self._p, self._node, self._key, self._tag,
                              CountWindows(size, slide), None)

    def reduce(self, fn: Callable[[T, T], T], *, uid: str | None = None,
               parallelism: int | None = None) -> DataStream[T]:
        """Combine each record with its key's running value; emits every updated value.

        ``fn(acc, record)`` may mutate ``acc`` and return it (``a[1] += b[1];
        return a``): a mutable accumulator is copied before ``fn`` sees it, so
        every emitted value stays as it was emitted and a checkpoint holds the
        value as of its barrier, however the function or an operator
        downstream changes them later. Immutable accumulators (numbers,
        strings, tuples of them) are not copied: they are the fastest.

        >>> totals = stream.key_by(lambda kv: kv[0]).reduce(
        ...     lambda a, b: (a[0], a[1] + b[1]), uid="totals")
        """
        return DataStream(self._p, self._keyed(OperatorKind.REDUCE, fn, uid, parallelism))

    def process(self, fn: KeyedProcessFunction[T, U], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[U]:
        """Run a ``KeyedProcessFunction`` with keyed state."""
        if not isinstance(fn, KeyedProcessFunction):
            raise PipelineDefinitionError(f"{fn!r} is not a KeyedProcessFunction")
        return DataStream(self._p, self._keyed(OperatorKind.PROCESS, fn, uid, parallelism))

    def connect(self, other: Any) -> Any:
        """With another ``KeyedStream``: keyed ``ConnectedStreams`` (both
        inputs share this operator's keyed state and timers); with a
        ``BroadcastStream``: ``.process(KeyedBroadcastProcessFunction)``."""
        return _builders().connect(self, other)

    def interval_join(self, other: KeyedStream[Any], *,
                      timestamp_of: Callable[[T], int] | None = None,
                      other_timestamp_of: Callable[[Any], int] | None = None) -> Any:
        """An event-time interval join with ``other``: ``.between(lower,
        upper).process(ProcessJoinFunction)`` (:mod:`lockgate.api.joins`)."""
        return _builders().interval_join(self, other, timestamp_of, other_timestamp_of)



def input_of(stream: DataStream[Any] | KeyedStream[Any]) -> StreamInput:
    """A stream as one input of a multi-input operator (keyed: hash-partitioned)."""
    if isinstance(stream, KeyedStream):
        return StreamInput(stream._node, Partitioning.HASH, stream._key, stream._tag)
    if isinstance(stream, DataStream):
        return StreamInput(stream._node, stream._partitioning, None, stream._tag)
    raise PipelineDefinitionError(f"expected a stream, got {stream!r}")


@dataclass(frozen=True)
class TwoStreamBuilders:
    """What ``connect``, ``broadcast``, ``join`` and ``interval_join`` of a
    stream build: the builders of :mod:`lockgate.api.connected`,
    :mod:`~lockgate.api.broadcast` and :mod:`~lockgate.api.joins`, above
    this module (see the module docstring)."""

    connect: Callable[[DataStream[Any] | KeyedStream[Any], Any], Any]
    broadcast: Callable[[DataStream[Any], tuple[Any, ...]], Any]
    join: Callable[[DataStream[Any], DataStream[Any]], Any]
    interval_join: Callable[[KeyedStream[Any], KeyedStream[Any], Callable[[Any], int] | None,
                             Callable[[Any], int] | None], Any]


_two_stream_builders: list[TwoStreamBuilders] = []


def set_two_stream_builders(builders: TwoStreamBuilders) -> None:
    """Who builds the operators over two streams (:mod:`lockgate.api.pipeline` sets them)."""
    _two_stream_builders[:] = [builders]


def _builders() -> TwoStreamBuilders:
    if not _two_stream_builders:
        raise RuntimeError("no two-stream builders: import lockgate (lockgate.api.pipeline "
                           "sets them)")
    return _two_stream_builders[-1]


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


class ArrowStream:
    """A stream of ``pyarrow.RecordBatch`` es (see the module docstring)."""

    def __init__(self, pipeline: StreamGraph, node: Node,
                 partitioning: Partitioning = Partitioning.FORWARD) -> None:
        self._p = pipeline
        self._node = node
        self._partitioning = partitioning

    def _then(self, kind: OperatorKind, fn: Any, uid: str | None, parallelism: int | None,
              partitioning: Partitioning | None = None, key: ColumnKey | None = None) -> Node:
        part = _edge(self._p, self._node, partitioning or self._partitioning, parallelism)
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
