"""``SequenceSource``: the integers of a range, bounded or not, optionally rate-limited."""

from __future__ import annotations

import time
from typing import Any

from lockgate.connectors.base import Source, SourceReader, TaskInfo

__all__ = ["SequenceSource"]


class SequenceSource(Source[int]):
    """Emits ``start, start+1, ..., end`` (inclusive), or forever if ``end`` is None.

    Each task reads its own split (a contiguous range when bounded, a stride
    when unbounded); the state of a split is the next number to emit, so the
    source replays exactly from a checkpoint.

    Args:
        start: first number.
        end: last number (inclusive), or None for an unbounded source.
        rate: records per second over all tasks, or None for as fast as possible.
    """

    replayable = True

    def __init__(self, start: int, end: int | None = None, *, rate: float | None = None) -> None:
        if end is not None and end < start:
            raise ValueError(f"end ({end}) must be >= start ({start})")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 records/s, got {rate}")
        self.start = start
        self.end = end
        self.rate = rate
        self.bounded = end is not None

    def splits(self, parallelism: int) -> list[dict[str, Any]]:
        """The initial splits, one per task."""
        if self.end is None:
            return [{"split": i, "next": self.start + i, "end": None, "step": parallelism}
                    for i in range(parallelism)]
        total = self.end - self.start + 1
        out = []
        for i in range(parallelism):
            lo = self.start + total * i // parallelism
            hi = self.start + total * (i + 1) // parallelism - 1
            out.append({"split": i, "next": lo, "end": hi, "step": 1})
        return out

    def create_reader(self, info: TaskInfo) -> SequenceReader:
        return SequenceReader(self, info)


class SequenceReader(SourceReader[int]):
    def __init__(self, source: SequenceSource, info: TaskInfo) -> None:
        self.source = source
        self.info = info
        self.splits: list[dict[str, Any]] = []
        self.rate = source.rate / info.parallelism if source.rate else None
        self.started = time.monotonic()
        self.emitted = 0

    def restore(self, state: list[Any] | None) -> None:
        if state is None:
            self.splits = [self.source.splits(self.info.parallelism)[self.info.task_index]]
        else:
            self.splits = [dict(s) for s in state]

    def poll(self, max_records: int) -> list[int] | None:
        if self.rate is not None:
            allowed = int((time.monotonic() - self.started) * self.rate) - self.emitted
            if allowed <= 0:
                return []
            max_records = min(max_records, allowed)
        for split in self.splits:
            nxt, end, step = split["next"], split["end"], split["step"]
            if end is not None and nxt > end:
                continue
            stop = nxt + max_records * step
            if end is not None:
                stop = min(stop, end + 1)
            batch = list(range(nxt, stop, step))
            split["next"] = nxt + len(batch) * step
            self.emitted += len(batch)
            return batch
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [dict(s) for s in self.splits]
