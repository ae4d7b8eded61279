"""Joins of two streams in event time: interval joins and window joins.

Interval join (Flink's ``IntervalJoinOperator``)::

    joined = (orders.key_by(lambda o: o["id"])
                    .interval_join(payments.key_by(lambda p: p["order"]))
                    .between(0, 60_000)         # a payment within a minute after its order
                    .process(Pair(), uid="paid"))

pairs every left record at ``l`` with every right record of the same key at
``r``, ``l + lower <= r <= l + upper`` (bounds inclusive unless
``lower_bound_exclusive()``/``upper_bound_exclusive()``). Each side's records
wait in keyed state until the watermark (the smaller of both inputs') passes
the last time a record of the other side could still match them, then go. A
record older than the watermark when it arrives is late: dropped, or sent to
``side_output_left_late_data(tag)``/``side_output_right_late_data(tag)``.

Window join (an inner join per key and window)::

    pairs = (a.join(b).where(lambda x: x["k"]).equal_to(lambda y: y["k"])
              .window(TumblingEventTimeWindows.of(10_000))
              .apply(lambda x, y: (x, y), uid="pairs"))

is built on the window operator, as Flink builds it on ``coGroup``: each
side's records are tagged (a map each), the two streams united, keyed by the
side's key and windowed; when a window fires, every left record of the key
is paired with every right one. Tumbling, sliding and session windows (and
processing-time ones) work alike; late records are dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Generic, NamedTuple, TypeVar, cast

from lockgate.api.connected import CoSpec
from lockgate.api.functions import OutputTag
from lockgate.api.nodes import Node, add_multi_input_node
from lockgate.api.plan import OperatorKind
from lockgate.api.stream import DataStream, KeyedStream, input_of
from lockgate.api.windows import ProcessWindowFunction, WindowAssigner, WindowContext
from lockgate.errors import PipelineDefinitionError

__all__ = ["ProcessJoinFunction", "JoinContext", "IntervalJoin", "IntervalJoined",
           "IntervalJoinSpec", "JoinedStreams", "event_timestamps"]

L = TypeVar("L")
R = TypeVar("R")
OUT = TypeVar("OUT")


class JoinContext(ABC):
    """What ``ProcessJoinFunction.process_element`` sees besides the pair."""

    left_timestamp: int
    right_timestamp: int

    @property
    def timestamp(self) -> int:
        """The pair's timestamp: the larger of both."""
        return max(self.left_timestamp, self.right_timestamp)

    @abstractmethod
    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``."""


class ProcessJoinFunction(ABC, Generic[L, R, OUT]):
    """Called for every pair of an interval join."""

    def open(self, ctx: Any) -> None:
        """Called once per task before the first pair (``ctx``: the
        operator's ``RuntimeContext``)."""

    @abstractmethod
    def process_element(self, left: L, right: R, ctx: JoinContext) -> Iterable[OUT] | None:
        """One pair: returns an iterable of output records (or ``None``)."""

    def close(self) -> None:
        """Release resources."""


def event_timestamps(node: Node, tag: str | None, given: Callable[[Any], int] | None,
                     nodes: list[Node], what: str) -> Callable[[Any], int]:
    """The timestamps of a stream's records: ``given``, or the source's
    ``WatermarkStrategy.timestamp_of`` when only filters stand between; the
    stream must carry watermarks."""
    only_filters = tag is None
    while node.input is not None and not node.extra_inputs:
        only_filters = only_filters and node.kind == OperatorKind.FILTER
        node = nodes[node.input]
    if node.kind != OperatorKind.SOURCE:
        only_filters = False
    elif node.watermarks is None:
        raise PipelineDefinitionError(
            f"{what} works in event time: give the source {node.uid or node.name!r} "
            "watermarks=WatermarkStrategy(...)")
    if given is not None:
        return given
    if only_filters:
        assert node.watermarks is not None
        ts: Callable[[Any], int] = node.watermarks.timestamp_of
        return ts
    raise PipelineDefinitionError(
        f"{what} needs each record's timestamp, and records changed since the source "
        "stamped them: pass the timestamp_of function of that side")


class IntervalJoinSpec(NamedTuple):
    """The bounds, each side's timestamps and late-data tags of an interval
    join (a tuple: the driver finds the job script's classes inside it)."""

    lower: int
    upper: int
    left_timestamp: Callable[[Any], int]
    right_timestamp: Callable[[Any], int]
    left_late_tag: str | None = None
    right_late_tag: str | None = None


class IntervalJoin(Generic[L, R]):
    """``left.interval_join(right)``: give the bounds with ``between``."""

    def __init__(self, left: KeyedStream[L], right: KeyedStream[R],
                 left_ts: Callable[[L], int] | None,
                 right_ts: Callable[[R], int] | None) -> None:
        if not isinstance(right, KeyedStream):
            raise PipelineDefinitionError("interval_join joins two keyed streams: key_by both")
        self._left, self._right = left, right
        self._left_ts, self._right_ts = left_ts, right_ts

    def between(self, lower: int, upper: int) -> IntervalJoined[L, R]:
        """Pair left ``l`` with right ``r`` of the same key when
        ``l + lower <= r <= l + upper`` (event time)."""
        for b in (lower, upper):
            if isinstance(b, bool) or not isinstance(b, int):
                raise PipelineDefinitionError(f"between takes integer bounds, got {b!r}")
        if lower > upper:
            raise PipelineDefinitionError(f"between: lower {lower} is above upper {upper}")
        nodes = self._left._p.nodes
        lt = event_timestamps(self._left._node, self._left._tag, self._left_ts, nodes,
                              "interval_join")
        rt = event_timestamps(self._right._node, self._right._tag, self._right_ts, nodes,
                              "interval_join")
        return IntervalJoined(self._left, self._right, IntervalJoinSpec(lower, upper, lt, rt))


@dataclass(frozen=True)
class IntervalJoined(Generic[L, R]):
    _left: KeyedStream[L]
    _right: KeyedStream[R]
    _spec: IntervalJoinSpec

    def lower_bound_exclusive(self) -> IntervalJoined[L, R]:
        return replace(self, _spec=self._spec._replace(lower=self._spec.lower + 1))

    def upper_bound_exclusive(self) -> IntervalJoined[L, R]:
        return replace(self, _spec=self._spec._replace(upper=self._spec.upper - 1))

    def side_output_left_late_data(self, tag: OutputTag) -> IntervalJoined[L, R]:
        """Left records late on arrival go to the side output ``tag``."""
        return replace(self, _spec=self._spec._replace(left_late_tag=_tag(tag)))

    def side_output_right_late_data(self, tag: OutputTag) -> IntervalJoined[L, R]:
        """Right records late on arrival go to the side output ``tag``."""
        return replace(self, _spec=self._spec._replace(right_late_tag=_tag(tag)))

    def process(self, fn: ProcessJoinFunction[L, R, OUT], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[OUT]:
        if not isinstance(fn, ProcessJoinFunction):
            raise PipelineDefinitionError(f"{fn!r} is not a ProcessJoinFunction")
        if self._spec.lower > self._spec.upper:
            raise PipelineDefinitionError("the join's interval is empty")
        a, b = input_of(self._left), input_of(self._right)
        spec = CoSpec(fn, (a.key_selector, b.key_selector), self._spec, "union")
        p = self._left._p
        node = add_multi_input_node(p, OperatorKind.INTERVAL_JOIN, spec, uid, parallelism, [a, b])
        node.name = type(fn).__name__
        return DataStream(p, node)


def _tag(tag: OutputTag) -> str:
    if not isinstance(tag, OutputTag):
        raise PipelineDefinitionError(f"expected an OutputTag, got {tag!r}")
    return tag.name


# ------------------------------------------------------------ window joins

class JoinedStreams(Generic[L, R]):
    """``a.join(b)``: then ``.where(key_a).equal_to(key_b).window(...)``."""

    def __init__(self, left: DataStream[L], right: DataStream[R]) -> None:
        if not isinstance(right, DataStream) or not isinstance(left, DataStream):
            raise PipelineDefinitionError("join joins two DataStreams (not keyed)")
        self._left, self._right = left, right

    def where(self, key: Callable[[L], Any]) -> _Where[L, R]:
        return _Where(self._left, self._right, key)


@dataclass(frozen=True)
class _Where(Generic[L, R]):
    _left: DataStream[L]
    _right: DataStream[R]
    _key: Callable[[L], Any]

    def equal_to(self, key: Callable[[R], Any]) -> _EqualTo[L, R]:
        return _EqualTo(self._left, self._right, self._key, key)


@dataclass(frozen=True)
class _EqualTo(Generic[L, R]):
    _left: DataStream[L]
    _right: DataStream[R]
    _lkey: Callable[[L], Any]
    _rkey: Callable[[R], Any]

    def window(self, assigner: WindowAssigner, *, timestamp_of: Callable[[L], int] | None = None,
               other_timestamp_of: Callable[[R], int] | None = None) -> WindowJoin[L, R]:
        if not isinstance(assigner, WindowAssigner):
            raise PipelineDefinitionError(f"window() takes a window assigner, got {assigner!r}")
        lt = rt = None
        if assigner.event_time:
            nodes = self._left._p.nodes
            lt = event_timestamps(self._left._node, self._left._tag, timestamp_of, nodes,
                                  "an event-time window join")
            rt = event_timestamps(self._right._node, self._right._tag, other_timestamp_of,
                                  nodes, "an event-time window join")
        return WindowJoin(self, assigner, lt, rt)


class _Tag(NamedTuple):
    """``r -> (side, r)``: the map that marks a side of a window join."""

    side: int

    def __call__(self, r: Any) -> tuple[int, Any]:
        return (self.side, r)


class _Either(NamedTuple):
    """A function of a tagged record: ``left`` of a left one, ``right`` of a
    right one. (These helpers are tuples: the driver finds the job script's
    classes inside them, as in every ``OperatorSpec.fn``.)"""

    left: Callable[[Any], Any]
    right: Callable[[Any], Any]

    def __call__(self, t: tuple[int, Any]) -> Any:
        return self.left(t[1]) if t[0] == 0 else self.right(t[1])


class _PairUp(tuple[Any, ...], ProcessWindowFunction[Any, Any]):
    """Every left record of the window with every right one, in arrival
    order. A tuple of the user's function (see ``_Either``)."""

    def __new__(cls, fn: Callable[[Any, Any], Any]) -> _PairUp:
        return super().__new__(cls, (fn,))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0],)

    def process(self, key: Any, context: WindowContext,
                elements: list[Any]) -> Iterable[Any] | None:
        lefts = [r for side, r in elements if side == 0]
        rights = [r for side, r in elements if side == 1]
        fn = self[0]
        return [fn(a, b) for a in lefts for b in rights]


class WindowJoin(Generic[L, R]):
    def __init__(self, keys: _EqualTo[L, R], assigner: WindowAssigner,
                 left_ts: Callable[[Any], int] | None,
                 right_ts: Callable[[Any], int] | None) -> None:
        self._keys, self._assigner = keys, assigner
        self._lts, self._rts = left_ts, right_ts

    def apply(self, fn: Callable[[L, R], OUT], *, uid: str | None = None,
              parallelism: int | None = None) -> DataStream[OUT]:
        """``fn(left, right)`` for every pair of records of equal keys in one
        window; one output record each. ``uid`` names the window operator
        (its state); the two tagging maps get ``<uid>.left``/``<uid>.right``."""
        if not callable(fn):
            raise PipelineDefinitionError(f"apply takes a function (left, right) -> out, "
                                          f"got {fn!r}")
        k = self._keys
        # (mypy does not see a NamedTuple's __call__: the casts say they are callables)
        left: DataStream[Any] = k._left.map(cast(Callable[[Any], Any], _Tag(0)),
                                            uid=f"{uid}.left" if uid else None)
        right: DataStream[Any] = k._right.map(cast(Callable[[Any], Any], _Tag(1)),
                                              uid=f"{uid}.right" if uid else None)
        ts = (cast(Callable[[Any], int], _Either(self._lts, self._rts))
              if self._lts and self._rts else None)
        windowed = (left.union(right).key_by(cast(Callable[[Any], Any],
                                                  _Either(k._lkey, k._rkey)))
                    .window(self._assigner, timestamp_of=ts))
        out: DataStream[OUT] = windowed.process(_PairUp(fn), uid=uid, parallelism=parallelism)
        return out
