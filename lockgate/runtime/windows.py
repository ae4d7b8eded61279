"""The window operator: windows of a keyed stream on keyed state and timers.

State (keyed by the stream's key, so snapshots, restores and rescales move it
by key group like any keyed state):

- ``_windows`` (map state): key -> ``{(start, end): contents}``; contents are
  the reduced value (``reduce``), the accumulator (``aggregate``) or the list
  of records (``process``). Count windows keep ``{None: contents}`` and the
  key's count in ``_window_counts``.
- the operator's :class:`KeyedTimers`: for an event-time window a timer at
  ``end - 1`` (it fires the window) and one at ``end - 1 + allowed_lateness``
  (it removes the window); a processing-time window fires and goes at
  ``end - 1`` on the task's clock. Timers carry no window: a timer of a key
  fires every window of that key whose firing or clean-up time it is.

Rules (Flink's ``WindowOperator``): a window is *late* once the watermark
reached ``end - 1 + allowed_lateness``; a record is added to every window of
it that is not late, and a window whose end the watermark already passed
fires again at once (a late firing: the updated result). A record all of
whose windows are late, itself at or before ``watermark - allowed_lateness``,
goes to the late side output (or is dropped). Session windows merge with the
windows of the key they intersect, before the record is added.

Value semantics: stored contents are never reachable from user code. A
mutable value is changed in place only if it was stored after the last
snapshot (``_fresh``); else it is copied first, once per checkpoint. Results
and the records handed to a ``ProcessWindowFunction`` are copies.
"""

from __future__ import annotations

from typing import Any

from lockgate.api.functions import OutputTag
from lockgate.api.watermarks import END_OF_TIME, MAX_WATERMARK, MIN_WATERMARK, TimeDomain
from lockgate.api.windows import (
    CountWindows,
    GlobalWindow,
    TimeWindow,
    WindowContext,
    WindowFunctionKind,
    WindowSpec,
    _Tumbling,
)
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.runtime.operators import KeyedContext, KeyedOperator, OperatorSnapshot, user_hook
from lockgate.runtime.timers import KeyedTimers, processing_time
from lockgate.runtime.watermark_state import restored_watermark, watermark_entry
from lockgate.runtime.window_triggers import TRIGGER_STATE, TriggerRunner
from lockgate.state.backend import MapStateDescriptor, ValueStateDescriptor
from lockgate.state.serde import StateSerializer
from lockgate.state.values import ATOMIC, private_copy

__all__ = ["WindowOperator", "WINDOWS_STATE", "WINDOW_COUNTS_STATE"]

WINDOWS_STATE = "_windows"
"""The keyed state of a window operator's windows and their contents."""
WINDOW_COUNTS_STATE = "_window_counts"
"""Count windows: the records of the key's open window."""

Window = tuple[int, int]
_MISSING = object()


class _Context(WindowContext):
    def __init__(self, op: WindowOperator) -> None:
        self._op = op
        self.window: TimeWindow | GlobalWindow = GlobalWindow()

    def current_watermark(self) -> float:
        return self._op.timers.watermark

    def current_processing_time(self) -> int:
        return self._op.clock()

    def output(self, tag: OutputTag, value: Any) -> None:
        if not isinstance(tag, OutputTag):
            raise TypeError(f"context.output takes an OutputTag, got {tag!r}")
        self._op.emit_side(tag.name, value)


class WindowOperator(KeyedOperator):
    """Runs a :class:`WindowSpec`: assigns records to windows, keeps their
    contents, fires them by timers (or by count)."""

    has_processing_timers = True
    operator_state_mode = OperatorStateMode.UNION

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        backend = self.backend
        assert backend is not None
        spec: WindowSpec = self.spec.fn
        self.window_spec = spec
        self.kind = spec.kind
        self.assigner = spec.assigner
        self.event_time = spec.assigner.event_time
        self.count = spec.assigner.size if isinstance(spec.assigner, CountWindows) else 0
        self.lateness = spec.allowed_lateness
        backend.get_state(MapStateDescriptor(WINDOWS_STATE))
        self.windows: dict[Any, dict[Window | None, Any]] = backend.raw(WINDOWS_STATE)
        if self.count:
            backend.get_state(ValueStateDescriptor(WINDOW_COUNTS_STATE))
            self.counts: dict[Any, int] = backend.raw(WINDOW_COUNTS_STATE)
        self.timers = KeyedTimers(backend)
        self.slide = spec.assigner.slide if isinstance(spec.assigner, CountWindows) else None
        self.triggers: TriggerRunner | None = None
        if spec.trigger is not None:
            backend.get_state(MapStateDescriptor(TRIGGER_STATE))
            self.triggers = TriggerRunner(self, spec.trigger)
        self.clock = processing_time
        """The task's clock (ms since the epoch); tests replace it."""
        self.ctx = KeyedContext(self, self.timers)
        self.window_ctx = _Context(self)
        self._floor = MIN_WATERMARK
        """The watermark restored from the checkpoint (this subtask's own,
        :mod:`~lockgate.runtime.watermark_state`): event time never goes back
        behind it, so a record late before a failure is late after the
        restore too."""
        self._finite = MIN_WATERMARK
        """The last watermark before the end of input's."""
        self._fresh: set[tuple[Any, Window | None]] = set()
        """Windows whose mutable contents were stored after the last snapshot."""
        self._user = spec.function if self.kind == WindowFunctionKind.PROCESS \
            else spec.window_function
        if self._user is not None:
            with user_hook(self.uid, "open"):
                self._user.open(self.ctx)

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        mark = restored_watermark(entries, self.info.task_index, self.info.parallelism,
                                  f"operator {self.uid!r}")
        if mark is not None:
            self._floor = self._finite = self.timers.watermark = mark

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        self._fresh.clear()  # the snapshot shares every stored object from now on
        keyed = super().snapshot(checkpoint_id, savepoint).keyed
        watermark = self.timers.watermark
        if watermark == MAX_WATERMARK:  # the end of input: not a promise about what follows
            watermark = self._finite
        return OperatorSnapshot(keyed, [watermark_entry(
            self.info.task_index, self.info.parallelism, watermark)])

    # -- records ----------------------------------------------------------
    def process(self, batch: list[Any]) -> list[Any]:
        backend, key_of = self.backend, self.spec.key_selector
        assert backend is not None
        out: list[Any] = []
        if self.triggers is not None:
            return self.triggers.process(batch)
        if self.count:
            add = self._count_add if self.slide is None else self._count_slide
            for r in batch:
                key = backend.current_key = key_of(r)
                add(key, r, out)
            return out
        timestamp_of = self.window_spec.timestamp_of
        now = 0 if self.event_time else self.clock()
        assign = self.assigner.assign
        watermark = self.timers.watermark
        lateness, merging = self.lateness, self.assigner.merging
        if not merging and self.kind == WindowFunctionKind.AGGREGATE and timestamp_of is not None:
            return self._aggregate(batch, out, key_of, timestamp_of, assign, watermark, lateness)
        for r in batch:
            key = backend.current_key = key_of(r)
            ts = timestamp_of(r) if timestamp_of is not None else now
            skipped = True
            for w in assign(ts):
                if merging:  # merges only with windows that are not late
                    w = self._merge(key, w)
                if self.event_time and w[1] - 1 + lateness <= watermark:
                    continue  # too late for this window
                skipped = False
                self._add(key, w, r)
                if self.event_time and w[1] - 1 <= watermark:
                    self._fire(key, w, out)  # a late firing: the updated result
            if skipped and self.event_time and ts + lateness <= watermark:
                tag = self.window_spec.late_tag
                if tag is not None:
                    self.emit_side(tag, r)
        return out

    def _aggregate(self, batch: list[Any], out: list[Any], key_of: Any, timestamp_of: Any,
                   assign: Any, watermark: float, lateness: int) -> list[Any]:
        """``process`` for an aggregate over windows that never merge, the
        common case, with ``_add``'s path for a window the record's key
        already has inlined: one dict lookup for the key, one for the
        window, the accumulator changed in place if it was stored after the
        last snapshot (the same rules as ``_add``, which takes every other
        case)."""
        backend = self.backend
        assert backend is not None
        windows, fresh, slow = self.windows, self._fresh, self._add
        add = self.window_spec.function.add
        event_time = self.event_time
        tumbling = isinstance(self.assigner, _Tumbling)
        lo = hi = 0  # a tumbling window's bounds: records in a row mostly share it
        ws: list[Window] = []
        for r in batch:
            key = backend.current_key = key_of(r)
            ts = timestamp_of(r)
            skipped = True
            if not tumbling or not lo <= ts < hi:
                ws = assign(ts)
                if tumbling:
                    lo, hi = ws[0]
            for w in ws:
                end = w[1] - 1
                if event_time and end + lateness <= watermark:
                    continue  # too late for this window
                skipped = False
                table = windows.get(key)
                old = _MISSING if table is None else table.get(w, _MISSING)
                if table is None or old is _MISSING:
                    slow(key, w, r)
                elif old.__class__ in ATOMIC:
                    new = add(r, old)
                    table[w] = new if new.__class__ in ATOMIC else private_copy(new)
                    if new.__class__ not in ATOMIC:
                        fresh.add((key, w))
                elif (key, w) in fresh:
                    new = add(r, old)
                    if new is not old:
                        table[w] = new if new.__class__ in ATOMIC else private_copy(new)
                else:
                    slow(key, w, r)
                if event_time and end <= watermark:
                    self._fire(key, w, out)  # a late firing: the updated result
            if skipped and event_time and ts + lateness <= watermark:
                tag = self.window_spec.late_tag
                if tag is not None:
                    self.emit_side(tag, r)
        return out

    def _add(self, key: Any, w: Window | None, r: Any) -> None:
        """Add ``r`` to the window ``w`` of ``key`` (made, with its timers, if new)."""
        table = self.windows.get(key)
        if table is None:
            table = self.windows[key] = {}
        old = table.get(w, _MISSING)
        kind = self.kind
        fn = self.window_spec.function
        if old is _MISSING:
            if w is not None:
                self._register(w)
            if kind == WindowFunctionKind.REDUCE:
                new = r
            elif kind == WindowFunctionKind.AGGREGATE:
                new = fn.add(r, fn.create_accumulator())
            else:
                new = [r]
        else:
            if old.__class__ not in ATOMIC and (key, w) not in self._fresh:
                old = private_copy(old)
                table[w] = old
                self._fresh.add((key, w))
            if kind == WindowFunctionKind.REDUCE:
                new = fn(old, r)
            elif kind == WindowFunctionKind.AGGREGATE:
                new = fn.add(r, old)
            else:
                old.append(r if r.__class__ in ATOMIC else private_copy(r))
                return
        if new is old or new.__class__ in ATOMIC:
            table[w] = new
        else:
            table[w] = private_copy(new)
            self._fresh.add((key, w))

    def _count_add(self, key: Any, r: Any, out: list[Any]) -> None:
        self._add(key, None, r)
        n = self.counts.get(key, 0) + 1
        if n < self.count:
            self.counts[key] = n
            return
        self.counts.pop(key, None)
        self._fire(key, None, out)
        self._remove(key, None)

    def _count_slide(self, key: Any, r: Any, out: list[Any]) -> None:
        """``count_window(size, slide)``: keep the key's last records; every
        ``slide``-th fires with the last ``size`` of them (Flink's count
        trigger and count evictor)."""
        table = self.windows.get(key)
        if table is None:
            table = self.windows[key] = {}
        buf = table.get(None)
        if buf is None:
            buf = []
        elif (key, None) not in self._fresh:
            buf = list(buf)  # its records are stored copies: never changed in place
        buf.append(r if r.__class__ in ATOMIC else private_copy(r))
        self._fresh.add((key, None))
        n = self.counts.get(key, 0) + 1
        if n < (self.slide or 1):
            table[None] = buf
            self.counts[key] = n
            return
        self.counts.pop(key, None)
        del buf[:-self.count]
        table[None] = buf
        fn, kind = self.window_spec.function, self.kind
        if kind == WindowFunctionKind.REDUCE:
            acc = private_copy(buf[0])
            for x in buf[1:]:
                acc = fn(acc, private_copy(x))
        elif kind == WindowFunctionKind.AGGREGATE:
            acc = fn.create_accumulator()
            for x in buf:
                acc = fn.add(private_copy(x), acc)
        else:
            acc = buf
        self._fire(key, None, out, acc)

    # -- session merging ---------------------------------------------------
    def _merge(self, key: Any, w: Window) -> Window:
        """Merge the new session ``w`` with the key's windows it intersects
        (touching included); returns the window the record goes to. (The
        key's windows are never late: their clean-up timers fired before.)

        A session that only grows (one window intersects ``w``: a key's
        records arriving within the gap, the common case) keeps its
        contents as they are, under the new bounds: nothing is copied, and
        whether they may change in place (``_fresh``) goes with them."""
        table = self.windows.get(key)
        if not table:
            return w
        start, end = w
        overlapping = [v for v in table if v is not None and v[0] <= end and start <= v[1]]
        if not overlapping:
            return w
        if len(overlapping) > 1:
            overlapping.sort()
        merged = (min(start, overlapping[0][0]), max(end, max(v[1] for v in overlapping)))
        fresh = self._fresh
        if len(overlapping) == 1:
            (only,) = overlapping
            if only == merged:
                return merged
            table[merged] = table.pop(only)
            if (key, only) in fresh:
                fresh.discard((key, only))
                fresh.add((key, merged))
        else:
            contents = [table.pop(v) for v in overlapping]
            for v in overlapping:
                fresh.discard((key, v))
            fn, kind = self.window_spec.function, self.kind
            if kind == WindowFunctionKind.PROCESS:
                # stored records are private copies, never changed in place
                # (user code gets copies of them): a new list of the same ones
                acc: Any = [r for c in contents for r in c]
            else:
                acc = contents[0] if contents[0].__class__ in ATOMIC \
                    else private_copy(contents[0])
                for c in contents[1:]:
                    if kind == WindowFunctionKind.REDUCE:
                        acc = fn(acc, c if c.__class__ in ATOMIC else private_copy(c))
                    else:
                        acc = fn.merge(acc, c if c.__class__ in ATOMIC else private_copy(c))
                if acc.__class__ not in ATOMIC:
                    acc = private_copy(acc)
            table[merged] = acc
            fresh.add((key, merged))
        self._register(merged)
        needed = {t for v in table if v is not None for t in self._times(v)}
        for v in overlapping:
            for t in self._times(v) - needed:
                self._delete_timer(t)
        return merged

    # -- timers -------------------------------------------------------------
    def _times(self, w: Window) -> set[int]:
        """The timer timestamps of window ``w``: its firing and its clean-up."""
        fire = w[1] - 1
        if not self.event_time:
            return {fire}
        return {fire, min(fire + self.lateness, END_OF_TIME)}

    def _cleanup_time(self, w: Window) -> int:
        return min(w[1] - 1 + self.lateness, END_OF_TIME) if self.event_time else w[1] - 1

    def _register(self, w: Window) -> None:
        timers = self.timers
        if self.triggers is not None:  # the trigger fires; the operator cleans up
            if self.event_time:
                timers.register_event_time_timer(self._cleanup_time(w))
            else:
                timers.register_processing_time_timer(w[1] - 1)
            return
        if not self.event_time:
            timers.register_processing_time_timer(w[1] - 1)
            return
        if w[1] - 1 > timers.watermark:  # else it fires at once, as a late firing
            timers.register_event_time_timer(w[1] - 1)
        if self.lateness:
            timers.register_event_time_timer(self._cleanup_time(w))

    def _delete_timer(self, ts: int) -> None:
        if self.event_time:
            self.timers.delete_event_time_timer(ts)
        else:
            self.timers.delete_processing_time_timer(ts)

    def process_watermark(self, watermark: float) -> list[Any]:
        watermark = max(watermark, self._floor)
        if watermark != MAX_WATERMARK:
            self._finite = watermark
        return self._on_timers(self.timers.due(watermark), TimeDomain.EVENT_TIME)

    def next_processing_timer(self) -> float | None:
        return self.timers.processing.next_timestamp()

    def process_processing_time(self, now: int) -> list[Any]:
        return self._on_timers(self.timers.due_processing(now), TimeDomain.PROCESSING_TIME)

    def _on_timers(self, due: Any, domain: TimeDomain) -> list[Any]:
        """Fire and clean up the windows whose time each due timer is."""
        backend = self.backend
        assert backend is not None
        if self.triggers is not None:
            return self.triggers.on_timers(due, domain)
        out: list[Any] = []
        event = domain == TimeDomain.EVENT_TIME
        if event != self.event_time:
            for _ in due:  # timers of the other clock: none are registered
                pass
            return out
        for key, ts in due:
            table = self.windows.get(key)
            if not table:
                continue
            backend.current_key = key
            for w in sorted(v for v in table if v is not None
                            and (v[1] - 1 == ts or self._cleanup_time(v) == ts)):
                if w[1] - 1 == ts:
                    self._fire(key, w, out)
                if self._cleanup_time(w) == ts:
                    self._remove(key, w)
        return out

    # -- firing ---------------------------------------------------------------
    def _fire(self, key: Any, w: Window | None, out: list[Any],
              contents: Any = _MISSING) -> None:
        """Emit the result of window ``w`` of ``key`` (or of ``contents``) to ``out``."""
        if contents is _MISSING:
            contents = self.windows[key][w]
        kind = self.kind
        hook = "process" if self._user is not None else "get_result"
        with user_hook(self.uid, hook):
            if kind == WindowFunctionKind.PROCESS:
                evictor = self.window_spec.evictor
                if evictor is not None and w in self.windows.get(key, ()):
                    contents = self._evict(key, w, contents, evictor)
                elements = private_copy(contents)
            else:
                result = contents if kind == WindowFunctionKind.REDUCE \
                    else self.window_spec.function.get_result(contents)
                if result.__class__ not in ATOMIC:
                    result = private_copy(result)
                if self._user is None:
                    out.append(result)
                    return
                elements = [result]
            ctx = self.window_ctx
            ctx.window = GlobalWindow() if w is None else TimeWindow(*w)
            assert self._user is not None
            emitted = self._user.process(key, ctx, elements)
            if emitted is not None:
                out.extend(emitted)

    def _evict(self, key: Any, w: Window | None, contents: list[Any], evictor: Any) -> Any:
        """What ``evictor`` keeps of a window's records, kept as its contents."""
        kept = evictor.evict(private_copy(contents), self.window_spec.timestamp_of)
        if not isinstance(kept, list):
            raise TypeError(f"{type(evictor).__name__}.evict returned {type(kept).__name__}, "
                            "not a list")
        if len(kept) != len(contents):
            self.windows[key][w] = kept  # copies: nothing of them reached user code
            self._fresh.add((key, w))
        return kept

    def _remove(self, key: Any, w: Window | None) -> None:
        table = self.windows.get(key)
        if table is None:
            return
        table.pop(w, None)
        self._fresh.discard((key, w))
        if not table:
            del self.windows[key]

    def close(self) -> None:
        if self._user is not None:
            self._user.close()
