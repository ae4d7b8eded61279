"""A replayable file source: JSONL, CSV or Parquet files of a folder.

Splits are files (names starting with ``.`` or ``_`` are skipped, at any depth,
like Spark and Hadoop do). File ``rel`` (its ``/``-separated name relative to
the folder) belongs to task ``zlib.crc32(rel) % parallelism``; each task reads
its files in sorted name order. Bounded unless ``watch=True``, in which case the
folder is rescanned at most every ``poll_interval`` seconds for new files
(files are taken as immutable once visible: write them hidden, then rename).

State: one entry per file this reader has started or finished,
``{"file": rel, "offset": int, "done": bool}``, where ``offset`` is the byte
offset of the next line (JSONL, CSV) or the index of the next row (Parquet).
``restore`` keeps the entries of the files hashed to this task at the current
parallelism and resumes right after the last record returned before the
snapshot. Registering this state as union state (every task receives every
entry) makes rescaling exact; with unchanged parallelism any redistribution that
hands each task its own entries back works too.
"""

from __future__ import annotations

import csv
import json
import os
import time
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from typing import IO, Any

from lockgate import fs
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.connectors.base import Source, SourceReader, TaskInfo
from lockgate.errors import ConfigurationError, LockgateError
from lockgate.untrusted import relative_path

__all__ = ["FileSource", "FileSourceReader", "assign_file", "list_files"]

_FORMATS = ("jsonl", "csv", "parquet")


def assign_file(relname: str, parallelism: int) -> int:
    """The task index that reads file ``relname`` (stable across processes)."""
    return zlib.crc32(relname.encode("utf-8")) % parallelism


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def list_files(folder: str) -> list[str]:
    """Sorted relative names (``/``-separated) of the visible files under
    ``folder`` (a local path or a URL); hidden files and folders are skipped."""
    if not fs.is_local(folder):
        return sorted(rel for rel in fs.walk_files(folder)
                      if not any(_hidden(part) for part in rel.split("/")))
    folder = fs.local_path(folder) or folder
    out: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not _hidden(d)]
        rel_root = os.path.relpath(root, folder)
        for name in files:
            if _hidden(name):
                continue
            rel = name if rel_root == "." else os.path.join(rel_root, name)
            out.append(rel.replace(os.sep, "/"))
    out.sort()
    return out


# ------------------------------------------------------------ split readers


class _SplitReader(ABC):
    """Reads one file from a position; ``offset`` is the position after the last
    record returned; ``exhausted`` once the end was reached."""

    def __init__(self, path: str, rel: str, offset: int) -> None:
        self.path = path
        self.rel = rel
        self.offset = offset
        self.exhausted = False

    @abstractmethod
    def read(self, n: int) -> list[Any]:
        """Up to ``n`` records; fewer only once ``exhausted``."""

    @abstractmethod
    def close(self) -> None:
        """Release the file."""


class _JsonlReader(_SplitReader):
    def __init__(self, path: str, rel: str, offset: int) -> None:
        super().__init__(path, rel, offset)
        self._f: IO[bytes] = fs.open_read(path)  # closed in close()
        self._f.seek(offset)

    def read(self, n: int) -> list[Any]:
        out: list[Any] = []
        readline, loads = self._f.readline, json.loads
        while len(out) < n:
            line = readline()
            if not line:
                self.exhausted = True
                break
            if line.strip():
                try:
                    out.append(loads(line))
                except ValueError as e:
                    raise LockgateError(
                        f"file source: {self.rel!r} at byte {self.offset} is not a JSON "
                        f"line ({e}); fix or remove the file"
                    ) from e
            self.offset += len(line)
        return out

    def close(self) -> None:
        self._f.close()


class _CsvReader(_SplitReader):
    def __init__(self, path: str, rel: str, offset: int) -> None:
        super().__init__(path, rel, offset)
        self._f: IO[bytes] = fs.open_read(path)  # closed in close()
        header = self._f.readline()
        fields = next(csv.reader([header.decode("utf-8-sig")]), [])
        if self.offset < len(header):
            self.offset = len(header)
        self._f.seek(self.offset)
        self._rows = csv.DictReader(self._lines(), fieldnames=fields) if fields else None

    def _lines(self) -> Iterator[str]:
        # csv pulls exactly the lines of one row (more if a quoted field holds a
        # newline), never more, so _pos is the end of the last row returned.
        readline = self._f.readline
        while True:
            line = readline()
            if not line:
                return
            self._pos += len(line)
            yield line.decode("utf-8")

    def read(self, n: int) -> list[Any]:
        out: list[Any] = []
        if self._rows is None:
            self.exhausted = True
            return out
        self._pos = self.offset
        try:
            for row in self._rows:
                out.append(row)
                self.offset = self._pos
                if len(out) >= n:
                    return out
        except (csv.Error, UnicodeDecodeError) as e:
            raise LockgateError(
                f"file source: {self.rel!r} near byte {self.offset} is not valid CSV ({e}); "
                "fix or remove the file"
            ) from e
        self.offset = self._pos
        self.exhausted = True
        return out

    def close(self) -> None:
        self._f.close()


class _ParquetSplit(_SplitReader):
    """A Parquet file of a split, opened locally or through its filesystem,
    with the first row of each row group (positions are row numbers)."""

    def __init__(self, path: str, rel: str, offset: int) -> None:
        super().__init__(path, rel, offset)
        local = fs.local_path(path)
        self._raw: Any = None
        if local is None:
            filesystem, p = fs.resolve(path)
            self._raw = filesystem.open_input_file(p)
        try:
            self._pf = self._open_parquet(local if local is not None else self._raw)
        except BaseException:
            self._close_raw()
            raise
        md = self._pf.metadata
        self._starts: list[int] = []
        total = 0
        for i in range(md.num_row_groups):
            self._starts.append(total)
            total += md.row_group(i).num_rows
        self._total = total
        self._rg = -1

    def _open_parquet(self, source: Any) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetFile(source)

    def _row_group_of(self, row: int) -> int:
        return max(i for i, s in enumerate(self._starts) if s <= row)

    def _close_raw(self) -> None:
        if self._raw is not None:
            self._raw.close()

    def close(self) -> None:
        self._pf.close()
        self._close_raw()


class _ParquetReader(_ParquetSplit):
    def __init__(self, path: str, rel: str, offset: int) -> None:
        super().__init__(path, rel, offset)
        self._rows: list[dict[str, Any]] = []

    def _load(self, row: int) -> None:
        rg = self._row_group_of(row)
        if rg != self._rg:
            self._rows = self._pf.read_row_group(rg).to_pylist()
            self._rg = rg

    def read(self, n: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < n:
            if self.offset >= self._total:
                self.exhausted = True
                break
            self._load(self.offset)
            start = self._starts[self._rg]
            i = self.offset - start
            chunk = self._rows[i : i + n - len(out)]
            if not chunk:  # empty row group
                self.offset = start + len(self._rows)
                continue
            out.extend(chunk)
            self.offset += len(chunk)
        return out


_READERS: dict[str, type[_SplitReader]] = {
    "jsonl": _JsonlReader,
    "csv": _CsvReader,
    "parquet": _ParquetReader,
}


# ------------------------------------------------------------------ reader


def missing_folder(path: str) -> str:
    return (f"file source folder {fs.redact(path)!r} does not exist; create it or fix the path "
            "(use watch=True to wait for files in a folder created later)")


class FileSourceReader(SourceReader[Any]):
    """Reads the files of one task; see the module docstring."""

    def __init__(self, source: FileSource, info: TaskInfo) -> None:
        """A reader of ``source`` for task ``info``; nothing is opened yet."""
        self.source = source
        self.info = info
        self._progress: dict[str, dict[str, Any]] = {}
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._open: deque[_SplitReader] = deque()
        """The files being read, in turn (the next one first)."""
        self._initialized = False
        self._last_scan = float("-inf")

    def _mine(self, rel: str) -> bool:
        return assign_file(rel, self.info.parallelism) == self.info.task_index

    def _path(self, rel: str) -> str:
        return fs.join(self.source.path, *rel.split("/"))

    def _scan(self) -> None:
        """Queue the new files of this task (sorted)."""
        self._last_scan = time.monotonic()
        if not fs.is_dir(self.source.path):
            if self.source.watch:
                return
            raise ConfigurationError(missing_folder(self.source.path))
        for rel in list_files(self.source.path):
            if rel in self._progress or rel in self._queued or not self._mine(rel):
                continue
            self._queue.append(rel)
            self._queued.add(rel)

    def restore(self, state: list[Any] | None) -> None:
        """Resume from ``state`` (``None``: a fresh start).

        Step 1. Keep the entries of the files hashed to this task; validate them.
        Step 2. Check every such file still exists (else raise naming it).
        Step 3. Queue the unfinished ones first, in name order, then scan the
                folder for the files not started yet.
        """
        # Step 1. Entries of this task.
        for entry in state or []:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("file"), str)
                and isinstance(entry.get("offset"), int)
            ):
                raise LockgateError(
                    f"file source: restored state entry {entry!r} is not a file position; "
                    "restore with the source that wrote the checkpoint"
                )
            rel = relative_path(entry["file"], f"file source {self.info.uid!r}: a restored "
                                "position's file")
            if not self._mine(rel):
                continue
            # Step 2. Still there?
            if not fs.is_file(self._path(rel)):
                raise LockgateError(
                    f"file source: file {rel!r} named in the restored checkpoint no longer "
                    f"exists in {self.source.path!r}; put it back, or start without state"
                )
            self._progress[rel] = {
                "file": rel,
                "offset": int(entry["offset"]),
                "done": bool(entry.get("done", False)),
            }
        # Step 3. Queue.
        for rel in sorted(self._progress):
            if not self._progress[rel]["done"]:
                self._queue.append(rel)
                self._queued.add(rel)
        self._scan()
        self._initialized = True

    def poll(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records of one file; ``None`` when bounded and done.

        Step 1. (watch) Rescan the folder if ``poll_interval`` has passed.
        Step 2. Read from the next unfinished file in turn (``last_split``).
        Step 3. Report the end (bounded) or return what was read.
        """
        if not self._initialized:
            self.restore([])
        # Step 1. Rescan.
        src = self.source
        if src.watch and time.monotonic() - self._last_scan >= src.poll_interval:
            self._scan()
        # Step 2. Read.
        out: list[Any] = []
        while not out:
            cur = self._next_split()
            if cur is None:
                break
            out = cur.read(max_records)
            self.last_split = cur.rel
            self._advanced(cur)
        # Step 3. End of a bounded input?
        if not out and not src.watch and not self._open and not self._queue:
            return None
        return out

    def _next_split(self) -> _SplitReader | None:
        """The split to read from now: the open ones in turn, each new file
        opened when its turn comes (every file of the task is read
        interleaved, so each holds the task's watermark back until it ends)."""
        if self._queue:
            rel = self._queue.popleft()
            self._queued.discard(rel)
            prog = self._progress.setdefault(rel, {"file": rel, "offset": 0, "done": False})
            cur = self._open_split(rel, prog["offset"])
            prog["offset"] = cur.offset
            self._open.append(cur)
            return cur
        if not self._open:
            return None
        cur = self._open.popleft()
        self._open.append(cur)
        return cur

    def _open_split(self, rel: str, offset: int) -> _SplitReader:
        return _READERS[self.source.format](self._path(rel), rel, offset)

    def _advanced(self, cur: _SplitReader) -> None:
        """Record ``cur``'s position after a read; close it at its end."""
        prog = self._progress[cur.rel]
        prog["offset"] = cur.offset
        if cur.exhausted:
            prog["done"] = True
            cur.close()
            self._open.remove(cur)

    def unfinished_splits(self) -> list[Any]:
        """The files of this task not read to their end: open or queued."""
        return [cur.rel for cur in self._open] + list(self._queue)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """One entry per started or finished file, in name order."""
        return [dict(self._progress[rel]) for rel in sorted(self._progress)]

    def close(self) -> None:
        """Close the open files."""
        while self._open:
            self._open.popleft().close()


class FileSource(Source[Any]):
    """Records of the files in folder ``path`` (a local path or a URL, see
    :mod:`lockgate.fs`): JSONL (one ``json.loads`` per
    line), CSV (a dict per row; a header line is required) or Parquet (a dict per
    row). Bounded unless ``watch=True`` (then new files are picked up every
    ``poll_interval`` seconds)."""

    replayable = True
    # entries are per file; each task keeps the files it owns
    operator_state_mode = OperatorStateMode.UNION

    def __init__(
        self, path: str, format: str = "jsonl", watch: bool = False, poll_interval: float = 1.0
    ) -> None:
        """See the class docstring."""
        if format not in _FORMATS:
            raise LockgateError(f"FileSource: unknown format {format!r}; use one of {_FORMATS}")
        if poll_interval < 0:
            raise LockgateError("FileSource: poll_interval must be >= 0 seconds")
        # resolved here, in the driver: a task on a cluster runs in its
        # executor's working folder
        self.path = fs.absolute(path)
        self.format = format
        self.watch = watch
        self.poll_interval = poll_interval
        self.bounded = not watch

    def task_modules(self) -> tuple[str, ...]:
        parquet = ("pyarrow.parquet",) if self.format == "parquet" else ()
        return parquet + fs.modules_for(self.path)

    def validate(self) -> None:
        """In the driver, before any task starts: the folder exists (unless
        ``watch``, which waits for it)."""
        if self.watch:
            return
        try:
            present = fs.is_dir(self.path)
        except OSError:  # unreachable from here (a store's credentials): the tasks say
            return
        if not present:
            raise ConfigurationError(missing_folder(self.path))

    def create_reader(self, info: TaskInfo) -> SourceReader[Any]:
        """A :class:`FileSourceReader` for task ``info``."""
        return FileSourceReader(self, info)

    def __repr__(self) -> str:
        return f"FileSource({fs.redact(self.path)!r}, format={self.format!r}, watch={self.watch})"
