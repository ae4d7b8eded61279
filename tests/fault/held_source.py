"""A bounded sequence source that never ends its input by itself: each task
holds back the last number of every split it reads, and idles once it read
the rest. A job reading it runs until it is stopped (with or without
drain), so a test's stop cannot come after the end of the input however
slow the machine is; its savepoint holds the held numbers, and a job
resumed from it with the plain :class:`SequenceSource` (the same uid)
reads them to the end."""

from __future__ import annotations

from typing import Any

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.sequence import SequenceReader, SequenceSource


class HeldSequence(SequenceSource):
    """``start..end`` as :class:`SequenceSource`, but the last number of
    every split is never read (see the module)."""

    def __init__(self, start: int, end: int, *, rate: float | None = None) -> None:
        super().__init__(start, end, rate=rate)

    def create_reader(self, info: TaskInfo) -> HeldReader:
        return HeldReader(self, info)


class HeldReader(SequenceReader):
    def restore(self, state: list[Any] | None) -> None:
        super().restore(state)
        for s in self.splits:  # the reader sees each split one number short
            assert s["end"] is not None, "a held sequence is bounded"
            s["end"] -= s["step"]

    def poll(self, max_records: int) -> list[int] | None:
        batch = super().poll(max_records)
        return [] if batch is None else batch  # only the held numbers left: idle

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [{**s, "end": s["end"] + s["step"]} for s in super().snapshot_state(checkpoint_id)]

    def unfinished_splits(self) -> list[Any]:
        """A split whose held number is left is not finished (event time
        waits for it as for a number not read yet)."""
        return [s["split"] for s in self.splits if s["next"] <= s["end"] + s["step"]]
