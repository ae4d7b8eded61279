"""``NexmarkSource``: the events ``0 .. n-1`` of a :class:`NexmarkGenerator`
as a replayable source with splits.

It is a :class:`~lockgate.connectors.SequenceSource` of event numbers whose
reader turns each number into its event: a split's state is the next event
number, so a checkpoint replays exactly, and a restore at another
parallelism deals what is left of every split out again (``deal_splits``).
Unlike the sequence source, a bounded split is a stride (task ``i`` of ``p``
reads events ``i, i+p, i+2p, ...``): every task's event time advances at the
same pace, as Flink's parallel Nexmark generators run on parallel timelines,
so event-time windows fire as the whole input advances and the smallest
watermark of the tasks is never far behind.

``WATERMARKS`` is the matching strategy: event time is each event's
``date_time`` field, in order within a split.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.nexmark.generator import Event, GeneratorConfig, NexmarkGenerator
from lockgate import WatermarkStrategy
from lockgate.connectors import SequenceSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.sequence import SequenceReader

__all__ = ["NexmarkSource", "event_time", "WATERMARKS"]

def event_time(event: Event) -> int:
    """The event time (ms) of a person, auction or bid (an int: the
    generator's ``date_time``)."""
    return event[7] if event[0] == "P" else event[6]


WATERMARKS = WatermarkStrategy(event_time, 0, interval=0.05)
"""Event time from ``date_time``; in order within each split, so no
out-of-orderness (a watermark every 50 ms of processing time at most)."""


class NexmarkSource(SequenceSource):
    """The first ``events`` Nexmark events (``config`` or the default workload).

    Args:
        events: how many events (bounded), or None for an endless stream.
        config: the workload (rate of event time, proportions, ...).
        paced: emit each event when the wall clock reaches its ``date_time``
            (the config's ``base_time`` then is a wall-clock time: the
            latency runs), not as fast as possible.
        progress: a folder for each reader's progress over time, or None.
    """

    def __init__(self, events: int | None, config: GeneratorConfig | None = None, *,
                 paced: bool = False, progress: str | None = None) -> None:
        super().__init__(0, None if events is None else events - 1)
        self.config = config or GeneratorConfig()
        self.paced = paced
        self.progress = progress
        """A folder: each reader writes ``source-<task>.json`` there when its
        input ends, ``[[wall clock, events read so far], ...]`` every 50 ms
        (the runner's steady-state rate)."""

    def splits(self, parallelism: int) -> list[dict[str, Any]]:
        return [{"split": i, "next": self.start + i, "end": self.end, "step": parallelism}
                for i in range(parallelism)]

    def create_reader(self, info: TaskInfo) -> NexmarkReader:
        return NexmarkReader(self, info)


class NexmarkReader(SequenceReader):
    """Reads event numbers like the sequence reader and generates their events."""

    def __init__(self, source: NexmarkSource, info: TaskInfo) -> None:
        super().__init__(source, info)
        self.generator = NexmarkGenerator(source.config)
        self.marks: list[tuple[float, int]] = []
        self.read = 0

    def poll(self, max_records: int) -> list[Any] | None:  # type: ignore[override]
        if self.source.paced:  # type: ignore[attr-defined]
            config = self.generator.config
            due = int((time.time() * 1000 - config.base_time) * config.rate / 1000)
            left = [s for s in self.splits if s["end"] is None or s["next"] <= s["end"]]
            if left:
                nxt = min(s["next"] for s in left)
                if nxt > due:
                    return []
                max_records = min(max_records, (due - nxt) // left[0]["step"] + 1)
        numbers = super().poll(max_records)
        if self.source.progress is not None:  # type: ignore[attr-defined]
            self._mark(numbers)
        if numbers is None:
            return None
        return self.generator.batch(numbers)

    def _mark(self, numbers: list[int] | None) -> None:
        now = time.time()
        if numbers is None:
            if self.marks is not None:
                self.marks.append((now, self.read))
                folder = Path(self.source.progress)  # type: ignore[attr-defined]
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"source-{self.info.task_index}.json").write_text(
                    json.dumps(self.marks))
                self.marks = None  # type: ignore[assignment]
            return
        if not self.marks or now - self.marks[-1][0] >= 0.05:
            self.marks.append((now, self.read))
        self.read += len(numbers)
