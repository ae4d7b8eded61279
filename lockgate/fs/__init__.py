"""Where files live: a local path, or a filesystem URL every executor can reach.

A *location* is a string, so it travels inside a pickled ``TaskSpec`` or sink to
any machine, and everything needed to reach it is in it:

* a plain path or a ``file://`` URL: the local filesystem, through plain Python
  I/O (``open``, ``os.replace``, ``fsync``): the fast path, unchanged;
* any other URL (``s3://bucket/prefix``, ``hdfs://namenode:8020/path``,
  ``gs://bucket/prefix``): resolved by :func:`pyarrow.fs.FileSystem.from_uri`,
  with its options in the query string, e.g.
  ``s3://bucket/chk?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``
  and optionally credentials as ``s3://KEY:SECRET@bucket/chk``. Whatever the URL
  does not say (credentials, region, ``AWS_ENDPOINT_URL``) comes from the
  environment of the process that uses it, as usual for the AWS SDK.

Object stores (S3, GCS, Azure) have no folders and no rename: a "folder" is a
key prefix, an object appears only once its upload completed (one PUT, or a
completed multipart upload: atomic either way), and a move is a server-side
copy followed by a delete. ``fsync`` and folder syncs are no-ops there.

Every function takes a location; names joined onto a URL are percent-encoded,
so any file name is safe in a URL.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import threading
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from lockgate.fs import private as _private

if TYPE_CHECKING:
    import pyarrow.fs as pafs

__all__ = [
    "is_url", "is_local", "local_path", "modules_for", "is_object_store", "resolve", "join",
    "parent", "basename", "absolute", "redact", "exists", "is_dir", "is_file", "listdir",
    "list_sizes", "walk_files", "makedirs", "open_write", "finish_write", "write_atomic",
    "read_bytes", "open_read", "remove", "rmtree", "move", "sync_dir",
]

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})
"""``FileSystem.type_name`` of the stores without folders or rename."""

Location = str | os.PathLike[str]

# ------------------------------------------------------------------ naming


def is_url(location: Location) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a plain path."""
    return bool(_URL_RE.match(os.fspath(location)))


def local_path(location: Location) -> str | None:
    """The OS path of a local location (plain path or ``file://``); ``None``
    for any other URL."""
    loc = os.fspath(location)
    if not _URL_RE.match(loc):
        return loc
    parts = urlsplit(loc)
    if parts.scheme.lower() == "file" and parts.netloc in ("", "localhost"):
        return unquote(parts.path)
    return None


def is_local(location: Location) -> bool:
    """Whether ``location`` is on the local filesystem."""
    return local_path(location) is not None


def modules_for(location: Location) -> tuple[str, ...]:
    """The modules reading or writing ``location`` imports: ``pyarrow.fs``
    for anything but the local filesystem (a task host imports them before
    it forks tasks: :meth:`lockgate.connectors.base.Source.task_modules`)."""
    return () if is_local(location) else ("pyarrow.fs",)


def join(location: Location, *names: str) -> str:
    """``location`` with ``names`` appended (``/`` inside a name separates parts).
    A URL keeps its query string (the filesystem options) at the end."""
    loc = os.fspath(location)
    if not _URL_RE.match(loc):
        return os.path.join(loc, *names)
    parts = urlsplit(loc)
    path = parts.path.rstrip("/")
    for name in names:
        for part in name.split("/"):
            if part:
                path += "/" + quote(part, safe="")
    return urlunsplit(parts._replace(path=path))


def basename(location: Location) -> str:
    """The last name of ``location``."""
    loc = os.fspath(location)
    if not _URL_RE.match(loc):
        return os.path.basename(loc.rstrip(os.sep)) or loc
    return unquote(urlsplit(loc).path.rstrip("/").rsplit("/", 1)[-1])


def parent(location: Location) -> str:
    """The folder holding ``location``."""
    loc = os.fspath(location)
    if not _URL_RE.match(loc):
        return os.path.dirname(loc.rstrip(os.sep)) or "."
    parts = urlsplit(loc)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/").rsplit("/", 1)[0]))


def absolute(location: Location) -> str:
    """A plain path made absolute (tasks may run in another working folder);
    URLs unchanged."""
    loc = os.fspath(location)
    return loc if _URL_RE.match(loc) else os.path.abspath(loc)


def redact(location: Location) -> str:
    """``location`` with a secret in it (``s3://KEY:SECRET@...``) masked, for messages."""
    loc = os.fspath(location)
    if not _URL_RE.match(loc):
        return loc
    parts = urlsplit(loc)
    if "@" not in parts.netloc:
        return loc
    user, host = parts.netloc.rsplit("@", 1)
    user = user.split(":", 1)[0] + ":***" if ":" in user else user
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


# --------------------------------------------------------------- resolution

_cache: dict[tuple[str, str, str], tuple[pafs.FileSystem, str]] = {}
_cache_lock = threading.Lock()


def _root(scheme: str, netloc: str, query: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of a URL root and the filesystem path of that root; one
    instance per root (connection pools are reused), made on first use."""
    key = (scheme, netloc, query)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    import pyarrow.fs as pafs

    if scheme == "s3" and "allow_delayed_open" not in query:
        # Objects smaller than one upload part become ONE PutObject instead of
        # create + upload part + complete: fewer round trips per file.
        query = f"{query}&allow_delayed_open=true" if query else "allow_delayed_open=true"
    fs, root = pafs.FileSystem.from_uri(urlunsplit((scheme, netloc, "/", query, "")))
    with _cache_lock:
        _cache.setdefault(key, (fs, root))
        return _cache[key]


def resolve(location: Location) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow filesystem, path in it)`` of ``location``: a plain path or
    ``file://`` gives the ``LocalFileSystem`` and the absolute path; another URL
    gives what ``pyarrow.fs.FileSystem.from_uri`` makes of it (``s3``, ``hdfs``,
    ``gs``, ...), with the query string as its options.

    Raises:
        ValueError: an unknown scheme or option (the message says which).
    """
    loc = os.fspath(location)
    path = local_path(loc)
    if path is not None:
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem(), os.path.abspath(path)
    parts = urlsplit(loc)
    try:
        fs, root = _root(parts.scheme.lower(), parts.netloc, parts.query)
    except Exception as e:  # pyarrow raises ArrowInvalid (a ValueError) or OSError
        raise ValueError(f"cannot use {redact(loc)!r} as a filesystem URL: {e}") from e
    sub = unquote(parts.path).strip("/")
    if not sub:
        return fs, root
    return fs, (f"{root.rstrip('/')}/{sub}" if root else sub)


def is_object_store(location: Location) -> bool:
    """Whether ``location`` is in a store without folders or rename (S3, GCS, Azure)."""
    if is_local(location):
        return False
    return resolve(location)[0].type_name in _OBJECT_STORES


# --------------------------------------------------------------------- I/O


def _not_found(location: Location) -> FileNotFoundError:
    return FileNotFoundError(f"{redact(location)} does not exist")


def _file_info(location: Location) -> Any:
    fs, path = resolve(location)
    return fs.get_file_info(path)


def exists(location: Location) -> bool:
    path = local_path(location)
    if path is not None:
        return os.path.exists(path)
    import pyarrow.fs as pafs

    return bool(_file_info(location).type != pafs.FileType.NotFound)


def is_dir(location: Location) -> bool:
    """A folder (in an object store: a prefix some object has)."""
    path = local_path(location)
    if path is not None:
        return os.path.isdir(path)
    import pyarrow.fs as pafs

    return bool(_file_info(location).type == pafs.FileType.Directory)


def is_file(location: Location) -> bool:
    path = local_path(location)
    if path is not None:
        return os.path.isfile(path)
    import pyarrow.fs as pafs

    return bool(_file_info(location).type == pafs.FileType.File)


def list_sizes(location: Location) -> dict[str, int | None]:
    """Every entry of the folder ``location`` by name, with the size of files
    (``None`` for folders); empty if the folder does not exist."""
    path = local_path(location)
    if path is not None:
        try:
            with os.scandir(path) as it:
                return {e.name: (None if e.is_dir() else e.stat().st_size) for e in it}
        except (FileNotFoundError, NotADirectoryError):
            return {}
    import pyarrow.fs as pafs

    fs, p = resolve(location)
    out: dict[str, int | None] = {}
    for info in fs.get_file_info(pafs.FileSelector(p, allow_not_found=True)):
        out[info.base_name] = info.size if info.type == pafs.FileType.File else None
    return out


def listdir(location: Location) -> list[str]:
    """The names in the folder ``location`` (empty if it does not exist)."""
    path = local_path(location)
    if path is not None:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []
    return list(list_sizes(location))


def walk_files(location: Location) -> dict[str, int]:
    """Every file below the folder ``location`` (recursively) by its
    ``/``-separated name relative to it, with its size: one listing request on
    an object store."""
    path = local_path(location)
    out: dict[str, int] = {}
    if path is not None:
        for root, _dirs, files in os.walk(path):
            rel_root = os.path.relpath(root, path)
            for name in files:
                rel = name if rel_root == "." else os.path.join(rel_root, name)
                try:
                    out[rel.replace(os.sep, "/")] = os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    pass
        return out
    import pyarrow.fs as pafs

    fs, p = resolve(location)
    prefix = p.rstrip("/") + "/"
    for info in fs.get_file_info(pafs.FileSelector(p, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.path.startswith(prefix):
            out[info.path[len(prefix):]] = info.size
    return out


def makedirs(location: Location, private: bool = False) -> None:
    """Create the folder ``location`` and its parents (nothing in an object
    store, where folders do not exist). ``private``: local folders made are
    0700 (:mod:`lockgate.fs.private`)."""
    path = local_path(location)
    if path is not None:
        if private:
            _private.make_dir(path)
        else:
            os.makedirs(path, exist_ok=True)
        return
    fs, p = resolve(location)
    if fs.type_name not in _OBJECT_STORES:
        fs.create_dir(p, recursive=True)


def open_write(location: Location, private: bool = False) -> IO[bytes]:
    """A new file for writing (replaces an existing one). Close it with
    :func:`finish_write`. In an object store nothing is visible before that.
    ``private``: a local file is 0600 and never written through a link."""
    path = local_path(location)
    if path is not None:
        return _private.open_new(path) if private else open(path, "wb")
    fs, p = resolve(location)
    return fs.open_output_stream(p)  # type: ignore[no-any-return]


def finish_write(f: IO[bytes]) -> None:
    """Close a file of :func:`open_write` durably: flush and fsync a local file;
    complete the upload of an object (errors are raised here)."""
    try:
        if isinstance(f, io.BufferedWriter | io.FileIO):  # local: from open()
            f.flush()
            os.fsync(f.fileno())
    finally:
        f.close()


def write_atomic(location: Location, data: bytes, private: bool = False) -> None:
    """Write a whole file so that readers see all of it or nothing
    (``private``: a local file is 0600).

    Local: a hidden temp file, fsync, rename, fsync of the folder; on a failure
    nothing it wrote stays. Object store: ONE object write (an object appears
    only complete; never by copy). HDFS: temp file, then rename (atomic there).
    """
    path = local_path(location)
    if path is not None:
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.tmp")
        done = tmp
        try:
            with _private.open_new(tmp) if private else open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            done = path
            sync_dir(folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(done)  # e.g. a rename whose folder fsync failed
            raise
        return
    fs, p = resolve(location)
    if fs.type_name in _OBJECT_STORES:
        with fs.open_output_stream(p) as out:
            out.write(data)
        return
    head, _, name = p.rpartition("/")
    tmp = f"{head}/.{name}.tmp"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, p)


def read_bytes(location: Location) -> bytes:
    """The whole content of a file; ``FileNotFoundError`` if it does not exist."""
    path = local_path(location)
    if path is not None:
        with open(path, "rb") as f:
            return f.read()
    import pyarrow.fs as pafs

    fs, p = resolve(location)
    try:
        with fs.open_input_stream(p) as f:
            return bytes(f.read())
    except FileNotFoundError:
        raise _not_found(location) from None
    except OSError:
        if fs.get_file_info(p).type == pafs.FileType.NotFound:
            raise _not_found(location) from None
        raise


def open_read(location: Location) -> IO[bytes]:
    """A buffered, seekable binary file for reading (``readline`` works)."""
    path = local_path(location)
    if path is not None:
        return open(path, "rb")
    fs, p = resolve(location)
    return io.BufferedReader(fs.open_input_file(p), buffer_size=1 << 20)


def remove(location: Location) -> None:
    """Delete a file; nothing if it does not exist."""
    path = local_path(location)
    if path is not None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    fs, p = resolve(location)
    try:
        fs.delete_file(p)
    except FileNotFoundError:
        pass


def rmtree(location: Location) -> None:
    """Delete a folder and everything in it; nothing if it does not exist."""
    path = local_path(location)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, p = resolve(location)
    try:
        fs.delete_dir(p)
    except FileNotFoundError:
        pass


def move(src: Location, dst: Location) -> None:
    """Give the file ``src`` the name ``dst`` (replacing it). Local and HDFS: an
    atomic rename. Object store: a server-side copy, then the delete of
    ``src``; if it stops between the two, both exist with the same content and
    calling ``move`` again finishes it. Across filesystems (device, scheme,
    bucket): ``EXDEV`` as rename(2) (:mod:`lockgate.fs.transfer` copies)."""
    s, d = local_path(src), local_path(dst)
    if s is not None and d is not None:
        os.replace(s, d)
        return
    fs, sp = resolve(src)
    dfs, dp = resolve(dst)
    if d is not None or dfs is not fs:  # another scheme, bucket or host
        raise OSError(errno.EXDEV, f"{redact(src)} -> {redact(dst)}: another filesystem")
    if fs.type_name in _OBJECT_STORES:
        fs.copy_file(sp, dp)
        fs.delete_file(sp)
    else:
        fs.move(sp, dp)


def sync_dir(location: Location) -> None:
    """Make renames and deletions in a local folder durable; nothing elsewhere
    (object stores and HDFS persist them when the request returns). A failure
    is raised: a checkpoint that relied on it must not complete."""
    path = local_path(location)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        # As PostgreSQL's fsync_fname: a folder that cannot be opened (Windows,
        # no read permission), or fsynced (EINVAL, EBADF: some FUSE and network
        # filesystems), cannot be synced at all: go on. EIO, ENOSPC: raised.
        if e.errno in (errno.EACCES, errno.EISDIR):
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)
