"""User function base classes and the runtime context they see."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from lockgate.api.watermarks import TimeDomain, TimerService
from lockgate.state.backend import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)

IN = TypeVar("IN")
OUT = TypeVar("OUT")
OUT_contra = TypeVar("OUT_contra", contravariant=True)

__all__ = ["RuntimeContext", "KeyedProcessFunction", "Collector", "OutputTag"]


class Collector(Protocol[OUT_contra]):
    def collect(self, record: OUT_contra) -> None: ...


@dataclass(frozen=True)
class OutputTag:
    """Names a side output: a process function emits to it with
    ``ctx.output(tag, value)`` and ``stream.side_output(tag)`` is the stream
    of those values (``late = OutputTag("late")``)."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an OutputTag needs a non-empty name, got {self.name!r}")


class RuntimeContext(ABC):
    """What a user function sees of the task it runs in."""

    task_index: int
    parallelism: int
    attempt: int
    uid: str
    time_domain: TimeDomain | None
    """In ``on_timer``: the clock of the timer that fired; otherwise None."""

    @property
    @abstractmethod
    def current_key(self) -> Any:
        """The key of the record being processed (keyed functions only)."""

    @property
    @abstractmethod
    def timer_service(self) -> TimerService:
        """Event-time and processing-time timers of the current key (keyed
        functions only)."""

    @abstractmethod
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState: ...

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    @abstractmethod
    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``: the stream
        ``stream.side_output(tag)`` of this operator's stream. A tag nobody
        reads drops its values."""


class KeyedProcessFunction(ABC, Generic[IN, OUT]):
    """A function over a keyed stream with access to keyed state.

    Example::

        class Count(KeyedProcessFunction):
            def open(self, ctx):
                self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

            def process_element(self, value, ctx):
                n = self.count.value() + 1
                self.count.update(n)
                yield (ctx.current_key, n)

    ``process_element`` returns an iterable of output records (a generator, a
    list, or ``None`` for nothing).
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per task before the first record; register state here."""

    @abstractmethod
    def process_element(self, value: IN, ctx: RuntimeContext) -> Iterable[OUT] | None: ...

    def on_timer(self, timestamp: int, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """A timer of ``ctx.current_key`` fired. ``ctx.time_domain`` says which:
        an event-time timer when the watermark reached ``timestamp`` (at the
        latest at the end of input, or on ``stop --drain``), a processing-time
        timer when the wall clock did. Returns output records like
        ``process_element``."""
        return None

    def end_input(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """Called once when the input is exhausted (bounded jobs)."""
        return None

    def finish(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """Called after ``end_input``: last chance to emit records."""
        return None

    def close(self) -> None:
        """Release resources; always called, also on failure."""


KeySelector = Callable[[Any], Any]
