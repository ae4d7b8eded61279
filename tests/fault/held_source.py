"""Sources that never end their input by themselves, so a test's stop
cannot come after the end of the input however slow the machine is.

* :class:`HeldSequence`: a bounded sequence whose tasks hold back the last
  number of every split they read, and idle once they read the rest. A job
  reading it runs until it is stopped (with or without drain); its savepoint
  holds the held numbers, and a job resumed from it with the plain
  :class:`SequenceSource` (the same uid) reads them to the end. With
  ``gate``, the held numbers are read once the file ``gate`` exists (the
  job then ends by itself, when the test is done with it).
* :class:`HeldBackReader` (:class:`HeldFiles`, :class:`HeldArrow`,
  :class:`HeldDataFrame`): any bounded source whose tasks each read at most
  ``most`` records in a run, then idle, and never end: a job reading it runs
  until it is stopped, and a job resumed from its savepoint with the plain
  source reads the rest. For sources whose records cannot be held back one
  by one.
"""

from __future__ import annotations

import os
from typing import Any

from lockgate.connectors.base import SourceReader, TaskInfo
from lockgate.connectors.dataframe import DataFrameSource
from lockgate.connectors.filesource import FileSource
from lockgate.connectors.parquet import ArrowSource
from lockgate.connectors.sequence import SequenceReader, SequenceSource


class HeldSequence(SequenceSource):
    """``start..end`` as :class:`SequenceSource`, but the last number of
    every split (every split :meth:`holds`) is not read (see the module)
    until the file ``gate`` exists (never, without a gate)."""

    def __init__(self, start: int, end: int, *, rate: float | None = None,
                 gate: str | None = None) -> None:
        super().__init__(start, end, rate=rate)
        self.gate = gate

    def holds(self, split: dict[str, Any]) -> bool:
        """Whether the last number of ``split`` is held back (every split's)."""
        return True

    def create_reader(self, info: TaskInfo) -> HeldReader:
        return HeldReader(self, info)


class HeldReader(SequenceReader):
    source: HeldSequence

    def restore(self, state: list[Any] | None) -> None:
        super().restore(state)
        self.held = {s["split"] for s in self.splits if self.source.holds(s)}
        for s in self._held():  # the reader sees each held split one number short
            assert s["end"] is not None, "a held sequence is bounded"
            s["end"] -= s["step"]

    def _held(self) -> list[dict[str, Any]]:
        return [s for s in self.splits if s["split"] in self.held]

    def _release(self) -> None:
        """The gate is open: the held numbers are read now (as a plain
        sequence reads them)."""
        if self.held and self.source.gate is not None and os.path.exists(self.source.gate):
            for s in self._held():
                s["end"] += s["step"]
            self.held = set()

    def poll(self, max_records: int) -> list[int] | None:
        self._release()
        batch = super().poll(max_records)
        if batch is None and self.held:
            return []  # only the held numbers left: idle
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [{**s, "end": s["end"] + s["step"]} if s["split"] in self.held else s
                for s in super().snapshot_state(checkpoint_id)]

    def unfinished_splits(self) -> list[Any]:
        """A split whose held number is left is not finished (event time
        waits for it as for a number not read yet)."""
        return [s["split"] for s in self.splits
                if s["next"] <= s["end"] + (s["step"] if s["split"] in self.held else 0)]


class HeldBackReader(SourceReader[Any]):
    """``inner``, until it returned ``most`` records (the rows of record
    batches) in this run or its input is exhausted; then it idles, and never
    ends. Its position is ``inner``'s, exact."""

    def __init__(self, inner: SourceReader[Any], most: int) -> None:
        self.inner = inner
        self.most = most
        self.read = 0

    @property
    def last_split(self) -> Any:  # type: ignore[override]
        return self.inner.last_split

    def unfinished_splits(self) -> list[Any]:
        return self.inner.unfinished_splits()

    def restore(self, state: list[Any] | None) -> None:
        self.inner.restore(state)

    def poll(self, max_records: int) -> list[Any] | None:
        if self.read >= self.most:
            return []
        batch = self.inner.poll(max_records)
        if batch is None:
            return []
        self.read += sum(getattr(b, "num_rows", 1) for b in batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return self.inner.snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.inner.notify_checkpoint_complete(checkpoint_id)

    def backlog(self) -> int | None:
        return self.inner.backlog()

    def close(self) -> None:
        self.inner.close()


class HeldFiles(FileSource):
    """A bounded :class:`FileSource` whose tasks read at most ``most``
    records each in a run (:class:`HeldBackReader`)."""

    def __init__(self, path: str, *, most: int, **options: Any) -> None:
        super().__init__(path, **options)
        self.most = most

    def create_reader(self, info: TaskInfo) -> SourceReader[Any]:
        return HeldBackReader(super().create_reader(info), self.most)


class HeldArrow(ArrowSource):
    """An :class:`ArrowSource` whose tasks read at most ``most`` rows each
    in a run (:class:`HeldBackReader`; a batch is never cut)."""

    def __init__(self, source: FileSource | DataFrameSource, *, most: int,
                 **options: Any) -> None:
        super().__init__(source, **options)
        self.most = most

    def create_reader(self, info: TaskInfo) -> SourceReader[Any]:
        return HeldBackReader(super().create_reader(info), self.most)


class HeldDataFrame(DataFrameSource):
    """A :class:`DataFrameSource` whose tasks read at most ``most`` rows
    each in a run (:class:`HeldBackReader`)."""

    def __init__(self, df: Any, *, most: int, **options: Any) -> None:
        super().__init__(df, **options)
        self.most = most

    def create_reader(self, info: TaskInfo) -> SourceReader[Any]:
        return HeldBackReader(super().create_reader(info), self.most)
