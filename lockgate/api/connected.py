"""Several inputs: ``union`` of streams and ``connect`` of two streams into a
``CoProcessFunction``.

* ``a.union(b, c)`` (``DataStream.union``): one stream of the records of
  all (no operator of its own: the next operator reads every input's
  edges, ``graph/jobgraph.py``).
* ``a.connect(b).process(CoProcessFunction)``: records of ``a`` go to
  ``process_element1``, those of ``b`` to ``process_element2``, in one
  operator. Keyed (``a.key_by(ka).connect(b.key_by(kb))``, or
  ``a.connect(b).key_by(ka, kb)``): records of equal keys of both inputs
  reach the same task, and both methods see the keyed state and timers of
  the current key (``on_timer`` too).

The operator's watermark is the smallest of both inputs'; a checkpoint's
barrier is aligned across both inputs, like any task with several channels.

Example::

    class Match(CoProcessFunction):
        def open(self, ctx):
            self.seen = ctx.get_state(ValueStateDescriptor("seen"))

        def process_element1(self, order, ctx):
            self.seen.update(order)
            return None

        def process_element2(self, payment, ctx):
            order = self.seen.value()
            return [(order, payment)] if order is not None else None

    orders.key_by(lambda o: o["id"]).connect(payments.key_by(lambda p: p["order"])) \\
          .process(Match(), uid="match")
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Generic, NamedTuple, TypeVar

from lockgate.api.functions import RuntimeContext
from lockgate.api.nodes import add_multi_input_node
from lockgate.api.plan import OperatorKind
from lockgate.api.stream import DataStream, KeyedStream, input_of
from lockgate.errors import PipelineDefinitionError

__all__ = ["CoProcessFunction", "ConnectedStreams", "CoSpec", "connect"]

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
OUT = TypeVar("OUT")


class CoProcessFunction(ABC, Generic[IN1, IN2, OUT]):
    """A function of two inputs (``connect(...).process``). Both methods
    return an iterable of output records (or ``None``) and may emit to side
    outputs (``ctx.output(tag, value)``). On keyed connected streams they
    see the current key's keyed state and timers, shared by both inputs."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per task before the first record; register state here."""

    @abstractmethod
    def process_element1(self, value: IN1, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """A record of the first input."""

    @abstractmethod
    def process_element2(self, value: IN2, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """A record of the second input."""

    def on_timer(self, timestamp: int, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """A timer of ``ctx.current_key`` fired (keyed only; as in
        ``KeyedProcessFunction.on_timer``)."""
        return None

    def end_input(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """Called once when both inputs are exhausted (bounded jobs)."""
        return None

    def finish(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """Called after ``end_input``: last chance to emit records."""
        return None

    def close(self) -> None:
        """Release resources; always called, also on failure."""


class CoSpec(NamedTuple):
    """What a two-input operator runs (``OperatorSpec.fn``): the user's
    function, each input's key selector (keyed: the first set), and what the
    kind of operator needs besides (broadcast state descriptors, join
    bounds and timestamps). A tuple, so that the driver finds the job
    script's classes inside it."""

    function: Any
    key_selectors: tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]
    extra: Any = None
    operator_state_mode: str = "split"
    """How the operator's non-keyed state is restored (``OperatorStateMode``):
    ``union`` for broadcast state and the interval join's watermark."""

    @property
    def keyed(self) -> bool:
        return self.key_selectors[0] is not None


def connect(first: DataStream[Any] | KeyedStream[Any], other: Any) -> Any:
    """``first.connect(other)`` of two streams (a ``BroadcastStream`` is
    :func:`lockgate.api.broadcast.connect`'s)."""
    if isinstance(first, KeyedStream) != isinstance(other, KeyedStream):
        raise PipelineDefinitionError(
            "connect a keyed stream with a keyed stream (or a BroadcastStream): key both "
            "sides with key_by, or neither and use .key_by(key1, key2) on the connected streams")
    return ConnectedStreams(first, other)


class ConnectedStreams(Generic[IN1, IN2]):
    """Two streams to be processed by one ``CoProcessFunction``."""

    def __init__(self, first: DataStream[IN1] | KeyedStream[IN1],
                 second: DataStream[IN2] | KeyedStream[IN2]) -> None:
        self._first = first
        self._second = second

    def key_by(self, key1: Callable[[IN1], Any],
               key2: Callable[[IN2], Any]) -> ConnectedStreams[IN1, IN2]:
        """Key both inputs (``key1`` for the first, ``key2`` for the second):
        the function then has keyed state and timers shared by both."""
        if not (isinstance(self._first, DataStream) and isinstance(self._second, DataStream)):
            raise PipelineDefinitionError("these connected streams are keyed already")
        return ConnectedStreams(self._first.key_by(key1), self._second.key_by(key2))

    def process(self, fn: CoProcessFunction[IN1, IN2, OUT], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[OUT]:
        if not isinstance(fn, CoProcessFunction):
            raise PipelineDefinitionError(f"{fn!r} is not a CoProcessFunction")
        a, b = input_of(self._first), input_of(self._second)
        spec = CoSpec(fn, (a.key_selector, b.key_selector))
        node = add_multi_input_node(self._first._p, OperatorKind.CO_PROCESS, spec, uid,
                                    parallelism, [a, b])
        node.name = type(fn).__name__
        return DataStream(self._first._p, node)
