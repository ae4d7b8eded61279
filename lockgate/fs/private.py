"""Private local folders and files: what Lockgate creates on a local disk
holds the users' data (checkpoint state files, ``_metadata``, shared SST
files, RocksDB working copies), so it is created for its owner alone
(folders 0700, files 0600, whatever the umask).

* :func:`make_dir`: a folder made private where it is made (its missing
  parents too); an existing one is used as it is.
* :func:`owned_dir`: a folder Lockgate keeps its own things in and may delete
  inside (a base folder): made 0700 if missing; if it exists it must be a
  real folder (not a symbolic link) owned by this user, and is made 0700. A
  folder another user owns, or a link planted in its place, is refused with
  an error naming it and the fix.
* :func:`open_new`: a file for writing, 0600, never through a symbolic link
  at its name.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO

from lockgate.errors import ConfigurationError

__all__ = ["DIR_MODE", "FILE_MODE", "make_dir", "owned_dir", "open_new", "UnsafeFolderError"]

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafeFolderError(ConfigurationError):
    """A folder Lockgate would own is not safe to use (another user's, a
    symbolic link, not a folder)."""


def make_dir(path: str) -> None:
    """Create the folder ``path`` and its missing parents, each 0700; an
    existing folder is left as it is."""
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        up = os.path.dirname(p)
        if up == p:
            break
        p = up
    for p in reversed(missing):
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(p):
                raise
        else:
            os.chmod(p, DIR_MODE, follow_symlinks=False)


def owned_dir(path: str) -> str:
    """``path`` as a folder this user owns alone (see the module); returns it."""
    parent = os.path.dirname(os.path.abspath(path))
    make_dir(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    check_owned(path)
    return path


def check_owned(path: str) -> os.stat_result:
    """The ``lstat`` of ``path`` if it is a real folder owned by this user
    (made 0700 if it was not); :class:`UnsafeFolderError` otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeFolderError(f"the folder {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFolderError(
            f"{path} is a symbolic link, not a folder: Lockgate keeps its own files there and "
            "deletes inside it, so it follows no link; remove the link, or give another folder")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(f"{path} is not a folder: remove it, or give another folder")
    if st.st_uid != os.geteuid():
        raise UnsafeFolderError(
            f"{path} belongs to another user (uid {st.st_uid}, this process runs as "
            f"{os.geteuid()}): Lockgate keeps its own files there and deletes inside it, so "
            "it uses only a folder of its own user; remove that folder, or give another one")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)
    return st


def open_new(path: str) -> IO[bytes]:
    """``path`` opened for writing (created 0600, or truncated and made
    0600); a symbolic link at ``path`` is refused (``ELOOP``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link: not written through") from e
        raise
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
