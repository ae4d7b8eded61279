"""Operators of two inputs: the base (:class:`TwoInputOperator`) and the
``CoProcessFunction`` operator.

A task whose first operator has several inputs knows each channel's input
(``InputEdge.input_index``) and hands each batch to
``process_input(index, batch)`` (``OperatorChain.process_input``); every
other part of the task is as for one input: the watermark is the smallest of
all channels', a barrier is aligned across all of them, the input ends when
every channel ended. Keyed two-input operators keep their state and timers
in one keyed state backend: both inputs' records of a key see the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lockgate.api.connected import CoSpec
from lockgate.api.watermarks import TimeDomain, TimerService
from lockgate.connectors.base import TaskInfo
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.operators import (
    KeyedContext,
    StreamOperator,
    fire_timers,
    open_keyed_backend,
    user_hook,
)
from lockgate.runtime.timers import KeyedTimers
from lockgate.state.serde import StateSerializer

__all__ = ["TwoInputOperator", "CoProcessOperator", "CoContext", "NoTimers"]


class TwoInputOperator(StreamOperator):
    """An operator with inputs 0 and 1; keyed when its ``CoSpec`` is."""

    def __init__(self, spec: OperatorSpec, info: TaskInfo) -> None:
        super().__init__(spec, info)
        self.co: CoSpec = spec.fn
        self.keyed = self.co.keyed
        self.has_processing_timers = self.keyed

    def open(self, serializer: StateSerializer) -> None:
        if self.keyed:
            self.backend = open_keyed_backend(self, serializer)
            self.timers: KeyedTimers | None = KeyedTimers(self.backend)
        else:
            self.timers = None

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_input(0, batch)

    def process_input(self, index: int, batch: list[Any]) -> list[Any]:
        raise NotImplementedError

    def input_watermark(self, index: int, watermark: float) -> None:
        """Input ``index`` alone is at ``watermark`` (it only advances); the
        operator's event time (``process_watermark``) is the smallest of
        all inputs'. Only an operator that judges each input's records by
        that input's own watermark needs it (the interval join)."""


class NoTimers(TimerService):
    def current_watermark(self) -> float:
        raise PipelineDefinitionError("timers need keyed streams (key both inputs)")

    def register_event_time_timer(self, timestamp: int) -> None:
        self.current_watermark()

    def delete_event_time_timer(self, timestamp: int) -> None:
        self.current_watermark()

    def current_processing_time(self) -> int:
        raise PipelineDefinitionError("timers need keyed streams (key both inputs)")

    def register_processing_time_timer(self, timestamp: int) -> None:
        self.current_watermark()

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self.current_watermark()


class CoContext(KeyedContext):
    """The context of a two-input function: keyed state and timers of the
    current key when keyed; side outputs always."""

    @property
    def current_key(self) -> Any:
        if self._op.backend is None:
            raise PipelineDefinitionError("current_key needs keyed streams")
        return self._op.backend.current_key

    def _state(self, descriptor: object, expected: type) -> Any:
        if self._op.backend is None:
            raise PipelineDefinitionError(
                "keyed state needs keyed streams: key both inputs (or use broadcast state)")
        return super()._state(descriptor, expected)


class CoProcessOperator(TwoInputOperator):
    """Runs a ``CoProcessFunction``: input 0 to ``process_element1``, input 1
    to ``process_element2``, timers to ``on_timer``."""

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        self.fn = self.co.function
        self.ctx = self._context()
        self.elements: tuple[Callable[..., Any], ...] = self._elements()
        with user_hook(self.uid, "open"):
            self.fn.open(self.ctx)

    def _elements(self) -> tuple[Callable[..., Any], ...]:
        return (self.fn.process_element1, self.fn.process_element2)

    def _context(self) -> CoContext:
        return CoContext(self, self.timers if self.timers is not None else NoTimers())

    def process_input(self, index: int, batch: list[Any]) -> list[Any]:
        element, ctx, backend = self.elements[index], self.ctx, self.backend
        out: list[Any] = []
        extend = out.extend
        if backend is None:
            for r in batch:
                res = element(r, ctx)
                if res is not None:
                    extend(res)
            return out
        key_of = self.co.key_selectors[index]
        assert key_of is not None
        for r in batch:
            backend.current_key = key_of(r)
            res = element(r, ctx)
            if res is not None:
                extend(res)
        return out

    # -- timers (keyed) ---------------------------------------------------
    def process_watermark(self, watermark: float) -> list[Any]:
        if self.timers is None:
            return []
        return self._fire(self.timers.due(watermark), TimeDomain.EVENT_TIME)

    def next_processing_timer(self) -> float | None:
        return self.timers.processing.next_timestamp() if self.timers is not None else None

    def process_processing_time(self, now: int) -> list[Any]:
        assert self.timers is not None
        return self._fire(self.timers.due_processing(now), TimeDomain.PROCESSING_TIME)

    def _fire(self, due: Iterator[tuple[Any, int]], domain: TimeDomain) -> list[Any]:
        return fire_timers(self, self.fn.on_timer, self.ctx, due, domain)

    def end_input(self) -> list[Any]:
        with user_hook(self.uid, "end_input"):
            return list(self.fn.end_input(self.ctx) or [])

    def finish(self) -> list[Any]:
        with user_hook(self.uid, "finish"):
            return list(self.fn.finish(self.ctx) or [])

    def close(self) -> None:
        self.fn.close()
