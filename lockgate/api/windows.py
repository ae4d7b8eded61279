"""Windows on keyed streams: assigners, window functions, and what a window
function sees.

A window groups the records of one key by time (or by count) and emits a
result per key and window::

    from lockgate.api.windows import TumblingEventTimeWindows

    (events.key_by(lambda e: e["user"])
           .window(TumblingEventTimeWindows.of(60_000))
           .allowed_lateness(10_000)
           .side_output_late_data(LATE)
           .aggregate(CountClicks(), uid="clicks-per-minute"))

Assignment follows Flink's rules (``offset`` included), so a reference
computed in plain Python with the same arithmetic gives the same windows:

- tumbling ``of(size)``: ``start = ts - (ts - offset) % size``, ``end = start + size``;
- sliding ``of(size, slide)``: every ``[start, start + size)`` with ``start``
  a multiple of ``slide`` (plus ``offset``) and ``start <= ts < start + size``;
- sessions ``with_gap(gap)``: ``[ts, ts + gap)``, merged with every window of
  the key it intersects (touching windows merge: ``[0, 10)`` and ``[10, 20)``
  become ``[0, 20)``);
- processing time: the same, on the task's clock (ms since the epoch) when
  the record arrives.

Windows are half-open ``[start, end)``; an event-time window fires when the
watermark reaches ``end - 1`` (:meth:`TimeWindow.max_timestamp`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

from lockgate.api.functions import OutputTag, RuntimeContext

__all__ = [
    "AggregateFunction",
    "CountWindows",
    "EventTimeSessionWindows",
    "GlobalWindow",
    "GlobalWindows",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowContext",
    "WindowFunctionKind",
    "WindowSpec",
]

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class TimeWindow(NamedTuple):
    """The window ``[start, end)`` (a tuple: ``start, end = window``)."""

    start: int
    end: int

    def max_timestamp(self) -> int:
        """The largest timestamp in the window: its event-time timer."""
        return self.end - 1


@dataclass(frozen=True)
class GlobalWindow:
    """The one window of a key of a count window (``count_window``)."""


class WindowAssigner(ABC):
    """Which windows a record belongs to. Windows are ``(start, end)`` tuples."""

    event_time: bool = True
    """Event time (by the record's timestamp, fired by watermarks) or
    processing time (by the task's clock, fired by it)."""
    merging: bool = False
    """Session windows: a new window merges with those it intersects."""

    @abstractmethod
    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        """The windows of a record at ``timestamp`` (event or processing time)."""


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer (in your timestamps' unit), "
                         f"got {value!r}")
    return value


class _Tumbling(WindowAssigner):
    def __init__(self, size: int, offset: int = 0) -> None:
        self.size = _positive("the window size", size)
        if not isinstance(offset, int) or not 0 <= offset < size:
            raise ValueError(f"the offset must be an integer in [0, size), got {offset!r}")
        self.offset = offset

    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        start = timestamp - (timestamp - self.offset) % self.size
        return [(start, start + self.size)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}.of({self.size}, offset={self.offset})"


class _Sliding(WindowAssigner):
    def __init__(self, size: int, slide: int, offset: int = 0) -> None:
        self.size = _positive("the window size", size)
        self.slide = _positive("the slide", slide)
        if not isinstance(offset, int) or not 0 <= offset < slide:
            raise ValueError(f"the offset must be an integer in [0, slide), got {offset!r}")
        self.offset = offset

    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        size, slide = self.size, self.slide
        start = timestamp - (timestamp - self.offset) % slide
        out = []
        while start > timestamp - size:
            out.append((start, start + size))
            start -= slide
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}.of({self.size}, {self.slide}, offset={self.offset})"


class _Sessions(WindowAssigner):
    merging = True

    def __init__(self, gap: int) -> None:
        self.gap = _positive("the session gap", gap)

    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        return [(timestamp, timestamp + self.gap)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}.with_gap({self.gap})"


class TumblingEventTimeWindows(_Tumbling):
    """Windows of ``size`` one after the other, by event time."""

    @classmethod
    def of(cls, size: int, offset: int = 0) -> TumblingEventTimeWindows:
        return cls(size, offset)


class SlidingEventTimeWindows(_Sliding):
    """Windows of ``size`` starting every ``slide``, by event time: a record
    belongs to ``ceil(size / slide)`` windows (fewer if ``slide`` does not
    divide ``size``)."""

    @classmethod
    def of(cls, size: int, slide: int, offset: int = 0) -> SlidingEventTimeWindows:
        return cls(size, slide, offset)


class EventTimeSessionWindows(_Sessions):
    """A window per burst of records of a key: it closes after ``gap`` without one."""

    @classmethod
    def with_gap(cls, gap: int) -> EventTimeSessionWindows:
        return cls(gap)


class TumblingProcessingTimeWindows(_Tumbling):
    """Tumbling windows of the task's clock (ms since the epoch)."""

    event_time = False

    @classmethod
    def of(cls, size: int, offset: int = 0) -> TumblingProcessingTimeWindows:
        return cls(size, offset)


class SlidingProcessingTimeWindows(_Sliding):
    """Sliding windows of the task's clock (ms since the epoch)."""

    event_time = False

    @classmethod
    def of(cls, size: int, slide: int, offset: int = 0) -> SlidingProcessingTimeWindows:
        return cls(size, slide, offset)


class ProcessingTimeSessionWindows(_Sessions):
    """Session windows of the task's clock (ms since the epoch)."""

    event_time = False

    @classmethod
    def with_gap(cls, gap: int) -> ProcessingTimeSessionWindows:
        return cls(gap)


class CountWindows(WindowAssigner):
    """``count_window(size)``: a window per ``size`` records of a key, in
    arrival order, fired when the ``size``-th arrives (Flink's
    ``countWindow``). A last incomplete window never fires and stays in state."""

    event_time = False

    def __init__(self, size: int, slide: int | None = None) -> None:
        self.size = _positive("the count window's size", size)
        self.slide = None if slide is None else _positive("the count window's slide", slide)
        """Sliding: fire every ``slide`` records of a key with its last
        ``size`` records (Flink's ``countWindow(size, slide)``)."""

    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        raise NotImplementedError("count windows are not assigned by time")

    def __repr__(self) -> str:
        return f"CountWindows({self.size}, {self.slide})"


class GlobalWindows(WindowAssigner):
    """One window per key for all time (Flink's ``GlobalWindows``): it
    fires only by a custom trigger (``.trigger(CountTrigger.of(n))``), and
    its contents stay until the trigger purges them."""

    event_time = False

    @classmethod
    def create(cls) -> GlobalWindows:
        return cls()

    def assign(self, timestamp: int) -> list[tuple[int, int]]:
        raise NotImplementedError("the global window is not assigned by time")

    def __repr__(self) -> str:
        return "GlobalWindows.create()"


class WindowContext(ABC):
    """What a :class:`ProcessWindowFunction` sees of the window it processes."""

    window: TimeWindow | GlobalWindow
    """The window that fires: ``window.start``, ``window.end`` for time windows."""

    @abstractmethod
    def current_watermark(self) -> float:
        """The operator's event time."""

    @abstractmethod
    def current_processing_time(self) -> int:
        """The task's clock, ms since the epoch."""

    @abstractmethod
    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag`` (``stream.side_output(tag)``)."""


class ProcessWindowFunction(ABC, Generic[IN, OUT]):
    """A function over all the records of a window, with the window and the key.

    Example::

        class Count(ProcessWindowFunction):
            def process(self, key, context, elements):
                yield (key, context.window.start, context.window.end, len(elements))

    ``process`` returns an iterable of output records (a generator, a list, or
    ``None``). ``elements`` is a list of copies of the window's records, in
    arrival order within each merged session part. Given as the
    ``window_function`` of ``reduce`` or ``aggregate``, ``elements`` holds one
    value: the reduced value or the aggregate's result."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per task before the first window fires."""

    @abstractmethod
    def process(self, key: Any, context: WindowContext,
                elements: list[IN]) -> Iterable[OUT] | None: ...

    def close(self) -> None:
        """Release resources; always called, also on failure."""


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """An incremental aggregation: one accumulator per key and window.

    Example::

        class Average(AggregateFunction):
            def create_accumulator(self):
                return (0, 0)
            def add(self, value, acc):
                return (acc[0] + value, acc[1] + 1)
            def get_result(self, acc):
                return acc[0] / acc[1]
            def merge(self, a, b):
                return (a[0] + b[0], a[1] + b[1])

    ``add`` may change a mutable accumulator in place and return it. ``merge``
    is needed by session windows only (merged sessions merge accumulators)."""

    @abstractmethod
    def create_accumulator(self) -> ACC: ...

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC: ...

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT: ...

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise NotImplementedError(
            f"{type(self).__name__}.merge is needed to merge session windows")


class WindowFunctionKind(StrEnum):
    """How a window's records become its result."""

    REDUCE = "reduce"
    AGGREGATE = "aggregate"
    PROCESS = "process"


class _WindowFields(NamedTuple):

    assigner: WindowAssigner
    kind: WindowFunctionKind
    function: Any
    """A reduce function ``(a, b) -> a``, an :class:`AggregateFunction` or a
    :class:`ProcessWindowFunction`."""
    window_function: ProcessWindowFunction[Any, Any] | None = None
    """With ``reduce``/``aggregate``: called with the result and the window."""
    timestamp_of: Callable[[Any], int] | None = None
    """Event time: a record's timestamp."""
    allowed_lateness: int = 0
    late_tag: str | None = None
    """The side output of records too late for every window they belong to."""
    trigger: Any = None
    """A custom :class:`lockgate.api.triggers.Trigger`, or None: the assigner's
    default (watermark, clock or count)."""
    evictor: Any = None
    """``process`` windows: an :class:`lockgate.api.evictors.Evictor`, or None."""


class WindowSpec(_WindowFields):
    """Everything a window operator runs (``OperatorSpec.fn`` of a
    ``window`` operator). A tuple, so that the driver finds the job script's
    classes inside it."""

    __slots__ = ()
    operator_state_mode = "union"
    """The operator's state besides its keyed state (its watermark) goes to
    every task on restore: each takes the smallest."""
