"""Window triggers: when a window fires and when its contents go (Flink's
``Trigger``), given with ``windowed.trigger(t)``.

A trigger is called for each record added to a window (``on_element``) and
for each timer of the window's key that comes due (``on_event_time``,
``on_processing_time``); it answers with a :class:`TriggerResult`::

    class EveryThird(Trigger):
        COUNT = ValueStateDescriptor("n", default=0)

        def on_element(self, element, timestamp, window, ctx):
            n = ctx.get_state(self.COUNT)
            n.update(n.value() + 1)
            if n.value() % 3 == 0:
                return TriggerResult.FIRE
            ctx.register_event_time_timer(window.max_timestamp())
            return TriggerResult.CONTINUE

        def on_event_time(self, time, window, ctx):
            return TriggerResult.FIRE if time == window.max_timestamp() \\
                else TriggerResult.CONTINUE

        def clear(self, window, ctx):
            ctx.get_state(self.COUNT).clear()

What keeps it simple (and differs from Flink):

- Timers carry no window: a due timer of a key calls the trigger for every
  window of that key (with contents or trigger state), so a trigger checks
  ``time`` against what it registered (as the built-ins do). Deleting a
  timer deletes it for every window of the key.
- Trigger state (``ctx.get_state(ValueStateDescriptor)``) is per key and
  window, kept in the window operator's keyed state: checkpointed and moved
  on rescale by key group like the windows.
- A custom trigger replaces the firing, not the clean-up: a time window's
  contents, trigger state and timers still go at ``end - 1 +
  allowed_lateness`` (``clear`` is called then). ``GlobalWindows`` never
  go: purge them (``FIRE_AND_PURGE``, :class:`PurgingTrigger`).
- Session (merging) windows take no custom trigger.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import Any

from lockgate.api.windows import GlobalWindow, TimeWindow
from lockgate.state.backend import ValueStateDescriptor

__all__ = [
    "ContinuousEventTimeTrigger",
    "CountTrigger",
    "EventTimeTrigger",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
    "TriggerState",
]

Window = TimeWindow | GlobalWindow


class TriggerResult(StrEnum):
    """What happens to the window: ``FIRE`` emits its result and keeps its
    contents, ``PURGE`` drops its contents, ``FIRE_AND_PURGE`` both."""

    CONTINUE = "continue"
    FIRE = "fire"
    PURGE = "purge"
    FIRE_AND_PURGE = "fire_and_purge"

    @property
    def fires(self) -> bool:
        return self in (TriggerResult.FIRE, TriggerResult.FIRE_AND_PURGE)

    @property
    def purges(self) -> bool:
        return self in (TriggerResult.PURGE, TriggerResult.FIRE_AND_PURGE)


class TriggerState(ABC):
    """A value of the current key and window (``ctx.get_state``)."""

    @abstractmethod
    def value(self) -> Any: ...

    @abstractmethod
    def update(self, value: Any) -> None: ...

    @abstractmethod
    def clear(self) -> None: ...


class TriggerContext(ABC):
    """What a trigger sees: the clocks, timers of the current key, and its
    state of the current key and window."""

    @abstractmethod
    def current_watermark(self) -> float: ...

    @abstractmethod
    def current_processing_time(self) -> int: ...

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def get_state(self, descriptor: ValueStateDescriptor) -> TriggerState:
        """The trigger's value ``descriptor.name`` of the current key and window."""


class Trigger(ABC):
    """Decides when a window fires (see the module's docs)."""

    @abstractmethod
    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        """A record was added to ``window`` (``timestamp``: its event time, or
        the task's clock for processing-time windows)."""

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        """An event-time timer of the key at ``time`` came due."""
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window,
                           ctx: TriggerContext) -> TriggerResult:
        """A processing-time timer of the key at ``time`` came due."""
        return TriggerResult.CONTINUE

    def clear(self, window: Window, ctx: TriggerContext) -> None:  # noqa: B027 - optional
        """The window goes: delete its timers (its state goes anyway)."""


class EventTimeTrigger(Trigger):
    """Fires when the watermark passes the window's end (the default of
    event-time windows; late records fire it again at once)."""

    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        assert isinstance(window, TimeWindow), "EventTimeTrigger needs time windows"
        if window.max_timestamp() <= ctx.current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if isinstance(window, TimeWindow) \
            and time == window.max_timestamp() else TriggerResult.CONTINUE

    def __repr__(self) -> str:
        return "EventTimeTrigger()"


class ProcessingTimeTrigger(Trigger):
    """Fires when the task's clock passes the window's end."""

    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        assert isinstance(window, TimeWindow), "ProcessingTimeTrigger needs time windows"
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window,
                           ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if isinstance(window, TimeWindow) \
            and time == window.max_timestamp() else TriggerResult.CONTINUE

    def __repr__(self) -> str:
        return "ProcessingTimeTrigger()"


class CountTrigger(Trigger):
    """Fires every ``n``-th record of the window (the count restarts)."""

    COUNT = ValueStateDescriptor("count", default=0)

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"CountTrigger needs a positive count, got {n!r}")
        self.n = n

    @classmethod
    def of(cls, n: int) -> CountTrigger:
        return cls(n)

    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        count = ctx.get_state(self.COUNT)
        c = count.value() + 1
        if c >= self.n:
            count.clear()
            return TriggerResult.FIRE
        count.update(c)
        return TriggerResult.CONTINUE

    def __repr__(self) -> str:
        return f"CountTrigger.of({self.n})"


class ContinuousEventTimeTrigger(Trigger):
    """Fires every ``interval`` of event time while the window is open (at
    ``interval`` multiples, ``- 1``), and when the watermark passes its end."""

    NEXT = ValueStateDescriptor("next", default=None)

    def __init__(self, interval: int) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ValueError(f"ContinuousEventTimeTrigger needs a positive interval, "
                             f"got {interval!r}")
        self.interval = interval

    @classmethod
    def of(cls, interval: int) -> ContinuousEventTimeTrigger:
        return cls(interval)

    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        assert isinstance(window, TimeWindow), "ContinuousEventTimeTrigger needs time windows"
        if window.max_timestamp() <= ctx.current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        nxt = ctx.get_state(self.NEXT)
        if nxt.value() is None:
            t = timestamp - timestamp % self.interval + self.interval - 1
            nxt.update(t)
            ctx.register_event_time_timer(t)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        assert isinstance(window, TimeWindow)
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        nxt = ctx.get_state(self.NEXT)
        if nxt.value() != time:
            return TriggerResult.CONTINUE  # another window's timer
        t = time + self.interval
        nxt.update(t)
        ctx.register_event_time_timer(t)
        return TriggerResult.FIRE

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        nxt = ctx.get_state(self.NEXT)
        if nxt.value() is not None:
            ctx.delete_event_time_timer(nxt.value())

    def __repr__(self) -> str:
        return f"ContinuousEventTimeTrigger.of({self.interval})"


class PurgingTrigger(Trigger):
    """``trigger``, with every ``FIRE`` made ``FIRE_AND_PURGE``."""

    def __init__(self, trigger: Trigger) -> None:
        if not isinstance(trigger, Trigger):
            raise ValueError(f"PurgingTrigger wraps a Trigger, got {trigger!r}")
        self.trigger = trigger

    @classmethod
    def of(cls, trigger: Trigger) -> PurgingTrigger:
        return cls(trigger)

    @staticmethod
    def _purge(r: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if r.fires else r

    def on_element(self, element: Any, timestamp: int, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        return self._purge(self.trigger.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return self._purge(self.trigger.on_event_time(time, window, ctx))

    def on_processing_time(self, time: int, window: Window,
                           ctx: TriggerContext) -> TriggerResult:
        return self._purge(self.trigger.on_processing_time(time, window, ctx))

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        self.trigger.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger.of({self.trigger!r})"
