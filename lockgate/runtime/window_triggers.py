"""The window operator with a custom trigger (``windowed.trigger(t)``, see
:mod:`lockgate.api.triggers`): records and due timers go to the trigger,
whose answers fire and purge windows.

Trigger state is the keyed map state ``_trigger_state``: key ->
``{(start, end, name) | (name,): value}`` (``(name,)`` for the global
window), so it is checkpointed and moves on rescale by key group like the
window contents. Stored values are copies, replaced on update, never
changed in place. Timers are the operator's :class:`KeyedTimers`; a time
window's clean-up timer (``end - 1 + allowed_lateness``, or ``end - 1`` on
the clock) is registered by the operator, not by the trigger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.api.triggers import Trigger, TriggerContext, TriggerResult, TriggerState
from lockgate.api.watermarks import TimeDomain
from lockgate.api.windows import GlobalWindow, GlobalWindows, TimeWindow
from lockgate.errors import LockgateError, UserFunctionError
from lockgate.runtime.operators import hook_error, user_hook
from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.values import ATOMIC, private_copy

if TYPE_CHECKING:
    from lockgate.api.windows import WindowAssigner, WindowSpec
    from lockgate.graph.jobgraph import OperatorSpec
    from lockgate.runtime.timers import KeyedTimers
    from lockgate.state.backends import KeyedStateBackend

__all__ = ["TRIGGER_STATE", "TriggerRunner"]

TRIGGER_STATE = "_trigger_state"
"""The keyed map state of the triggers' values per window."""

Window = tuple[int, int] | None


class TriggerHost(Protocol):
    """What the trigger runner uses of its window operator
    (``runtime.windows.WindowOperator``): its state, timers and clock, and
    the window steps the trigger's answers call for."""

    @property
    def uid(self) -> str: ...

    @property
    def spec(self) -> OperatorSpec: ...

    @property
    def window_spec(self) -> WindowSpec: ...

    @property
    def assigner(self) -> WindowAssigner: ...

    @property
    def event_time(self) -> bool: ...

    @property
    def lateness(self) -> int: ...

    @property
    def backend(self) -> KeyedStateBackend | None: ...

    @property
    def timers(self) -> KeyedTimers: ...

    @property
    def windows(self) -> dict[Any, dict[Window, Any]]: ...

    def clock(self) -> int: ...

    def emit_side(self, tag: str, value: Any) -> None: ...

    def _add(self, key: Any, w: Window, r: Any) -> None: ...

    def _fire(self, key: Any, w: Window, out: list[Any]) -> None: ...

    def _remove(self, key: Any, w: Window) -> None: ...

    def _cleanup_time(self, w: tuple[int, int]) -> int: ...


def _slot(w: Window, name: str) -> tuple[Any, ...]:
    return (name,) if w is None else (w[0], w[1], name)


def _window_of(slot: Any) -> Window:
    return (slot[0], slot[1]) if isinstance(slot, tuple) and len(slot) == 3 else None


def _copy(v: Any) -> Any:
    return v if v.__class__ in ATOMIC else private_copy(v)


class _State(TriggerState):
    def __init__(self, ctx: _Context, descriptor: ValueStateDescriptor) -> None:
        self._ctx, self._d = ctx, descriptor

    def value(self) -> Any:
        table = self._ctx.states.get(self._ctx.key)
        v = table.get(_slot(self._ctx.window, self._d.name), self) if table else self
        return _copy(self._d.default) if v is self else _copy(v)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        states, key = self._ctx.states, self._ctx.key
        table = states.get(key)
        table = {} if table is None else table
        table[_slot(self._ctx.window, self._d.name)] = _copy(value)
        states[key] = table

    def clear(self) -> None:
        states, key = self._ctx.states, self._ctx.key
        table = states.get(key)
        if table and table.pop(_slot(self._ctx.window, self._d.name), None) is not None:
            if table:
                states[key] = table
            else:
                del states[key]


class _Context(TriggerContext):
    def __init__(self, op: TriggerHost) -> None:
        self._op = op
        self.states: Any = op.backend.raw(TRIGGER_STATE) if op.backend is not None else {}
        self.key: Any = None
        self.window: Window = None

    def current_watermark(self) -> float:
        return self._op.timers.watermark

    def current_processing_time(self) -> int:
        return self._op.clock()

    def register_event_time_timer(self, timestamp: int) -> None:
        self._op.timers.register_event_time_timer(timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.register_processing_time_timer(timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete_event_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete_processing_time_timer(timestamp)

    def get_state(self, descriptor: ValueStateDescriptor) -> TriggerState:
        if not isinstance(descriptor, ValueStateDescriptor):
            raise TypeError(f"a trigger's get_state takes a ValueStateDescriptor, "
                            f"got {descriptor!r}")
        return _State(self, descriptor)


class TriggerRunner:
    """Runs a window operator's records and timers through its trigger."""

    def __init__(self, op: TriggerHost, trigger: Trigger) -> None:
        self.op, self.trigger = op, trigger
        self.ctx = _Context(op)
        self.global_window = isinstance(op.assigner, GlobalWindows)

    def _call(self, hook: str, call: Callable[..., Any], key: Any, w: Window,
              *args: Any) -> TriggerResult:
        """``call`` (the trigger's method ``hook``) with ``args``, the window and the context."""
        ctx = self.ctx
        ctx.key, ctx.window = key, w
        window = GlobalWindow() if w is None else TimeWindow(*w)
        try:  # user_hook's handling, inline: a call per record and window
            res = call(*args, window, ctx)
        except LockgateError:
            raise
        except Exception as e:
            raise hook_error(self.op.uid, f"trigger.{hook}", e) from e
        if not isinstance(res, TriggerResult):
            raise UserFunctionError(f"operator {self.op.uid!r}: {type(self.trigger).__name__}."
                                    f"{hook} returned {res!r}, not a TriggerResult")
        return res

    def _act(self, key: Any, w: Window, res: TriggerResult, out: list[Any]) -> None:
        op = self.op
        if res.fires and w in op.windows.get(key, ()):
            op._fire(key, w, out)
        if res.purges:
            op._remove(key, w)

    def process(self, batch: list[Any]) -> list[Any]:
        op = self.op
        backend, key_of = op.backend, op.spec.key_selector
        assert backend is not None
        out: list[Any] = []
        timestamp_of = op.window_spec.timestamp_of
        event = op.event_time
        now = 0 if event else op.clock()
        watermark, lateness = op.timers.watermark, op.lateness
        for r in batch:
            key = backend.current_key = key_of(r)
            ts = timestamp_of(r) if timestamp_of is not None else now
            windows: Iterable[Window] = (None,) if self.global_window else op.assigner.assign(ts)
            skipped = True
            for w in windows:
                if event and w is not None and w[1] - 1 + lateness <= watermark:
                    continue  # too late for this window
                skipped = False
                op._add(key, w, r)
                res = self._call("on_element", self.trigger.on_element, key, w, r, ts)
                self._act(key, w, res, out)
            if skipped and event and ts + lateness <= watermark:
                tag = op.window_spec.late_tag
                if tag is not None:
                    op.emit_side(tag, r)
        return out

    def on_timers(self, due: Iterable[tuple[Any, int]], domain: TimeDomain) -> list[Any]:
        op = self.op
        backend = op.backend
        assert backend is not None
        out: list[Any] = []
        event = domain == TimeDomain.EVENT_TIME
        hook = "on_event_time" if event else "on_processing_time"
        call = self.trigger.on_event_time if event else self.trigger.on_processing_time
        cleans = event == op.event_time and not self.global_window
        for key, ts in due:
            backend.current_key = key
            windows = set(op.windows.get(key, ()))
            windows.update(_window_of(s) for s in self.ctx.states.get(key, ()))
            for w in sorted(windows, key=lambda v: (0, 0) if v is None else v):
                self._act(key, w, self._call(hook, call, key, w, ts), out)
                if cleans and w is not None and op._cleanup_time(w) == ts:
                    self.clear(key, w)
        return out

    def clear(self, key: Any, w: Window) -> None:
        """The window goes: the trigger's ``clear``, its contents, its state."""
        ctx = self.ctx
        ctx.key, ctx.window = key, w
        with user_hook(self.op.uid, "trigger.clear"):
            self.trigger.clear(GlobalWindow() if w is None else TimeWindow(*w), ctx)
        self.op._remove(key, w)
        table = ctx.states.get(key)
        if table:
            for slot in [s for s in table if _window_of(s) == w]:
                del table[slot]
            if table:
                ctx.states[key] = table
            else:
                del ctx.states[key]
