"""Window evictors: drop records of a ``process`` window before its function
sees them (Flink's ``Evictor``, ``evictBefore``), given with
``windowed.evictor(e)``. What an evictor drops goes from the window's state
too, so a window that fires again (a trigger's ``FIRE``, a late firing)
holds only what was kept and what came since.

    (events.key_by(lambda e: e["user"])
           .window(GlobalWindows.create())
           .trigger(CountTrigger.of(10))
           .evictor(CountEvictor.of(100))          # the last 100, every 10th record
           .process(Summary(), uid="last-100"))

Only for ``process`` windows (``reduce`` and ``aggregate`` keep no records
to evict)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["CountEvictor", "Evictor", "TimeEvictor"]


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Evictor(ABC):
    """Which records of a window its ``process`` function gets (and the
    window keeps)."""

    @abstractmethod
    def evict(self, elements: list[Any], timestamp_of: Callable[[Any], int] | None) -> list[Any]:
        """The records to keep, in their order (``timestamp_of``: the records'
        event time, None for processing-time and global windows)."""


class CountEvictor(Evictor):
    """Keeps the last ``n`` records of the window."""

    def __init__(self, n: int) -> None:
        self.n = _positive("CountEvictor's count", n)

    @classmethod
    def of(cls, n: int) -> CountEvictor:
        return cls(n)

    def evict(self, elements: list[Any], timestamp_of: Callable[[Any], int] | None) -> list[Any]:
        return elements[-self.n:]

    def __repr__(self) -> str:
        return f"CountEvictor.of({self.n})"


class TimeEvictor(Evictor):
    """Keeps the records within ``size`` of the window's newest event time
    (``timestamp > newest - size``); event-time windows only."""

    def __init__(self, size: int) -> None:
        self.size = _positive("TimeEvictor's size", size)

    @classmethod
    def of(cls, size: int) -> TimeEvictor:
        return cls(size)

    def evict(self, elements: list[Any], timestamp_of: Callable[[Any], int] | None) -> list[Any]:
        if timestamp_of is None or not elements:
            return elements
        newest = max(timestamp_of(e) for e in elements)
        return [e for e in elements if timestamp_of(e) > newest - self.size]

    def __repr__(self) -> str:
        return f"TimeEvictor.of({self.size})"
