"""The streams of a pipeline: ``DataStream`` (stateless steps, partitioning,
side outputs, sinks) and ``KeyedStream`` (keyed state: ``reduce``,
``process``, windows, interval joins). :mod:`lockgate.api.pipeline` re-exports
both; a ``Pipeline``'s ``source`` gives the first one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lockgate.api.functions import KeyedProcessFunction, OutputTag
from lockgate.api.nodes import Node, StreamGraph, add_node
from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.connectors.base import Sink
from lockgate.errors import PipelineDefinitionError

if TYPE_CHECKING:
    from lockgate.api.arrow import ArrowStream
    from lockgate.api.windowed import WindowedStream
    from lockgate.api.windows import WindowAssigner

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["DataStream", "KeyedStream"]


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
        if self._node.kind == OperatorKind.SINK:
            raise PipelineDefinitionError("a sink has no output stream")
        part = partitioning or self._partitioning
        p = parallelism or self._p.parallelism
        if part == Partitioning.FORWARD and p != self._node.parallelism:
            part = Partitioning.REBALANCE
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
        ``value``): an :class:`~lockgate.api.arrow.ArrowStream`."""
        from lockgate.api.arrow import ArrowStream, to_arrow_step

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
        from lockgate.api.connected import union

        return union(self, others)

    def connect(self, other: Any) -> Any:
        """Two streams into one operator: ``ConnectedStreams`` (then
        ``.process(CoProcessFunction)``), or with a ``BroadcastStream`` a
        ``BroadcastConnectedStream`` (``.process(BroadcastProcessFunction)``)."""
        from lockgate.api.connected import connect

        return connect(self, other)

    def broadcast(self, *descriptors: Any) -> Any:
        """This stream sent to every task of the operator it is connected to,
        with broadcast state ``descriptors`` (``MapStateDescriptor``s):
        a ``BroadcastStream`` (:mod:`lockgate.api.broadcast`)."""
        from lockgate.api.broadcast import BroadcastStream

        return BroadcastStream(self, descriptors)

    def join(self, other: DataStream[Any]) -> Any:
        """A window join: ``a.join(b).where(ka).equal_to(kb).window(assigner)
        .apply(fn)`` (:mod:`lockgate.api.joins`)."""
        from lockgate.api.joins import JoinedStreams

        return JoinedStreams(self, other)

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
        from lockgate.api.windowed import WindowedStream

        return WindowedStream(self._p, self._node, self._key, self._tag, assigner, timestamp_of)

    def count_window(self, size: int, slide: int | None = None) -> WindowedStream[T]:
        """A window per ``size`` records of a key, in their arrival order
        (Flink's ``countWindow(size)``): it fires when its last record arrives.
        A key's last incomplete window never fires (and stays in state).
        With ``slide``: every ``slide``-th record of a key fires a window of
        its last ``size`` records (fewer at first), as Flink's
        ``countWindow(size, slide)``."""
        from lockgate.api.windowed import WindowedStream
        from lockgate.api.windows import CountWindows

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
        from lockgate.api.connected import connect

        return connect(self, other)

    def interval_join(self, other: KeyedStream[Any], *,
                      timestamp_of: Callable[[T], int] | None = None,
                      other_timestamp_of: Callable[[Any], int] | None = None) -> Any:
        """An event-time interval join with ``other``: ``.between(lower,
        upper).process(ProcessJoinFunction)`` (:mod:`lockgate.api.joins`)."""
        from lockgate.api.joins import IntervalJoin

        return IntervalJoin(self, other, timestamp_of, other_timestamp_of)
