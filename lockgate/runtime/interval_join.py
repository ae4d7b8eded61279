"""The interval join operator (Flink's ``IntervalJoinOperator``).

Keyed state (so snapshots, restores and rescales move it by key group):
``_join_left`` and ``_join_right``, map state key -> ``{timestamp: (records,
...)}`` (tuples: never changed in place, so a snapshot that shares them
stays as it was); and the operator's event-time timers.

A record is late when its timestamp is below its own input's watermark
(:attr:`~lockgate.runtime.valve.WatermarkValve.input_watermarks`: what that
input's upstream promised), not the operator's, the smaller of both
inputs': that one depends on how far one input ran ahead of the other, a
matter of timing, so the same input would make different records late from
run to run. A left record at ``t`` that is not late is stored, paired with
every stored right record of its key at ``t + lower .. t + upper``, and
gets a clean-up timer just past ``t + upper`` (``t`` if ``upper <= 0``):
once the operator's watermark passed it, no right record that is not late
can match it any more. A right record at ``t`` alike, with the interval ``t
- upper .. t - lower`` and a clean-up just past ``t - lower`` (``t`` if
``lower >= 0``). A timer of a key removes the key's records whose clean-up
time it passed. So every two records of a key that are not late and within
the bounds pair, whichever came first. The operator keeps its watermarks in
its checkpoints (each subtask its own, like the window operator:
:mod:`lockgate.runtime.watermark_state`): records late before a failure are
late after it too, and no other.
"""

from __future__ import annotations

from typing import Any

from lockgate.api.functions import OutputTag
from lockgate.api.joins import IntervalJoinSpec, JoinContext
from lockgate.api.watermarks import MAX_WATERMARK, MIN_WATERMARK
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.runtime.coprocess import TwoInputOperator
from lockgate.runtime.operators import KeyedContext, OperatorSnapshot, user_hook
from lockgate.runtime.watermark_state import restored_watermarks, watermark_entry
from lockgate.state.backend import MapStateDescriptor
from lockgate.state.serde import StateSerializer
from lockgate.state.values import ATOMIC, private_copy

__all__ = ["IntervalJoinOperator", "LEFT_STATE", "RIGHT_STATE"]

LEFT_STATE = "_join_left"
RIGHT_STATE = "_join_right"


class _JoinContext(JoinContext):
    def __init__(self, op: IntervalJoinOperator) -> None:
        self._op = op
        self.left_timestamp = 0
        self.right_timestamp = 0

    def output(self, tag: OutputTag, value: Any) -> None:
        if not isinstance(tag, OutputTag):
            raise TypeError(f"ctx.output takes an OutputTag, got {tag!r}")
        self._op.emit_side(tag.name, value)


def _copy(v: Any) -> Any:
    return v if v.__class__ in ATOMIC else private_copy(v)


class IntervalJoinOperator(TwoInputOperator):
    operator_state_mode = OperatorStateMode.UNION

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        backend = self.backend
        assert backend is not None and self.timers is not None
        self.has_processing_timers = False
        self.join: IntervalJoinSpec = self.co.extra
        self.fn = self.co.function
        for name in (LEFT_STATE, RIGHT_STATE):
            backend.get_state(MapStateDescriptor(name))
        self.buffers: tuple[dict[Any, dict[int, tuple[Any, ...]]], ...] = (
            backend.raw(LEFT_STATE), backend.raw(RIGHT_STATE))
        self.ctx = KeyedContext(self, self.timers)
        self.join_ctx = _JoinContext(self)
        self._floor = MIN_WATERMARK
        """The operator's watermark as restored (event time never goes back behind it)."""
        self._finite = MIN_WATERMARK
        """The last watermark before the end of input's."""
        self._inputs = [MIN_WATERMARK, MIN_WATERMARK]
        """Each input's own watermark, by which its records are late (restored too)."""
        self._finite_inputs = [MIN_WATERMARK, MIN_WATERMARK]
        with user_hook(self.uid, "open"):
            self.fn.open(self.ctx)

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        assert self.timers is not None
        restored = restored_watermarks(entries, self.info.task_index, self.info.parallelism,
                                       f"operator {self.uid!r}", inputs=2)
        if restored is not None:
            self._floor = self._finite = self.timers.watermark = restored[0]
            self._inputs, self._finite_inputs = restored[1], list(restored[1])

    def input_watermark(self, index: int, watermark: float) -> None:
        if watermark > self._inputs[index]:
            self._inputs[index] = watermark
            if watermark != MAX_WATERMARK:
                self._finite_inputs[index] = watermark

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        assert self.backend is not None and self.timers is not None
        # the end of input's watermark is no promise about what a resumed job reads
        watermark = self.timers.watermark
        if watermark == MAX_WATERMARK:
            watermark = self._finite
        inputs = [w if w != MAX_WATERMARK else f
                  for w, f in zip(self._inputs, self._finite_inputs, strict=True)]
        return OperatorSnapshot(self.backend.snapshot(savepoint), [watermark_entry(
            self.info.task_index, self.info.parallelism, watermark, inputs)])

    def _cleanup(self, side: int, ts: int) -> int:
        """The time a record of ``side`` at ``ts`` is removed at: one past
        the last timestamp a record of the other side that is not late can
        match it with (that one may come while the watermark is at it)."""
        j = self.join
        if side == 0:
            return (ts + j.upper if j.upper > 0 else ts) + 1
        return (ts - j.lower if j.lower < 0 else ts) + 1

    def process_input(self, index: int, batch: list[Any]) -> list[Any]:
        backend, timers, j = self.backend, self.timers, self.join
        assert backend is not None and timers is not None
        key_of = self.co.key_selectors[index]
        assert key_of is not None
        ts_of = j.left_timestamp if index == 0 else j.right_timestamp
        late_tag = j.left_late_tag if index == 0 else j.right_late_tag
        ours, theirs = self.buffers[index], self.buffers[1 - index]
        lo, hi = (j.lower, j.upper) if index == 0 else (-j.upper, -j.lower)
        fn, ctx = self.fn.process_element, self.join_ctx
        # this input's own watermark (never below the operator's, which is
        # the smaller of both inputs'; that one alone where the task gives
        # no input's own)
        watermark = max(timers.watermark, self._inputs[index])
        out: list[Any] = []
        for r in batch:
            key = backend.current_key = key_of(r)
            ts = ts_of(r)
            if type(ts) is not int:
                ts = int(ts)
            if ts < watermark:
                if late_tag is not None:
                    self.emit_side(late_tag, r)
                continue
            stored = _copy(r)
            table = ours.get(key)
            if table is None:
                ours[key] = {ts: (stored,)}
            else:
                table[ts] = table.get(ts, ()) + (stored,)
            other = theirs.get(key)
            if other:
                for ots in sorted(other):
                    if ts + lo <= ots <= ts + hi:
                        for o in other[ots]:
                            if index == 0:
                                ctx.left_timestamp, ctx.right_timestamp = ts, ots
                                res = fn(_copy(r), _copy(o), ctx)
                            else:
                                ctx.left_timestamp, ctx.right_timestamp = ots, ts
                                res = fn(_copy(o), _copy(r), ctx)
                            if res is not None:
                                out.extend(res)
            timers.register_event_time_timer(self._cleanup(index, ts))
        return out

    def process_watermark(self, watermark: float) -> list[Any]:
        backend, timers = self.backend, self.timers
        assert backend is not None and timers is not None
        watermark = max(watermark, self._floor)
        if watermark != MAX_WATERMARK:
            self._finite = watermark
        for key, t in timers.due(watermark):
            for side in (0, 1):
                buf = self.buffers[side]
                table = buf.get(key)
                if not table:
                    continue
                for ts in [ts for ts in table if self._cleanup(side, ts) <= t]:
                    del table[ts]
                if not table:
                    del buf[key]
        return []

    def close(self) -> None:
        self.fn.close()
