"""Files read back from checkpoint storage are untrusted: one way to read them.

A checkpoint or savepoint folder may have been copied from elsewhere, or sit
in a bucket or on a disk others can write to. Whatever stands at a name that
``_metadata`` gives (a state file, a shared SST file, a changelog file, the
in-flight data of an unaligned checkpoint, ``_metadata`` itself) is read
only if it is a regular file, and never past what the checkpoint recorded:

* a symbolic link, a named pipe (FIFO), a device, a socket or a folder is
  refused without being read (local files are opened with ``O_NOFOLLOW`` and
  ``O_NONBLOCK``, so neither a link nor a FIFO is followed or waited on, and
  ``fstat`` must show the regular file that ``lstat`` showed);
* at most the recorded size plus one byte is read (a file without a
  recorded size, ``_metadata``: at most a fixed limit), so a huge file (or
  ``/dev/zero`` behind a name) fills neither memory nor disk;
* the CRC-32, where the checkpoint recorded one, is checked.

A refusal is a :class:`~lockgate.errors.CheckpointCorruptError` naming the
file and what is wrong with it (a copy's caller may build its own error from
what is wrong: :data:`Refuse`). A missing file is a ``FileNotFoundError``
(callers say what it means). Works for local paths and every URL of
:mod:`lockgate.fs` (object stores have no links or pipes; their objects'
size is checked the same way).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from lockgate import fs
from lockgate.errors import CheckpointCorruptError
from lockgate.fs import private

__all__ = ["read_checked", "copy_checked", "refuse_unless_regular", "Refuse", "MAX_METADATA",
           "CHUNK"]

MAX_METADATA = 256 << 20
"""The most bytes a ``_metadata`` file (or another file without a recorded
size) may have."""

CHUNK = 8 << 20
"""Bytes per read: a copy holds no more than this in memory."""

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Refuse = Callable[[str], Exception]
"""The error of a refusal, built from what is wrong with the file (a phrase
that follows its name: "is a symbolic link (...)", "has 10 bytes, the
checkpoint recorded 12: it is truncated", "does not match its checksum
(...)")."""


def read_checked(location: fs.Location, what: str, *, size: int | None = None,
                 limit: int = MAX_METADATA, crc32: int | None = None) -> bytes:
    """The bytes of the file ``location`` (``what`` it is, for messages: "state
    file", "shared file", ...), which must be a regular file of exactly
    ``size`` bytes (or, without ``size``, of at most ``limit``) with the
    CRC-32 ``crc32`` if given."""
    refuse = _refuser(location, what)
    parts = list(_chunks(location, refuse, size, limit))
    data = b"".join(parts)
    _check(refuse, len(data), size, limit, zlib.crc32(data) if crc32 is not None
           else None, crc32)
    return data


def copy_checked(location: fs.Location, target: str, what: str, *, size: int,
                 crc32: int | None = None, link: bool = False,
                 refuse: Refuse | None = None) -> None:
    """Make the local path ``target`` (new, 0600) a copy of the file
    ``location``, checked as :func:`read_checked` checks (streamed:
    :data:`CHUNK` at a time). ``link``: hard-link the very file that was
    checked instead of copying, where the filesystem allows it (a local
    file on the same device). A refusal raises ``refuse``'s error if given,
    else a ``CheckpointCorruptError`` naming ``what``; ``target`` is then
    removed. A missing file is a ``FileNotFoundError``."""
    refuse = refuse or _refuser(location, what)
    try:
        if link and fs.local_path(location) is not None and _link(location, target, refuse,
                                                                   size, crc32):
            return
        crc, got = 0, 0
        with private.open_new(target) as out:
            for chunk in _chunks(location, refuse, size, size):
                out.write(chunk)
                got += len(chunk)
                crc = zlib.crc32(chunk, crc)
        _check(refuse, got, size, size, crc if crc32 is not None else None, crc32)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(target)
        raise


# ------------------------------------------------------------------ checks

def _refuse(location: fs.Location, what: str, problem: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{what} {fs.redact(location)} {problem}: the checkpoint or savepoint is damaged or "
        "was crafted; it is not restored (restore another checkpoint, or take a new savepoint "
        "from a healthy job)")


def _refuser(location: fs.Location, what: str) -> Refuse:
    return functools.partial(_refuse, location, what)


def _check(refuse: Refuse, got: int, size: int | None, limit: int,
           crc: int | None, expected_crc: int | None) -> None:
    if size is not None and got > size:
        raise refuse(f"has more than the {size} bytes the checkpoint recorded")
    if size is not None and got < size:
        raise refuse(f"has {got} bytes, the checkpoint recorded {size}: it is truncated")
    if size is None and got > limit:
        raise refuse(f"is larger than {limit} bytes, more than such a file ever holds")
    if expected_crc is not None and crc != expected_crc:
        raise refuse("does not match its checksum (the CRC-32 the checkpoint recorded): "
                     "it is damaged")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link (links are not followed out of checkpoint storage)"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    return "is not a regular file"


# ------------------------------------------------------------------ local

def refuse_unless_regular(location: fs.Location, what: str) -> None:
    """Refuse a local ``location`` that is no regular file (nothing opened)."""
    path = fs.local_path(location)
    if path is not None:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, what, _kind(mode))


def open_local(path: str, refuse: Refuse) -> int:
    """A read-only descriptor of the regular file ``path``, refused (without
    opening it) if it is anything else; a link is never followed."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise refuse(_kind(st.st_mode))
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise refuse(_kind(stat.S_IFLNK)) from None
        raise
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev,
                                                                              st.st_ino):
        os.close(fd)
        raise refuse("was replaced while it was opened")
    return fd


def _read_fd(fd: int, bound: int) -> Iterator[bytes]:
    left = bound
    while left > 0:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _link(location: fs.Location, target: str, refuse: Refuse, size: int,
          crc32: int | None) -> bool:
    """Hard-link the checked file (the descriptor's inode, never a link at
    its name) as ``target``; False where that cannot be done (a copy then)."""
    path = fs.local_path(location)
    assert path is not None
    fd = open_local(path, refuse)
    try:
        got = os.fstat(fd).st_size
        if got != size:
            _check(refuse, got, size, size, None, None)
        if crc32 is not None:
            crc = 0
            for chunk in _read_fd(fd, size + 1):
                crc = zlib.crc32(chunk, crc)
            _check(refuse, size, size, size, crc, crc32)
        try:  # linkat(2) of the open file itself, following the /proc link
            os.link(f"/proc/self/fd/{fd}", target, follow_symlinks=True)
        except OSError:
            return False  # another device, no /proc, a filesystem without links
        return True
    finally:
        os.close(fd)


# ------------------------------------------------------------------ any

def _chunks(location: fs.Location, refuse: Refuse, size: int | None,
            limit: int) -> Iterator[bytes]:
    """The file's bytes, at most one more than ``size`` (or ``limit``)."""
    bound = (size if size is not None else limit) + 1
    path = fs.local_path(location)
    if path is not None:
        fd = open_local(path, refuse)
        try:
            on_disk = os.fstat(fd).st_size
            if on_disk >= bound:  # refused before anything is read
                _check(refuse, on_disk, size, limit, None, None)
            yield from _read_fd(fd, bound)
        finally:
            os.close(fd)
        return
    yield from _remote_chunks(location, refuse, bound)


def _remote_chunks(location: fs.Location, refuse: Refuse, bound: int) -> Iterator[bytes]:
    import pyarrow.fs as pafs

    filesystem, p = fs.resolve(location)
    info: Any = filesystem.get_file_info(p)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, f"{fs.redact(location)} does not exist")
    if info.type != pafs.FileType.File:
        raise refuse(_kind(stat.S_IFDIR) if info.type == pafs.FileType.Directory
                     else "is not a regular file")
    with filesystem.open_input_stream(p) as f:
        left = bound
        while left > 0:
            chunk = bytes(f.read(min(CHUNK, left)))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk
