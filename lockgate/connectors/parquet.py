"""Columnar sources: Parquet files and Spark DataFrames read as Arrow record batches.

``ArrowSource`` wraps a :class:`~lockgate.connectors.FileSource` in Parquet
format or a :class:`~lockgate.connectors.DataFrameSource` (whose DataFrame the
driver materializes as Parquet once per job, see ``connectors/dataframe.py``)
and emits ``pyarrow.RecordBatch`` es instead of one dict per row: a batch is a
zero-copy slice of a row group, at most ``batch_rows`` rows, never spanning
two files. Use it through :meth:`lockgate.Pipeline.source_arrow`.

Splits, positions and checkpoints are the wrapped source's, unchanged: a
split per file, dealt to tasks the same way, and one state entry per file
``{"file": rel, "offset": next row, "done": bool}`` as UNION state. So a job
may switch between reading the same files as rows and as batches through a
savepoint, at any parallelism.
"""

from __future__ import annotations

import time
from typing import Any

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.connectors.dataframe import DataFrameSource, DataFrameSourceReader
from lockgate.connectors.filesource import FileSource, FileSourceReader, _ParquetSplit
from lockgate.errors import LockgateError, PipelineDefinitionError

__all__ = ["ArrowSource", "ArrowFileSourceReader", "ArrowDataFrameSourceReader"]

DEFAULT_BATCH_ROWS = 65_536


class _ParquetBatches(_ParquetSplit):
    """One Parquet file read as record batches from row ``offset`` on; a row
    group is decoded once and sliced (no copy)."""

    def __init__(self, path: str, rel: str, offset: int) -> None:
        super().__init__(path, rel, offset)
        self._batch: Any = None

    def _open_parquet(self, source: Any) -> Any:
        try:
            return super()._open_parquet(source)
        except Exception as e:
            raise LockgateError(f"file source: {self.rel!r} is not a Parquet file ({e}); fix "
                                "or remove the file") from e

    def _load(self, row: int) -> int:
        rg = self._row_group_of(row)
        if rg != self._rg:
            import pyarrow as pa

            table = self._pf.read_row_group(rg).combine_chunks()
            batches = table.to_batches()  # one: the chunks were combined
            self._batch = batches[0] if batches else \
                pa.RecordBatch.from_pylist([], schema=table.schema)
            self._rg = rg
        return self._starts[rg]

    def read(self, n: int) -> Any:
        """Up to ``n`` rows of one row group (None when none is left)."""
        while self.offset < self._total:
            start = self._load(self.offset)
            i = self.offset - start
            rows = self._batch.slice(i, n)
            if not len(rows):  # an empty row group
                self.offset = start + len(self._batch)
                continue
            self.offset += len(rows)
            if self.offset >= self._total:
                self.exhausted = True
            return rows
        self.exhausted = True
        return None


class _ArrowPoll(FileSourceReader):
    """``poll`` of a file source reader, giving record batches."""

    batch_rows = DEFAULT_BATCH_ROWS
    rate: float | None = None

    def configure(self, batch_rows: int, rate: float | None) -> None:
        self.batch_rows = batch_rows
        self.rate = rate / self.info.parallelism if rate else None
        self._started = time.monotonic()
        self._emitted = 0

    def poll(self, max_records: int) -> Any:
        """A record batch of up to ``batch_rows`` rows of one file (the files
        in turn, as rows are read); ``[]`` when
        nothing is there now (or the rate says wait); ``None`` at the end of a
        bounded input."""
        if not self._initialized:
            self.restore([])
        rows = self.batch_rows
        if self.rate is not None:
            allowed = int((time.monotonic() - self._started) * self.rate) - self._emitted
            if allowed <= 0:
                return []
            rows = min(rows, allowed)
        src = self.source
        if src.watch and time.monotonic() - self._last_scan >= src.poll_interval:
            self._scan()
        while True:
            cur = self._next_split()
            if cur is None:
                break
            batch = cur.read(rows)
            self.last_split = cur.rel
            self._advanced(cur)
            if batch is not None:
                self._emitted += len(batch)
                return batch
        if not src.watch and not self._open and not self._queue:
            return None
        return []

    def _open_split(self, rel: str, offset: int) -> _ParquetBatches:
        return _ParquetBatches(self._path(rel), rel, offset)


class ArrowFileSourceReader(_ArrowPoll):
    """A file source's reader (Parquet) giving record batches."""


class ArrowDataFrameSourceReader(_ArrowPoll, DataFrameSourceReader):
    """A DataFrame source's reader giving record batches."""


class ArrowSource(Source[Any]):
    """Record batches of a Parquet :class:`FileSource` or a
    :class:`DataFrameSource`; see the module docstring.

    Args:
        source: ``FileSource(path, format="parquet")`` (``watch=True`` too)
            or ``DataFrameSource(df)``.
        batch_rows: rows per batch at most (a batch never spans two row groups).
        rate: rows per second over all tasks at most (tests, demos), or None.
    """

    replayable = True
    operator_state_mode = OperatorStateMode.UNION

    def __init__(self, source: FileSource | DataFrameSource, *,
                 batch_rows: int = DEFAULT_BATCH_ROWS, rate: float | None = None) -> None:
        if isinstance(source, FileSource):
            if source.format != "parquet":
                raise PipelineDefinitionError(
                    f"source_arrow reads Parquet; {source!r} has format {source.format!r} "
                    "(read it as rows with p.source(...), then .to_arrow())")
        elif not isinstance(source, DataFrameSource):
            raise PipelineDefinitionError(
                f"source_arrow takes a FileSource in Parquet format, a DataFrameSource or a "
                f"Spark DataFrame, got {type(source).__name__}")
        if batch_rows < 1:
            raise PipelineDefinitionError(f"batch_rows must be >= 1, got {batch_rows}")
        if rate is not None and rate <= 0:
            raise PipelineDefinitionError(f"rate must be > 0 rows/s, got {rate}")
        self.inner = source
        self.batch_rows = batch_rows
        self.rate = rate
        self.bounded = source.bounded

    def task_modules(self) -> tuple[str, ...]:
        return ("pyarrow", *self.inner.task_modules())

    def validate(self) -> None:
        self.inner.validate()

    def prepare(self, job_dir: str, uid: str) -> None:
        self.inner.prepare(job_dir, uid)

    def create_reader(self, info: TaskInfo) -> SourceReader[Any]:
        inner = self.inner
        reader: _ArrowPoll
        if isinstance(inner, DataFrameSource):
            if inner.path is None:
                raise LockgateError(
                    f"DataFrame source {info.uid!r} was not materialized before the job "
                    "started; run the pipeline with Pipeline.run() or Pipeline.start()")
            reader = ArrowDataFrameSourceReader(FileSource(inner.path, format="parquet"), info)
        else:
            reader = ArrowFileSourceReader(inner, info)
        reader.configure(self.batch_rows, self.rate)
        return reader

    def __repr__(self) -> str:
        return f"ArrowSource({self.inner!r}, batch_rows={self.batch_rows})"
