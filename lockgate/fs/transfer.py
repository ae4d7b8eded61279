"""Files and folders from one location to another that may be on another
filesystem (another device, a different URL scheme, bucket or host):
renamed where one filesystem holds both, copied otherwise.

:func:`lockgate.fs.move` is a rename (atomic locally and on HDFS) and
refuses to cross filesystems (``EXDEV``, as ``rename(2)``); these functions
are for the callers that can do without the atomicity of one file's rename
(a savepoint publishes its whole folder at once instead, see
:func:`lockgate.checkpoint.storage.write_savepoint`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import zlib

from lockgate.fs import (
    Location,
    exists,
    finish_write,
    is_local,
    is_object_store,
    local_path,
    move,
    open_read,
    open_write,
    redact,
    resolve,
    sync_dir,
)

CHUNK = 8 << 20
"""Bytes per read and write of a copy: a copy holds no more than this in memory."""


def same_filesystem(a: Location, b: Location) -> bool:
    """Whether one filesystem reaches ``a`` and ``b`` (both local, or one URL
    root: scheme, bucket or host, and options), so that a rename may work
    (two local devices still refuse it, with ``EXDEV``)."""
    if is_local(a) or is_local(b):
        return is_local(a) and is_local(b)
    return resolve(a)[0] is resolve(b)[0]


def copy(src: Location, dst: Location, private: bool = False) -> int:
    """Copy the file ``src`` to ``dst`` (replacing it), between any two
    locations, streamed (:data:`CHUNK`) and as durable as
    :func:`lockgate.fs.finish_write` makes it; returns the bytes copied. On an
    error ``dst`` may exist in part: the caller removes it. ``private``: a
    local ``dst`` is 0600."""
    return copy_with_crc(src, dst, private)[0]


def copy_with_crc(src: Location, dst: Location, private: bool = False) -> tuple[int, int]:
    """:func:`copy`, returning ``(bytes copied, their CRC-32)``."""
    size, crc = 0, 0
    with open_read(src) as f:
        out = open_write(dst, private)
        try:
            while chunk := f.read(CHUNK):
                out.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        except BaseException:
            out.close()
            raise
        finish_write(out)
    return size, crc


def move_or_copy(src: Location, dst: Location, private: bool = False) -> None:
    """Give the file ``src`` the name ``dst``: a rename on one filesystem, a
    copy (:func:`copy`; ``private``: a local ``dst`` 0600) across
    filesystems, where ``src`` stays."""
    if same_filesystem(src, dst):
        try:
            move(src, dst)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:  # two local devices
                raise
    copy(src, dst, private)


def rename_dir(src: Location, dst: Location) -> None:
    """Give the folder ``src`` the name ``dst`` (which must not exist),
    atomically, on a filesystem with folders (local, then the parent is
    fsynced: if that fails, the rename is undone; HDFS). Object stores have
    none: ``OSError`` ``ENOTSUP``."""
    s, d = local_path(src), local_path(dst)
    if s is not None and d is not None:
        if os.path.lexists(d):  # rename(2) would replace an empty folder
            raise FileExistsError(errno.EEXIST, f"{d} already exists")
        os.rename(s, d)
        try:
            sync_dir(os.path.dirname(d))
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(d, s)  # the caller is told it failed: nothing may trust it
            raise
        return
    if not same_filesystem(src, dst) or is_object_store(src):
        raise OSError(errno.ENOTSUP, f"cannot rename the folder {redact(src)} to {redact(dst)}")
    if exists(dst):
        raise FileExistsError(errno.EEXIST, f"{redact(dst)} already exists")
    fs, sp = resolve(src)
    fs.move(sp, resolve(dst)[1])
