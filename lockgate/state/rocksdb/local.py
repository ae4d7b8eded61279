"""The RocksDB backend's local folders, and their clean-up: Lockgate deletes
only what it created and marked.

Layout, under the backend's ``local_dir`` (default: the system's temp
folder)::

    <local_dir>/lockgate-rocksdb-<uid>/        the base: this user's alone
        <job>/                                 one per job
            <op uid>-<task>-a<attempt>-<hex>/  one per keyed operator of a task
                .lockgate-task                 the mark: {"pid": ..., "host": ...}
                db/ ...                        the database

* The base is made 0700; if it exists it must be a real folder (no symbolic
  link) of this user (:func:`lockgate.fs.private.owned_dir`): another user
  cannot plant it, or a link in its place, to steer a deletion. Lockgate
  looks at nothing outside it, and ``<local_dir>`` itself is never written
  into but for the base.
* A task's folder is made under a hidden name (``.<name>.<hex>.new``),
  marked, then renamed: a folder with its name always has its mark. It is
  removed by renaming it to ``.<name>.<hex>.gone`` first, so a removal cut
  short (the process killed) leaves a name the next task recognises.
* When a task makes its folder, it removes the folders of the same operator
  and task from earlier attempts, folders whose mark names a process of this
  host that is gone (a task SIGKILLed, a job cancelled: nothing else would
  remove them), ``.gone`` folders, and ``.new`` folders older than
  :data:`ORPHAN_AGE`. Anything else in the base is left alone: entries
  that are no folders (symbolic links included) are never followed.
* When the task ends its folder is removed, then the job's folder and the
  base if they are empty.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time

from lockgate.fs import private
from lockgate.state.choice import BackendScope, RocksDBStateBackend

__all__ = ["task_folder", "remove_task_folder", "make_marked", "marked", "remove_folder",
           "listdir", "rmtree", "base_folder", "MARK", "ORPHAN_AGE"]

MARK = ".lockgate-task"
"""The file inside every task folder Lockgate made: its process and host."""

ORPHAN_AGE = 600.0
"""Seconds after which a folder still being made (``.new``) is an orphan."""

_TASK_RE = re.compile(r"^[A-Za-z0-9_.\-]+-\d+-a\d+-[0-9a-f]{8}$")


def base_folder(config: RocksDBStateBackend) -> str:
    """This user's base folder under the backend's ``local_dir`` (not made)."""
    return os.path.join(config.directory, f"lockgate-rocksdb-{os.geteuid()}")


def task_folder(config: RocksDBStateBackend, scope: BackendScope) -> str:
    """A new, marked local folder for one keyed operator of one task of one
    attempt; removes orphans first (see the module)."""
    base = base_folder(config)
    me = f"{_safe(scope.uid)}-{scope.task_index}-a"
    name = f"{me}{scope.attempt}-{secrets.token_hex(4)}"
    for tries in range(5):  # another task may remove the empty job folder or base meanwhile
        try:
            private.owned_dir(base)
            _remove_orphans(base)
            job = _job_folder(base, _safe(scope.job_id))
            _remove_earlier(job, me, scope.attempt)
            folder = os.path.join(job, name)
            make_marked(folder, MARK, {"pid": os.getpid(), "host": socket.gethostname()})
            return folder
        except FileNotFoundError:
            if tries == 4:
                raise
    raise AssertionError("unreachable")


def remove_task_folder(folder: str) -> None:
    """Remove a task's folder (:func:`remove_folder`), then its job folder
    and the base if they are left empty."""
    if not remove_folder(folder):
        return
    job = os.path.dirname(folder)
    for empty in (job, os.path.dirname(job)):
        try:
            os.rmdir(empty)
        except OSError:
            return


def _job_folder(base: str, job_id: str) -> str:
    job = os.path.join(base, job_id)
    with contextlib.suppress(FileExistsError):
        os.mkdir(job, private.DIR_MODE)
    st = os.lstat(job)
    if not stat.S_ISDIR(st.st_mode):
        raise private.UnsafeFolderError(
            f"{job} is not a folder (a symbolic link, or a file): Lockgate does not use it; "
            "remove it")
    return job


def make_marked(folder: str, mark: str, content: dict[str, object]) -> None:
    """``folder`` with its ``mark`` file (``content`` as JSON): made under a
    hidden name (``.<name>.<hex>.new``), marked, then renamed, so a folder
    with its name always has its mark; an existing one (another task made it)
    must be a real, marked folder."""
    if not os.path.lexists(folder):
        parent, name = os.path.split(folder)
        new = os.path.join(parent, f".{name}.{secrets.token_hex(4)}.new")
        os.mkdir(new, private.DIR_MODE)
        try:
            with private.open_new(os.path.join(new, mark)) as f:
                f.write(json.dumps(content).encode())
            os.rename(new, folder)
        except OSError as e:
            rmtree(new)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if not marked(folder, mark):
        raise private.UnsafeFolderError(
            f"{folder} is not a folder Lockgate made (no symbolic link, a {mark} file "
            "inside): it is not used; remove it")


def marked(folder: str, mark: str) -> bool:
    """A real folder (not a link) holding the regular file ``mark``."""
    try:
        return (stat.S_ISDIR(os.lstat(folder).st_mode)
                and stat.S_ISREG(os.lstat(os.path.join(folder, mark)).st_mode))
    except OSError:
        return False


def _remove_earlier(job: str, me: str, attempt: int) -> None:
    """The folders of this operator and task from attempts before ``attempt``."""
    for name in listdir(job):
        m = re.match(re.escape(me) + r"(\d+)-[0-9a-f]{8}$", name)
        if m and int(m.group(1)) < attempt and _is_dir(os.path.join(job, name)):
            remove_task_folder(os.path.join(job, name))


def _remove_orphans(base: str) -> None:
    """Task folders under ``base`` whose process is gone, folders whose
    removal or making was cut short; job folders left empty."""
    host = socket.gethostname()
    for job_name in listdir(base):
        job = os.path.join(base, job_name)
        if job_name.startswith(".") or not _is_dir(job):
            continue
        for name in listdir(job):
            path = os.path.join(job, name)
            if not _is_dir(path):
                continue
            if name.startswith(".") and name.endswith(".gone"):
                rmtree(path)
            elif name.startswith(".") and name.endswith(".new"):
                with contextlib.suppress(OSError):
                    if time.time() - os.lstat(path).st_mtime > ORPHAN_AGE:
                        rmtree(path)
            elif _TASK_RE.match(name) and _owner_gone(path, host):
                remove_task_folder(path)
        with contextlib.suppress(OSError):
            os.rmdir(job)


def _owner_gone(folder: str, host: str) -> bool:
    """Whether the mark of ``folder`` names a process of this host that is gone."""
    try:
        fd = os.open(os.path.join(folder, MARK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # no mark: not a folder Lockgate made; left alone
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        mark = json.loads(os.read(fd, 4096))
        pid, its_host = mark["pid"], mark["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    finally:
        os.close(fd)
    if its_host != host or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # alive under another user
    return False


def _is_dir(path: str) -> bool:
    """A real folder (a symbolic link is not followed)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_folder(path: str) -> bool:
    """Remove a folder Lockgate made: renamed ``.<name>.<hex>.gone`` first (a
    removal cut short leaves a name the next clean-up recognises); False if
    it could not be renamed (gone already)."""
    parent, name = os.path.split(path)
    gone = os.path.join(parent, f".{name}.{secrets.token_hex(4)}.gone")
    try:
        os.rename(path, gone)
    except OSError:
        return False
    rmtree(gone)
    return True


def listdir(path: str) -> list[str]:
    """The names in ``path``; none if it cannot be listed."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def rmtree(path: str) -> None:
    """Remove a folder Lockgate made; links inside are removed, never followed
    (``shutil.rmtree`` works on file descriptors here)."""
    shutil.rmtree(path, ignore_errors=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)[:100]
