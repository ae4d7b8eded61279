"""Timers of a keyed process function: event time and processing time.

Timers are keyed state of their operator (one map state per time domain), so
they are snapshotted, restored and rescaled by key group with the rest of it;
:class:`KeyedTimers` is the ``TimerService`` a ``KeyedProcessFunction`` sees.
"""

from __future__ import annotations

import heapq
import numbers
import time
from collections.abc import Iterator
from typing import Any

from lockgate.api.watermarks import MIN_WATERMARK, TimerService
from lockgate.state.backend import MapStateDescriptor
from lockgate.state.backends import KeyedStateBackend

__all__ = ["KeyedTimers", "processing_time", "TIMERS_STATE", "PROCESSING_TIMERS_STATE"]


class _TimerQueue:
    """The timers of one time domain of one keyed operator.

    They are keyed map state (``state``: key -> ``{timestamp: None}``, a set
    with O(1) membership, insertion and removal however many timers a key has
    pending), so they are snapshotted, restored and rescaled by key group with
    the rest of the operator's state. A heap of ``(timestamp, seq, key)``
    orders them for firing; it is rebuilt from the state after a restore, and
    entries of deleted timers are skipped when they come up. An operator that
    never registers a timer keeps no state for them."""

    def __init__(self, backend: KeyedStateBackend, state: str) -> None:
        self.backend = backend
        self.state = state
        self._table: dict[Any, dict[int, None]] | None = None
        self._heap: list[tuple[int, int, Any]] | None = None
        self._seq = 0

    def _load(self) -> tuple[dict[Any, dict[int, None]], list[tuple[int, int, Any]]]:
        if self._table is None:
            self.backend.get_state(MapStateDescriptor(self.state))
            self._table = self.backend.raw(self.state)
        if self._heap is None:  # first use: take in what a restore brought
            self._heap = [(ts, i, key) for i, (key, ts) in enumerate(
                (key, ts) for key, stamps in self._table.items() for ts in stamps)]
            heapq.heapify(self._heap)
            self._seq = len(self._heap)
        return self._table, self._heap

    def _unused(self) -> bool:
        """Never a timer, neither registered nor restored."""
        return self._table is None and self.state not in self.backend.state_kinds()

    def register(self, key: Any, timestamp: int) -> None:
        if type(timestamp) is not int:
            timestamp = _timestamp(timestamp)
        table, heap = self._load()
        stamps = table.get(key)
        if stamps is None:
            table[key] = {timestamp: None}
        elif timestamp in stamps:
            return
        else:
            stamps[timestamp] = None
        heapq.heappush(heap, (timestamp, self._seq, key))
        self._seq += 1

    def delete(self, key: Any, timestamp: int) -> None:
        table, _ = self._load()
        stamps = table.get(key)
        if stamps and timestamp in stamps:
            del stamps[timestamp]
            if not stamps:
                del table[key]

    def next_timestamp(self) -> float | None:
        """The earliest pending timer's timestamp (maybe of a deleted timer:
        ``due`` skips it), or None if there is none."""
        if self._heap is None and self._unused():
            return None
        _, heap = self._load()
        return heap[0][0] if heap else None

    def due(self, until: float) -> Iterator[tuple[Any, int]]:
        """Yield ``(key, timestamp)`` of every timer at or before ``until``, in
        timestamp order, removing each before it is yielded (a timer
        registered while they fire is due as well)."""
        if self._heap is None and self._unused():
            return
        table, heap = self._load()
        while heap and heap[0][0] <= until:
            ts, _, key = heapq.heappop(heap)
            stamps = table.get(key)
            if not stamps or ts not in stamps:
                continue  # deleted, or fired already
            del stamps[ts]
            if not stamps:
                del table[key]
            yield key, ts


def _timestamp(value: Any) -> int:
    """A timer's timestamp as an int (numpy's integers too), or a clear error."""
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
        return int(value)
    raise TypeError(f"a timer's timestamp must be an integer (event time in your unit, "
                    f"processing time in ms since the epoch), got {type(value).__name__} "
                    f"{value!r}: convert it with int()")


TIMERS_STATE = "_timers"
"""The keyed state that holds a keyed process function's event-time timers."""
PROCESSING_TIMERS_STATE = "_processing_timers"
"""The keyed state that holds a keyed process function's processing-time timers."""


def processing_time() -> int:
    """The wall-clock time of processing-time timers: milliseconds since the
    epoch, as in Flink."""
    return int(time.time() * 1000)


class KeyedTimers(TimerService):
    """Event-time and processing-time timers of one keyed operator, each
    domain a :class:`_TimerQueue` of its own state. Event-time timers fire as
    the watermark passes them (``due``); processing-time timers when the
    task's clock does (``due_processing``)."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self.watermark = MIN_WATERMARK
        self.event = _TimerQueue(backend, TIMERS_STATE)
        self.processing = _TimerQueue(backend, PROCESSING_TIMERS_STATE)

    def current_watermark(self) -> float:
        return self.watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        self.event.register(self.backend.current_key, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self.event.delete(self.backend.current_key, timestamp)

    def current_processing_time(self) -> int:
        return processing_time()

    def register_processing_time_timer(self, timestamp: int) -> None:
        self.processing.register(self.backend.current_key, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self.processing.delete(self.backend.current_key, timestamp)

    def due(self, watermark: float) -> Iterator[tuple[Any, int]]:
        """Advance to ``watermark`` and yield the event-time timers it reached."""
        self.watermark = watermark
        return self.event.due(watermark)

    def due_processing(self, now: int) -> Iterator[tuple[Any, int]]:
        """Yield the processing-time timers at or before ``now``."""
        return self.processing.due(now)
