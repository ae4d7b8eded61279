"""Event time: watermarks from sources, and the timers of keyed functions
(event time and processing time).

A source given a :class:`WatermarkStrategy` stamps its stream with watermarks:
every ``interval`` seconds (if it advanced) it emits
``W = max timestamp read so far - max_out_of_orderness - 1``, a promise that no
later record of that source task has a timestamp ``<= W``. (Periodic, as
Flink's auto-watermark interval: a watermark is an in-band event that sends
the buffered records before it, and a slow source's batches are small.)
Tasks with several inputs take the smallest watermark of their live input
channels. A ``KeyedProcessFunction`` registers timers with
``ctx.timer_service.register_event_time_timer(ts)``; ``on_timer(ts, ctx)`` runs
for its key once the watermark reaches ``ts``.

Timestamps are integers in a unit of your choice (milliseconds, as in Flink,
or plain sequence numbers). At the end of input — exhausted, or ``stop
--drain`` — every source emits :data:`MAX_WATERMARK`: all pending timers fire
before ``end_input()`` and ``finish()``. A stop without drain keeps the timers
in the savepoint, with the keyed state of their key group. A source task
reads its splits (files, ranges) one after another under one watermark: where
their event times overlap, allow for it in ``max_out_of_orderness``. Watermarks are not
checkpointed: a restored job starts at :data:`MIN_WATERMARK` and its sources
produce watermarks again from the records they replay.

Processing-time timers (``register_processing_time_timer(ms)``, wall-clock
milliseconds since the epoch) fire when the task's clock reaches them; they
are kept in checkpoints and savepoints like event-time timers, fire at once
when restored overdue, and do not fire at the end of input (as in Flink).
In ``on_timer``, ``ctx.time_domain`` says which kind fired.

Example::

    from lockgate import WatermarkStrategy

    events = p.source(FileSource("events/", format="jsonl"), uid="events",
                      watermarks=WatermarkStrategy(lambda e: e["ts"],
                                                   max_out_of_orderness=5_000))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["END_OF_TIME", "MAX_WATERMARK", "MIN_WATERMARK", "TimeDomain", "TimerService",
           "WatermarkStrategy"]

MIN_WATERMARK = float("-inf")
"""The watermark of a stream that has promised nothing yet."""
MAX_WATERMARK = float("inf")
"""The watermark at the end of input: every event-time timer fires."""
END_OF_TIME = 2**63 - 1
"""The largest timer timestamp: an event-time timer there fires only at the
end of input (``MAX_WATERMARK``)."""


@dataclass(frozen=True)
class WatermarkStrategy:
    """Bounded out-of-orderness: records may arrive up to
    ``max_out_of_orderness`` late relative to the largest timestamp seen so far
    (0: timestamps never decrease within a source task)."""

    timestamp_of: Callable[[Any], int]
    max_out_of_orderness: int = 0
    interval: float = 0.2
    """Seconds between two watermarks of a source task (0: after every batch)."""
    idle_timeout: float | None = None
    """Seconds without a record after which a source task declares itself idle
    (Flink's ``withIdleness``): downstream tasks leave it out when they take
    the smallest watermark of their inputs, so a source task with nothing to
    read (an unbounded source, a split-less subtask) does not hold event time
    back forever. Its next records make it active again; records older than
    the watermark the others moved on to are then late. ``None``: never idle."""

    def __post_init__(self) -> None:
        if not callable(self.timestamp_of):
            raise TypeError("WatermarkStrategy.timestamp_of must be a function record -> int")
        if self.max_out_of_orderness < 0:
            raise ValueError("max_out_of_orderness must be >= 0")
        if self.interval < 0:
            raise ValueError("the watermark interval must be >= 0 seconds")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be > 0 seconds, or None for never idle")

    def watermark_after(self, batch: list[Any]) -> int:
        """The watermark a source task may emit after ``batch`` (not empty)."""
        return max(map(self.timestamp_of, batch)) - self.max_out_of_orderness - 1


class TimeDomain(StrEnum):
    """Which clock a timer that fires belongs to (``ctx.time_domain`` in ``on_timer``)."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService(ABC):
    """Timers of the current key (``ctx.timer_service``), in event time or in
    processing time."""

    @abstractmethod
    def current_watermark(self) -> float:
        """The operator's event time: ``MIN_WATERMARK`` until the first watermark."""

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the
        watermark reaches ``timestamp`` (once per key and timestamp)."""

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None:
        """Forget a timer of the current key (nothing if there is none)."""

    @abstractmethod
    def current_processing_time(self) -> int:
        """The task's wall-clock time, in milliseconds since the epoch."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the
        wall clock reaches ``timestamp`` (ms since the epoch; once per key and
        timestamp). A timer restored from a checkpoint or savepoint whose time
        has passed fires right after the restore. At the end of input, and on
        ``stop --drain``, pending processing-time timers do not fire (as in
        Flink); to act per key at the end of input, register an event-time
        timer as well (say at ``END_OF_TIME``): every event-time timer fires
        at the end of input."""

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Forget a processing-time timer of the current key (nothing if there is none)."""
