"""Local recovery: a task keeps its last completed checkpoint's RocksDB
files on its own host, and a restart there restores from them instead of
reading them from the checkpoint storage (Flink's
``state.backend.local-recovery``). ``RocksDBStateBackend(local_recovery=...)``,
on by default with incremental checkpoints.

Layout, under the backend's ``local_dir`` (default: the system's temp
folder), beside the tasks' working folders::

    <local_dir>/lockgate-recovery-<uid>/              the base: this user's alone
        <job>/                                        one per job; mark .lockgate-job
            <op uid>-<hash>-kg<start>-<stop>/         one per keyed operator and key-group
                                                      range; mark .lockgate-copies
                chk-<n>/                              the copy of checkpoint n
                    manifest.json                     checkpoint, job, operator, key groups,
                                                      host, and the checkpoint's file names
                    db/<local name>.sst               the materialization's SST files
                    log/<shared name>.sst             the changelog files, in the handle's order

**What a copy holds.** The SST files the checkpoint's handle names
(:class:`~lockgate.state.incremental.IncrementalState`): hard links of
the very files its upload read (the RocksDB checkpoint folder of a
materialization, a changelog file before it is deleted), no second write;
files the previous copy holds already are linked from it. The small private
files (``CURRENT``, ``MANIFEST``, ``OPTIONS``) are not kept: they are in the
task's state file, which a restore reads anyway.

**Lifecycle.** A copy is made on the snapshot thread while its checkpoint is
written, and is complete (renamed from ``.chk-<n>.new``) before the task
acknowledges the checkpoint. When checkpoint ``n`` completes, the task
deletes its copies older than ``n`` and the newer ones it did not make (a
run before): one completed copy is kept, with those still pending. A restore
keeps the copy it restored from and deletes the others; a task that owns
other key groups than the copies of its operator (a rescale) deletes those.
The driver deletes the job's folder on its host when the job ends, and so
does every Spark task host of the job as it is released; a job folder
nothing touched for :data:`STALE_AGE` (a driver that was killed) is deleted
by the next task that keeps a copy on that host. A copy is only a
faster path: deleting one costs a download at the next restore, never
correctness, and a copy that cannot be made (a full disk) is skipped with a
warning, never failing the checkpoint.

**Restore.** Only a failover within the same job (the checkpoint restored is
in the task's own job folder), at the same key groups, on the same host
looks for a copy: the folder of its operator and key groups, ``chk-<n>`` for
the checkpoint restored. It is used only if every check passes, else the
files come from the checkpoint storage as without local recovery, and the
task says which (:class:`LocalRestore`, in its log and sent to the driver):

* every folder on the way is a real folder (no symbolic link), below the base
  folder this user owns (:func:`lockgate.fs.private.check_owned`); every name
  comes from the checkpoint's handle, checked as untrusted;
* the manifest names the same checkpoint, job, operator, key groups and host,
  and the same file names as the checkpoint's handle (the shared files'
  names carry random tokens: a copy of another run cannot pass);
* ``db/`` and ``log/`` hold exactly those files, each a regular file (a link
  is refused, never followed) of the size the checkpoint recorded, whose
  CRC-32 matches the checkpoint's, checked as it is hard-linked (SST files)
  or copied (changelog files, which ingestion may write into) into the
  task's database.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lockgate.fs import private
from lockgate.fs.checked import copy_checked
from lockgate.state.incremental import IncrementalState, SharedFile
from lockgate.state.rocksdb.local import listdir, make_marked, marked, remove_folder, rmtree

__all__ = ["LocalCopies", "LocalRestore", "CopyUnusable", "link_checked", "remove_job",
           "base_folder", "STALE_AGE"]

log = logging.getLogger("lockgate.task")

STALE_AGE = 24 * 3600.0
"""Seconds after which a job folder whose copies nothing touched is deleted
by the next task keeping a copy on the host (a job whose driver was killed)."""

JOB_MARK = ".lockgate-job"
COPIES_MARK = ".lockgate-copies"
MANIFEST = "manifest.json"
FORMAT = 1
_MAX_MANIFEST = 16 << 20

_CHK_RE = re.compile(r"^chk-(\d{1,18})$")
_RANGE_RE = re.compile(r"^(\d{1,9})-(\d{1,9})$")
_NEW_RE = re.compile(r"^\.chk-(\d{1,18})\.new$")
_GONE_RE = re.compile(r"^\..+\.gone$")
_MAKING_RE = re.compile(r"^\..+\.[0-9a-f]{8}\.new$")
MAKING_AGE = 600.0
"""Seconds after which a marked folder still being made (``.<name>.<hex>.new``)
is an orphan."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NO_LINKS = (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK)
"""A hard link refused for good: another device, a filesystem without them."""


@dataclass(frozen=True)
class LocalRestore:
    """What a restore of one keyed operator's state did about its local copy:
    used it (``local``), or read the checkpoint storage because of ``reason``."""

    checkpoint_id: int
    local: bool
    reason: str = ""

    def describe(self) -> str:
        if self.local:
            return f"restored from local copy of checkpoint {self.checkpoint_id}"
        return (f"local copy of checkpoint {self.checkpoint_id} unusable ({self.reason}): "
                "downloading")


class CopyUnusable(Exception):
    """A local copy that does not pass its checks; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def base_folder(directory: str) -> str:
    """This user's base folder of local copies under ``directory`` (the
    backend's ``local_dir``, or the system's temp folder)."""
    return os.path.join(directory, f"lockgate-recovery-{os.geteuid()}")


def _job_name(job_id: str) -> str:
    return _safe(job_id, 80) + "-" + hashlib.sha256(job_id.encode()).hexdigest()[:8]


def _copies_name(uid: str, key_groups: tuple[int, int]) -> str:
    digest = hashlib.sha256(uid.encode()).hexdigest()[:8]
    return f"{_safe(uid, 80)}-{digest}-kg{key_groups[0]}-{key_groups[1]}"


def _safe(name: str, most: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)[:most].lstrip(".") or "_"


@dataclass(frozen=True)
class _Copy:
    """A complete copy this task made: where, and the file names it holds."""

    checkpoint_id: int
    path: str
    shared: dict[str, str]
    """Local SST name -> the shared file's name."""
    changelog: tuple[str, ...]


class LocalCopies:
    """The local copies of one keyed operator's state in one task (its key
    groups): made on the snapshot thread (:meth:`begin`, :meth:`add`,
    :meth:`finish`), pruned on the task thread (:meth:`completed`), read by
    a restore (:meth:`find`, :meth:`restored`). Never raises on the
    snapshot side: a copy that cannot be made is skipped with a warning."""

    def __init__(self, directory: str, job_id: str, uid: str, key_groups: range) -> None:
        self.base = base_folder(directory)
        self.job_id = job_id
        self.uid = uid
        self.key_groups = (key_groups.start, key_groups.stop)
        self.job = os.path.join(self.base, _job_name(job_id))
        self.folder = os.path.join(self.job, _copies_name(uid, self.key_groups))
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        self._ready = False
        self._made: set[int] = set()
        """Copies this task made (pending or completed)."""
        self._last: _Copy | None = None
        """The newest complete copy this task made (snapshot thread)."""
        self._writing: int | None = None
        """The checkpoint whose copy is being made (None: none, or it failed)."""
        self._off = False
        """Copies cannot be made here (no hard links): none is tried again."""

    # -------------------------------------------------------- folders
    def _ensure(self) -> None:
        """Make the base, job and operator folders (each marked); delete
        stale job folders and this operator's copies of other key groups."""
        with self._lock:
            if self._ready:
                return
            private.owned_dir(self.base)
            _remove_stale_jobs(self.base, keep=os.path.basename(self.job))
            make_marked(self.job, JOB_MARK, {"job": self.job_id, "host": self.host})
            me = os.path.basename(self.folder)
            prefix = me[:me.rindex("-kg") + 3]
            start, stop = self.key_groups
            for name in listdir(self.job):
                m = _RANGE_RE.match(name[len(prefix):]) if name.startswith(prefix) else None
                if (m is not None and name != me and int(m.group(1)) < stop
                        and int(m.group(2)) > start
                        and marked(os.path.join(self.job, name), COPIES_MARK)):
                    # key groups overlapping this task's: another parallelism's,
                    # which no task owns now
                    remove_folder(os.path.join(self.job, name))
            make_marked(self.folder, COPIES_MARK,
                         {"operator": self.uid, "key_groups": list(self.key_groups)})
            self._ready = True

    def _copy_path(self, checkpoint_id: int) -> str:
        return os.path.join(self.folder, f"chk-{checkpoint_id}")

    def _new_path(self, checkpoint_id: int) -> str:
        return os.path.join(self.folder, f".chk-{checkpoint_id}.new")

    # -------------------------------------------------- snapshot thread
    def begin(self, checkpoint_id: int) -> None:
        """A checkpoint's files are about to be uploaded: start its copy."""
        self._writing = None
        if self._off:
            return
        try:
            self._ensure()
            for name in listdir(self.folder):  # an earlier write that failed
                if _NEW_RE.match(name):
                    remove_folder(os.path.join(self.folder, name))
            new = self._new_path(checkpoint_id)
            os.mkdir(new, private.DIR_MODE)
            os.mkdir(os.path.join(new, "db"), private.DIR_MODE)
            os.mkdir(os.path.join(new, "log"), private.DIR_MODE)
            self._writing = checkpoint_id
        except private.UnsafeFolderError as e:
            self._off = True  # a link or another user's folder in its place: never used
            log.warning("operator %s: local recovery is off for this task: %s", self.uid, e)
        except OSError as e:
            self._skip(checkpoint_id, e)

    def add(self, kind: str, name: str, path: str) -> None:
        """The file ``path`` (read by the upload) holds the checkpoint's SST
        file ``name``: ``kind`` ``db`` (a local SST name of the
        materialization) or ``log`` (a changelog file's shared name)."""
        n = self._writing
        if n is None:
            return
        try:
            os.link(path, os.path.join(self._new_path(n), kind, name), follow_symlinks=False)
        except OSError as e:
            self._skip(n, e)

    def finish(self, checkpoint_id: int, state: IncrementalState) -> None:
        """The checkpoint's handle is ``state``: link what the upload did not
        read from the previous copy, write the manifest, and publish the copy."""
        if self._writing != checkpoint_id:
            return
        self._writing = None
        new = self._new_path(checkpoint_id)
        try:
            last = self._last
            for local, ref in state.shared.items():
                target = os.path.join(new, "db", local)
                if not os.path.lexists(target):
                    if last is None or last.shared.get(local) != ref.name:
                        raise FileNotFoundError(errno.ENOENT, f"no local file holds {local}")
                    os.link(os.path.join(last.path, "db", local), target,
                            follow_symlinks=False)
            for ref in state.changelog:
                target = os.path.join(new, "log", ref.name)
                if not os.path.lexists(target):
                    if last is None or ref.name not in last.changelog:
                        raise FileNotFoundError(errno.ENOENT, f"no local file holds {ref.name}")
                    os.link(os.path.join(last.path, "log", ref.name), target,
                            follow_symlinks=False)
            shared = {local: ref.name for local, ref in state.shared.items()}
            changelog = tuple(ref.name for ref in state.changelog)
            manifest = {"format": FORMAT, "checkpoint": checkpoint_id, "job": self.job_id,
                        "operator": self.uid, "key_groups": list(self.key_groups),
                        "host": self.host, "shared": shared, "changelog": list(changelog)}
            with private.open_new(os.path.join(new, MANIFEST)) as f:
                f.write(json.dumps(manifest, sort_keys=True).encode())
            final = self._copy_path(checkpoint_id)
            if os.path.lexists(final):  # a run before made one under this number
                remove_folder(final)
            os.rename(new, final)
        except OSError as e:
            self._skip(checkpoint_id, e)
            return
        with self._lock:
            self._made.add(checkpoint_id)
        self._last = _Copy(checkpoint_id, final, shared, changelog)

    def _skip(self, checkpoint_id: int, e: OSError) -> None:
        self._writing = None
        with contextlib.suppress(OSError):
            remove_folder(self._new_path(checkpoint_id))
        if e.errno in _NO_LINKS:
            self._off = True
            log.warning("operator %s: local recovery is off for this task: the filesystem of "
                        "local_dir cannot hard-link its files (%s: %s); restores read the "
                        "checkpoint storage", self.uid, type(e).__name__, e)
            return
        log.warning("operator %s: no local copy of checkpoint %d (%s: %s); a restore would "
                    "read it from the checkpoint storage", self.uid, checkpoint_id,
                    type(e).__name__, e)

    # ------------------------------------------------------ task thread
    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: delete the copies before it,
        and those after it this task did not make."""
        with self._lock:
            if not self._ready:
                return
            made = set(self._made)
            self._made = {n for n in made if n >= checkpoint_id}
        self._prune(lambda n: n < checkpoint_id or n > checkpoint_id and n not in made)

    def restored(self, checkpoint_id: int | None) -> None:
        """A restore is over: keep the copy of ``checkpoint_id`` it used (None:
        none), delete every other copy of this operator and key groups (and
        of other key groups, :meth:`_ensure`); nothing is made when the job
        has no copies on this host."""
        if checkpoint_id is None and not marked(self.job, JOB_MARK):
            return
        try:
            self._ensure()
        except (OSError, private.UnsafeFolderError) as e:
            log.warning("operator %s: cannot prepare its local copies' folder: %s", self.uid, e)
            return
        self._prune(lambda n: n != checkpoint_id, unfinished=True)

    def _prune(self, doomed: Callable[[int], bool], unfinished: bool = False) -> None:
        """Delete the copies whose number is ``doomed``, removals cut short,
        and with ``unfinished`` copies whose making was cut short."""
        for name in listdir(self.folder):
            m = _CHK_RE.match(name)
            path = os.path.join(self.folder, name)
            if m is not None and doomed(int(m.group(1))):
                remove_folder(path)
            elif _GONE_RE.match(name) or unfinished and _NEW_RE.match(name):
                rmtree(path)

    # ---------------------------------------------------------- restore
    def find(self, checkpoint_id: int, state: IncrementalState) -> str:
        """The folder of the copy of checkpoint ``checkpoint_id`` whose files
        are those of ``state``, checked but for the checksums (see the
        module); :class:`CopyUnusable` otherwise."""
        try:
            private.check_owned(self.base)
        except private.UnsafeFolderError as e:
            raise CopyUnusable(str(e) if os.path.lexists(self.base)
                               else "none on this host") from None
        copy = self._copy_path(checkpoint_id)
        for folder in (self.job, self.folder, copy):
            _require_folder(folder)
        manifest = _read_manifest(copy)
        expected = {"format": FORMAT, "checkpoint": checkpoint_id, "job": self.job_id,
                    "operator": self.uid, "key_groups": list(self.key_groups),
                    "host": self.host}
        for key, value in expected.items():
            if manifest.get(key) != value:
                raise CopyUnusable(f"its manifest has {key} {manifest.get(key)!r:.80}, "
                                   f"not {value!r:.80}")
        if manifest.get("shared") != {local: ref.name for local, ref in state.shared.items()} \
                or manifest.get("changelog") != [ref.name for ref in state.changelog]:
            raise CopyUnusable("its manifest names other files than the checkpoint")
        _check_files(os.path.join(copy, "db"), dict(state.shared))
        _check_files(os.path.join(copy, "log"), {ref.name: ref for ref in state.changelog})
        return copy


def link_checked(source: str, target: str, ref: SharedFile, link: bool) -> None:
    """Make the new local file ``target`` hold the local copy's file
    ``source``, a regular file (never followed if a link) of ``ref``'s size
    and CRC-32: the checked file itself hard-linked (``link``, where the
    filesystem allows) or copied (:func:`lockgate.fs.checked.copy_checked`).
    :class:`CopyUnusable` naming the file and what is wrong if it is not."""
    name = os.path.basename(source)
    try:
        copy_checked(source, target, "local copy's file", size=ref.size, crc32=ref.crc32,
                     link=link, refuse=lambda problem: CopyUnusable(f"{name} {problem}"))
    except FileNotFoundError:
        raise CopyUnusable(f"{name} is missing") from None


def remove_job(directory: str, job_id: str) -> None:
    """The job is over: delete its local copies on this host under
    ``directory`` (only a folder Lockgate made and marked), and the base
    folder if it is left empty."""
    base = base_folder(directory)
    try:
        private.check_owned(base)
    except private.UnsafeFolderError:
        return  # none here (or not this user's: left alone)
    job = os.path.join(base, _job_name(job_id))
    if marked(job, JOB_MARK):
        remove_folder(job)
    with contextlib.suppress(OSError):
        os.rmdir(base)


# ------------------------------------------------------------ checks

def _require_folder(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise CopyUnusable("none on this host") from None
    if stat.S_ISLNK(mode):
        raise CopyUnusable(f"{os.path.basename(path)} is a symbolic link")
    if not stat.S_ISDIR(mode):
        raise CopyUnusable(f"{os.path.basename(path)} is not a folder")


def _read_manifest(copy: str) -> dict[str, object]:
    path = os.path.join(copy, MANIFEST)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise CopyUnusable("it has no manifest") from None
    except OSError as e:
        raise CopyUnusable(f"its manifest cannot be read: {os.strerror(e.errno or 0)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CopyUnusable("its manifest is not a regular file")
        data = os.read(fd, _MAX_MANIFEST + 1)
    finally:
        os.close(fd)
    try:
        manifest = json.loads(data) if len(data) <= _MAX_MANIFEST else None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise CopyUnusable("its manifest is damaged")
    return manifest


def _check_files(folder: str, expected: dict[str, SharedFile]) -> None:
    """``folder`` is a real folder holding exactly ``expected``'s names, each
    a regular file of its recorded size (checksums: :func:`link_checked`)."""
    _require_folder(folder)
    names = set(listdir(folder))
    missing = sorted(set(expected) - names)
    if missing:
        raise CopyUnusable(f"{missing[0]} is missing")
    extra = sorted(names - set(expected))
    if extra:
        raise CopyUnusable(f"it holds {extra[0]!r:.80}, a file the checkpoint does not name")
    for name, ref in expected.items():
        st = os.lstat(os.path.join(folder, name))
        if stat.S_ISLNK(st.st_mode):
            raise CopyUnusable(f"{name} is a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise CopyUnusable(f"{name} is not a regular file")
        if st.st_size != ref.size:
            raise CopyUnusable(f"{name} has {st.st_size} bytes, the checkpoint recorded "
                               f"{ref.size}")


# --------------------------------------------------- folders and marks

def _remove_stale_jobs(base: str, keep: str) -> None:
    """Job folders under ``base`` (marked) whose newest change is older than
    :data:`STALE_AGE`, and removals cut short."""
    now = time.time()
    for name in listdir(base):
        path = os.path.join(base, name)
        if _GONE_RE.match(name):
            rmtree(path)
        elif _MAKING_RE.match(name):
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > MAKING_AGE:
                    rmtree(path)
        elif name != keep and marked(path, JOB_MARK) and now - _newest(path) > STALE_AGE:
            remove_folder(path)


def _newest(job: str) -> float:
    """The newest modification time of a job folder and its operator folders."""
    times = [os.lstat(job).st_mtime]
    for name in listdir(job):
        with contextlib.suppress(OSError):
            times.append(os.lstat(os.path.join(job, name)).st_mtime)
    return max(times)

