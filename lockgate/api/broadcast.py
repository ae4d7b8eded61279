"""Broadcast state: a low-volume stream (rules, configuration) sent to every
task of another stream's operator, which keeps it as *broadcast state*.

    RULES = MapStateDescriptor("rules")
    rules = rule_stream.broadcast(RULES)
    events.key_by(lambda e: e["user"]).connect(rules).process(Apply(), uid="apply")

``process_broadcast_element(rule, ctx)`` sees the broadcast state writable
(``ctx.get_broadcast_state(RULES).put(k, v)``); ``process_element(event,
ctx)`` read-only. Every task receives every broadcast record and must change
its broadcast state the same way (a function of the record and the state
only), so all tasks hold the same state, as in Flink.

Checkpoints: every task stores its copy of the broadcast state (as union
operator state, one entry per task). On restore at the same parallelism task
``i`` takes the copy of task ``i``; at another parallelism, task ``i`` takes
the copy of old task ``i % old_parallelism`` (round-robin, as Flink does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from lockgate.api.connected import CoSpec
from lockgate.api.connected import connect as connect_streams
from lockgate.api.functions import RuntimeContext
from lockgate.api.nodes import StreamInput, add_multi_input_node
from lockgate.api.plan import OperatorKind, Partitioning
from lockgate.api.stream import DataStream, KeyedStream, input_of
from lockgate.errors import PipelineDefinitionError
from lockgate.state.backend import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from lockgate.state.values import ATOMIC, private_copy

__all__ = ["BroadcastStream", "BroadcastConnectedStream", "BroadcastProcessFunction",
           "KeyedBroadcastProcessFunction", "BroadcastState", "ReadOnlyBroadcastState",
           "BroadcastContext", "connect"]

IN1 = TypeVar("IN1")
IN2 = TypeVar("IN2")
OUT = TypeVar("OUT")
Descriptor = ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor


def _copy(v: Any) -> Any:
    return v if v.__class__ in ATOMIC else private_copy(v)


class ReadOnlyBroadcastState:
    """A broadcast state as ``process_element`` sees it: reads only; values
    are your own copies."""

    def __init__(self, table: dict[Any, Any]) -> None:
        self._table = table

    def get(self, key: Any, default: Any = None) -> Any:
        v = self._table.get(key, _MISSING)
        return default if v is _MISSING else _copy(v)

    def contains(self, key: Any) -> bool:
        return key in self._table

    def keys(self) -> list[Any]:
        return [_copy(k) for k in self._table]

    def items(self) -> list[tuple[Any, Any]]:
        return [(_copy(k), _copy(v)) for k, v in self._table.items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._table)


_MISSING = object()


class BroadcastState(ReadOnlyBroadcastState):
    """A broadcast state as ``process_broadcast_element`` sees it: a map that
    stores copies of what it is given."""

    def put(self, key: Any, value: Any) -> None:
        self._table[_copy(key)] = _copy(value)

    def remove(self, key: Any) -> None:
        self._table.pop(key, None)

    def clear(self) -> None:
        self._table.clear()


class BroadcastContext(RuntimeContext, ABC):
    """The context of a broadcast process function: a ``RuntimeContext``
    (keyed state and timers of the current key in ``process_element`` of a
    keyed one) and the broadcast state."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        """The broadcast state of ``descriptor`` (one given to
        ``broadcast(...)``): a ``BroadcastState`` in
        ``process_broadcast_element``, read-only in ``process_element``."""

    def apply_to_keyed_state(self, descriptor: Descriptor,
                             fn: Callable[[Any, Any], None]) -> None:
        """In ``process_broadcast_element`` of a keyed function: call
        ``fn(key, state)`` for every key of this task that has a value in
        the keyed state ``descriptor``, with ``state`` that key's state
        (read it, update it, clear it: Flink's ``applyToKeyedState``).
        Every task visits its own keys; on heap and RocksDB alike."""
        raise PipelineDefinitionError(
            "apply_to_keyed_state is for process_broadcast_element of a "
            "KeyedBroadcastProcessFunction")


class _BroadcastFunction(ABC, Generic[IN1, IN2, OUT]):
    def open(self, ctx: RuntimeContext) -> None:
        """Called once per task before the first record."""

    @abstractmethod
    def process_element(self, value: IN1, ctx: BroadcastContext) -> Iterable[OUT] | None:
        """A record of the (keyed or not) data input; broadcast state read-only."""

    @abstractmethod
    def process_broadcast_element(self, value: IN2,
                                  ctx: BroadcastContext) -> Iterable[OUT] | None:
        """A record of the broadcast input; broadcast state writable. Every
        task gets every such record: change the state the same way in all
        (from the record and the state only). In a keyed function there is
        no current key here."""

    def end_input(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        return None

    def finish(self, ctx: RuntimeContext) -> Iterable[OUT] | None:
        return None

    def close(self) -> None:
        """Release resources; always called, also on failure."""


class BroadcastProcessFunction(_BroadcastFunction[IN1, IN2, OUT]):
    """``stream.connect(broadcast_stream).process(...)``: a non-keyed data
    input and a broadcast input."""


class KeyedBroadcastProcessFunction(_BroadcastFunction[IN1, IN2, OUT]):
    """``keyed.connect(broadcast_stream).process(...)``: ``process_element``
    has the keyed state and timers of the current key; ``on_timer`` fires
    like a ``KeyedProcessFunction``'s."""

    def on_timer(self, timestamp: int, ctx: BroadcastContext) -> Iterable[OUT] | None:
        """A timer of ``ctx.current_key`` fired; broadcast state read-only."""
        return None


class BroadcastStream(Generic[IN2]):
    """A stream to be broadcast, with the descriptors of its broadcast state."""

    def __init__(self, stream: DataStream[IN2], descriptors: tuple[Any, ...]) -> None:
        if not isinstance(stream, DataStream):
            raise PipelineDefinitionError("broadcast() is a method of a DataStream")
        if not descriptors or not all(isinstance(d, MapStateDescriptor) for d in descriptors):
            raise PipelineDefinitionError(
                "broadcast(...) takes one or more MapStateDescriptors (the broadcast state)")
        names = [d.name for d in descriptors]
        if len(set(names)) != len(names):
            raise PipelineDefinitionError(f"broadcast state names repeat: {names}")
        self._stream = stream
        self.descriptors = descriptors


class BroadcastConnectedStream(Generic[IN1, IN2]):
    """A (keyed or not) stream connected with a ``BroadcastStream``."""

    def __init__(self, first: DataStream[IN1] | KeyedStream[IN1],
                 broadcast: BroadcastStream[IN2]) -> None:
        self._first = first
        self._broadcast = broadcast

    def process(self, fn: _BroadcastFunction[IN1, IN2, OUT], *, uid: str | None = None,
                parallelism: int | None = None) -> DataStream[OUT]:
        keyed = isinstance(self._first, KeyedStream)
        wanted = KeyedBroadcastProcessFunction if keyed else BroadcastProcessFunction
        if not isinstance(fn, wanted):
            raise PipelineDefinitionError(
                f"{fn!r} is not a {wanted.__name__} (the data stream is "
                f"{'keyed' if keyed else 'not keyed'})")
        a = input_of(self._first)
        b = self._broadcast._stream
        spec = CoSpec(fn, (a.key_selector, None), self._broadcast.descriptors, "union")
        node = add_multi_input_node(
            self._first._p, OperatorKind.BROADCAST_PROCESS, spec, uid, parallelism,
            [a, StreamInput(b._node, Partitioning.BROADCAST, None, b._tag)])
        node.name = type(fn).__name__
        return DataStream(self._first._p, node)


def connect(first: DataStream[Any] | KeyedStream[Any], other: Any) -> Any:
    """What ``first.connect(other)`` gives: with a ``BroadcastStream`` a
    ``BroadcastConnectedStream``, with another stream ``ConnectedStreams``
    (:func:`lockgate.api.connected.connect`)."""
    if isinstance(other, BroadcastStream):
        return BroadcastConnectedStream(first, other)
    return connect_streams(first, other)
