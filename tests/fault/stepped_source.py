"""A sequence source whose records come due at a rate that steps up and
down, counted from the job's start, as a producer writing into a topic at
changing rates: a task that is slower than the rate (backpressure, a
restart, a rescale's pause) leaves a backlog, which it reports (the
autoscaler reads it) and reads as fast as it can."""

from __future__ import annotations

import time
from typing import Any

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.sequence import SequenceReader, SequenceSource


class SteppedSource(SequenceSource):
    """The numbers ``start..end``; ``phases``: ``(seconds, records/s)`` in
    turn from the job's start, the last one's rate until the end."""

    def __init__(self, start: int, end: int, phases: list[tuple[float, float]]) -> None:
        super().__init__(start, end)
        self.phases = [(float(s), float(r)) for s, r in phases]
        self.t0: float | None = None

    def prepare(self, job_dir: str, uid: str) -> None:
        self.t0 = time.time()  # once per job, in the driver: the producer starts

    def due(self, now: float) -> float:
        """Records the producer made by ``now`` (wall clock)."""
        assert self.t0 is not None
        left, made = now - self.t0, 0.0
        for i, (seconds, rate) in enumerate(self.phases):
            span = left if i == len(self.phases) - 1 else min(left, seconds)
            made += max(0.0, span) * rate
            left -= seconds
            if left <= 0:
                break
        return made

    def boundaries(self) -> list[float]:
        """When each phase after the first starts (wall clock)."""
        assert self.t0 is not None
        out, at = [], self.t0
        for seconds, _ in self.phases[:-1]:
            at += seconds
            out.append(at)
        return out

    def create_reader(self, info: TaskInfo) -> SteppedReader:
        return SteppedReader(self, info)


class SteppedReader(SequenceReader):
    source: SteppedSource

    def restore(self, state: list[Any] | None) -> None:
        super().restore(state)
        # union state: every task sees every split; what they left is what
        # the job has not read yet
        assert self.source.end is not None
        total = self.source.end - self.source.start + 1
        left = 0 if state is None else sum(
            max(0, (e["end"] - e["next"]) // e["step"] + 1) for e in state)
        self.read_before = 0 if state is None else total - left

    def _allowed(self) -> int:
        share = (self.source.due(time.time()) - self.read_before) / self.info.parallelism
        return int(share) - self.emitted

    def poll(self, max_records: int) -> list[int] | None:
        allowed = self._allowed()
        if allowed <= 0:
            return [] if any(s["next"] <= s["end"] for s in self.splits) else None
        return super().poll(min(max_records, allowed))

    def backlog(self) -> int | None:
        left = sum(max(0, (s["end"] - s["next"]) // s["step"] + 1) for s in list(self.splits))
        return max(0, min(self._allowed(), left))
