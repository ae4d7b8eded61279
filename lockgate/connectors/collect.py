"""A sink that collects records into files, for tests and notebooks.

``CollectSink`` uses the file sink's two-phase commit, so ``results()`` sees each
committed record exactly once, even after failures and restarts. Records are
stored with :class:`lockgate.state.serde.StateSerializer` (no pickle; exact
round-trip of tuples, ints, ...) as length-prefixed frames (format ``"lgrec"``:
a 4-byte big-endian length, then the serialized record).
"""

from __future__ import annotations

import struct
import tempfile
from typing import Any

from lockgate import fs
from lockgate.connectors.base import Sink, SinkWriter, TaskInfo
from lockgate.connectors.filesink import FileSinkWriter, ensure_writable_dir
from lockgate.connectors.filesink_plan import parse_part_name, part_sort_key
from lockgate.connectors.formats import RecordFormat
from lockgate.errors import LockgateError

__all__ = ["CollectSink", "LgrecFormat", "read_lgrec"]

_LEN = struct.Struct(">I")


def _serializer() -> Any:
    from lockgate.state.serde import StateSerializer

    return StateSerializer(allow_pickle=False)


class LgrecFormat(RecordFormat):
    """Length-prefixed ``StateSerializer`` frames, one per record."""

    ext = "lgrec"
    streaming = True

    def __init__(self) -> None:
        """Create the serializer (no pickle)."""
        self._dumps = _serializer().dumps

    def encode_batch(self, batch: list[Any]) -> bytes:
        """``batch`` as consecutive frames."""
        pack, dumps = _LEN.pack, self._dumps
        parts: list[bytes] = []
        for record in batch:
            data = dumps(record)
            parts.append(pack(len(data)))
            parts.append(data)
        return b"".join(parts)


def read_lgrec(data: bytes, loads: Any = None) -> list[Any]:
    """Decode the records of one ``lgrec`` file's bytes."""
    if loads is None:
        loads = _serializer().loads
    out: list[Any] = []
    pos, end, size = 0, len(data), _LEN.size
    while pos < end:
        if pos + size > end:
            raise LockgateError("collect sink: truncated lgrec frame header; the file is corrupt")
        (n,) = _LEN.unpack_from(data, pos)
        pos += size
        if pos + n > end:
            raise LockgateError("collect sink: truncated lgrec frame; the file is corrupt")
        out.append(loads(data[pos : pos + n]))
        pos += n
    return out


class CollectSink(Sink[Any]):
    """Exactly-once collection of a pipeline's output into ``path`` (a new
    temporary folder if ``None``); read it back with :meth:`results`."""

    exactly_once = True

    def __init__(self, path: str | None = None) -> None:
        """``path``: the folder of the committed files (created if missing), a
        local path or a URL (see :mod:`lockgate.fs`); ``None``: a temporary
        local folder, made when the job starts."""
        # resolved here, in the driver: tasks may run in another working folder
        self.path: str | None = fs.absolute(path) if path is not None else None

    def validate(self) -> None:
        """Called in the driver before the job starts: fix the folder."""
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="lockgate-collect-")
        ensure_writable_dir(self.path, ".lockgate-probe-driver")

    def create_writer(self, info: TaskInfo) -> SinkWriter[Any]:
        """A two-phase-commit file writer of ``lgrec`` files for task ``info``."""
        if self.path is None:
            raise LockgateError("CollectSink has no folder yet: run the pipeline first")
        return FileSinkWriter(info, self.path, LgrecFormat())

    def discard(self) -> None:
        """Delete the folder and everything collected in it."""
        if self.path is not None:
            fs.rmtree(self.path)

    def results(self) -> list[Any]:
        """Every committed record, file by file in name order (numeric parts
        compared as numbers), each record once. Hidden files are never read."""
        if self.path is None:
            return []
        names = []
        for name in fs.listdir(self.path):
            p = parse_part_name(name)
            if p is not None and p.kind == "final" and p.ext == LgrecFormat.ext:
                names.append(name)
        loads = _serializer().loads
        out: list[Any] = []
        for name in sorted(names, key=part_sort_key):
            out.extend(read_lgrec(fs.read_bytes(fs.join(self.path, name)), loads))
        return out

    def __repr__(self) -> str:
        return f"CollectSink({self.path!r})"
