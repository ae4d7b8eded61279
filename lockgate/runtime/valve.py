"""A task's event time, as a pure state machine (like ``BarrierHandler``).

The valve decides *when* the task's watermark advances and when the task is
idle; the task does what that means (fire timers, send the element
downstream). Each event method returns the elements to apply, in order:
``Watermark(ts)`` (advance to ``ts``) or ``IDLE`` (tell downstream to leave
this task out of their watermarks until it sends one again).

* A task with inputs: its watermark is the smallest of its input channels',
  leaving out channels whose upstream declared itself idle; with every input
  idle, the task is idle. An operator of several inputs (``input_of``: the
  input of each channel) also gets each input's own watermark
  (``input_watermarks``: the smallest of that input's active channels',
  never going back), which depends on that input's order alone, not on how
  the inputs interleave: the interval join judges a record late by it.
* A source task: its watermark follows the records it read
  (``WatermarkStrategy.watermark_after``), emitted at most once per
  ``interval``; readers that read several splits in turn (``last_split``)
  get one watermark per split, and the task's is the smallest of the
  unfinished splits' (FLIP-27). With no record for ``idle_timeout`` seconds
  the task declares itself idle; its next records make it active again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence

from lockgate.api.watermarks import MIN_WATERMARK
from lockgate.protocol import IDLE, Idle, Watermark

Emitted = list[Watermark | Idle]


class WatermarkValve:
    def __init__(self, num_channels: int, interval: float = 0.0,
                 idle_timeout: float | None = None, now: float = 0.0,
                 input_of: Sequence[int] | None = None) -> None:
        self.watermark: float = MIN_WATERMARK
        """This task's event time (what it last sent downstream)."""
        self.idle = False
        """Downstream was told this task is idle (and not yet that it is active again)."""
        self.channel_watermarks = [MIN_WATERMARK] * num_channels
        self.channel_idle = [False] * num_channels
        """Input channels whose upstream declared itself idle (left out of the minimum)."""
        self.input_of = input_of
        """The input of each channel (operators of several inputs), or None."""
        self.input_watermarks: list[float] = (
            [MIN_WATERMARK] * (max(input_of) + 1) if input_of else [])
        """Per input, the smallest watermark of its active channels (never back)."""
        self.interval = interval
        self.idle_timeout = idle_timeout
        self._source_max: float = MIN_WATERMARK
        """A source's watermark as of the records it read; emitted periodically."""
        self._split_watermarks: dict[Hashable, float] = {}
        """Per split, the watermark its records allow (readers that set ``last_split``)."""
        self._due = 0.0
        self._last_read = now

    # ------------------------------------------------------ tasks with inputs
    def input_watermark(self, channel: int, timestamp: float) -> Emitted:
        self.channel_idle[channel] = False
        self.channel_watermarks[channel] = timestamp
        if self.input_of is not None:
            self._combine_input(self.input_of[channel])
        return self._combine()

    def input_idle(self, channel: int) -> Emitted:
        self.channel_idle[channel] = True
        if self.input_of is not None:
            self._combine_input(self.input_of[channel])
        return self._combine()

    def _combine_input(self, index: int) -> None:
        input_of = self.input_of
        assert input_of is not None
        active = [w for w, idle, i in zip(self.channel_watermarks, self.channel_idle, input_of,
                                          strict=True) if i == index and not idle]
        if active and min(active) > self.input_watermarks[index]:
            self.input_watermarks[index] = min(active)

    def _combine(self) -> Emitted:
        active = [w for w, idle in zip(self.channel_watermarks, self.channel_idle, strict=True)
                  if not idle]
        if not active:
            return [] if self.idle else self._go_idle()
        combined = min(active)
        if combined > self.watermark or self.idle:
            return self.advance(max(combined, self.watermark))
        return []

    # ---------------------------------------------------------------- sources
    def source_polled(self, now: float, batch_watermark: float | None,
                      split: Hashable | None,
                      unfinished: Callable[[], Collection[Hashable]]) -> Emitted:
        """After a source's poll: ``batch_watermark`` is what the records read
        allow (None: the poll read nothing), ``split`` the split they came from
        (None: the reader does not say), ``unfinished`` the splits still read."""
        read = batch_watermark is not None
        if batch_watermark is not None:
            self._last_read = now
            if split is None:
                if batch_watermark > self._source_max:
                    self._source_max = batch_watermark
            elif batch_watermark > self._split_watermarks.get(split, MIN_WATERMARK):
                self._split_watermarks[split] = batch_watermark
            if self.idle:  # active again: say so now, with the watermark it has
                self._due = 0.0
        if self._split_watermarks:  # the smallest of the unfinished splits'
            left = unfinished()
            marks = self._split_watermarks
            watermark = (min(marks.get(s, MIN_WATERMARK) for s in left) if left
                         else max(marks.values()))
            if watermark > self._source_max:
                self._source_max = watermark
        going_idle = (not read and self.idle_timeout is not None and not self.idle
                      and now - self._last_read >= self.idle_timeout)
        emitted: Emitted = []
        if (now >= self._due or going_idle) and (
                self._source_max > self.watermark or self.idle and read):
            self._due = now + self.interval
            emitted = self.advance(max(self._source_max, self.watermark))
        if going_idle:  # (after the last watermark it can promise)
            emitted += self._go_idle()
        return emitted

    # ------------------------------------------------------------------ both
    def advance(self, watermark: float) -> Emitted:
        """Event time moves to ``watermark`` (also making an idle task active)."""
        self.idle = False
        self.watermark = watermark
        return [Watermark(watermark)]

    def _go_idle(self) -> Emitted:
        self.idle = True
        return [IDLE]
