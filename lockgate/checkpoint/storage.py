"""Checkpoint storage on a filesystem: state files, ``_metadata``, retention.

Layout (see docs/architecture.md)::

    <storage>/<job-id>/chk-<n>/_metadata        written last, atomically
    <storage>/<job-id>/chk-<n>/<uid>-<task>.state

A checkpoint folder without a valid ``_metadata`` does not exist.

``<storage>`` is a local path or a URL (``file://``, ``s3://``, ``hdfs://``;
see :mod:`lockgate.fs`); locations are strings, so they travel to the tasks
inside their pickled specs. ``_metadata`` is atomic everywhere: a temp file
renamed (local, HDFS), or ONE object write on an object store (an object is
visible only complete; there is no rename to use).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import zlib
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING

from lockgate import fs
from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.checkpoint.metadata import CheckpointMetadata, StateHandle
from lockgate.errors import CheckpointCorruptError, ConfigurationError
from lockgate.fs import transfer as fs_transfer
from lockgate.fs.checked import read_checked, refuse_unless_regular
from lockgate.fs.explain import explain

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

log = logging.getLogger("lockgate.checkpoint")

METADATA = "_metadata"
_CHK_RE = re.compile(r"^chk-(\d+)$")

Location = str | os.PathLike[str]


class ChecksumWriter:
    """A write-only file wrapper that counts bytes and computes CRC-32."""

    def __init__(self, raw: SupportsWrite[bytes]) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def prepare_job_dir(storage: Location, job_id: str) -> str:
    """The job's checkpoint folder ``<storage>/<job_id>``, proven writable (a
    probe file is written and deleted): a wrong bucket, endpoint or permission
    fails the job before it starts, with the fix in the message."""
    job_dir = fs.join(fs.absolute(storage), job_id)
    probe = fs.join(job_dir, ".lockgate-probe-driver")
    try:
        fs.makedirs(job_dir, private=True)
        fs.sync_dir(fs.parent(job_dir))  # the job folder's entry, once per run
        fs.write_atomic(probe, b"", private=True)
        fs.remove(probe)
    except (OSError, ValueError) as e:
        raise ConfigurationError(
            f"checkpoint storage {explain(e, job_dir)}"
        ) from e
    return job_dir


def checkpoint_dir(job_dir: Location, checkpoint_id: int) -> str:
    return fs.join(job_dir, f"chk-{checkpoint_id}")


COMMITTED = "_committed"
"""Beside a savepoint's ``_metadata``: the job that took it (a stop, a drain)
ended after its sinks committed every transaction it names."""


def mark_committed(savepoint: Location, checkpoint_id: int) -> None:
    """Say in ``savepoint`` that its sinks committed everything it names."""
    fs.write_atomic(fs.join(savepoint, COMMITTED),
                    json.dumps({"checkpoint_id": checkpoint_id}).encode(), private=True)


def committed_marker(savepoint: Location) -> int | None:
    """The checkpoint id of ``savepoint``'s :data:`COMMITTED` marker, or None
    (none, or not one Lockgate wrote: read back, so untrusted)."""
    try:
        raw = read_checked(fs.join(savepoint, COMMITTED), "commit marker", limit=1024)
    except (OSError, CheckpointCorruptError):
        return None
    try:
        value = json.loads(raw[:1024]).get("checkpoint_id")
    except (ValueError, AttributeError):
        return None
    return value if type(value) is int else None


def write_metadata(chk_dir: Location, metadata: CheckpointMetadata) -> None:
    """Write ``_metadata`` atomically (see :func:`lockgate.fs.write_atomic`):
    temp file, fsync, rename, fsync the folder; one object write on S3. Then
    the job's folder is fsynced too: the ``chk-<n>`` folder was made by the
    first task that wrote into it, and without its own entry made durable a
    power loss could take the completed checkpoint away after its sinks
    committed."""
    fs.write_atomic(fs.join(chk_dir, METADATA),
                    json.dumps(metadata.to_json(), sort_keys=True).encode(), private=True)
    fs.sync_dir(fs.parent(chk_dir))


EARLIER = (
    "an earlier checkpoint of the job can be restored instead, but it is not exactly-once: "
    "its sinks write again what this one had already committed (duplicates in the "
    "output). To keep the output exact, restore it with new uids (or new folders) for the "
    "sinks and allow_non_restored_state=True (--allow-non-restored-state), and drop the old "
    "output after what the earlier checkpoint covers")
"""The advice for a damaged checkpoint: never a restore that silently breaks
exactly-once."""


def read_metadata(chk_dir: Location,
                  kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CheckpointMetadata:
    """Load and validate a checkpoint's (or savepoint's: ``kind``, for
    messages) ``_metadata``; clear errors otherwise."""
    chk = fs.absolute(chk_dir)
    shown = fs.redact(chk)
    path = fs.join(chk, METADATA)
    try:
        raw = read_checked(path, "checkpoint metadata")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        if not fs.is_dir(chk):
            raise CheckpointCorruptError(f"{kind} folder {shown} does not exist") from None
        inside = latest_completed(chk)
        if inside is not None or checkpoint_folders(chk):
            hint = (f", e.g. its latest completed one, {fs.redact(inside)}" if inside
                    else "; none of them completed")
            raise CheckpointCorruptError(
                f"{shown} is a job's checkpoint folder, not a {kind}: give one of its "
                f"checkpoints (chk-N){hint}") from None
        latest = latest_completed(fs.parent(chk))
        hint = (f"; the latest completed checkpoint there is {fs.redact(latest)}"
                if latest else "")
        raise CheckpointCorruptError(
            f"{shown} has no {METADATA}: that {kind} never completed, so it cannot be "
            f"restored{hint}"
        ) from None
    except (OSError, ValueError) as e:
        raise ConfigurationError(f"cannot read checkpoint {explain(e, chk)}") from e
    shown = fs.redact(path)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(
            f"{shown} is corrupt ({e}); {EARLIER}"
        ) from e
    return CheckpointMetadata.from_json(data, shown)


def verify_files(chk_dir: Location, files: Iterable[tuple[str, StateHandle]]) -> None:
    """Check that every state file (``(operator uid, handle)``, e.g. a
    checkpoint's ``state_files()``) exists with its size (one listing of the
    folder), and is a regular file (no link, pipe or device)."""
    sizes = fs.list_sizes(chk_dir)
    for uid, handle in files:
        if handle.inline is not None:  # in _metadata: no file
            continue
        p = fs.redact(fs.join(chk_dir, handle.file))
        size = sizes.get(handle.file)
        if handle.file in sizes:
            refuse_unless_regular(fs.join(chk_dir, handle.file), "state file")
        if size is None:
            raise CheckpointCorruptError(
                f"state file {p} of operator {uid!r} is missing: the checkpoint is damaged; "
                f"{EARLIER}"
            )
        if size != handle.size:
            raise CheckpointCorruptError(
                f"state file {p} of operator {uid!r} has {size} bytes, "
                f"the checkpoint recorded {handle.size}: it is truncated or damaged; "
                f"{EARLIER}"
            )


def write_state_file(chk_dir: Location, name: str,
                     write: Callable[[ChecksumWriter], object]) -> tuple[int, int]:
    """Write the state file ``name`` durably: ``write(out)`` writes its bytes
    into a :class:`ChecksumWriter`; returns ``(size, crc32)``. Local:
    fsynced. Object store: one object, visible only once complete."""
    size, crc, _ = write_state(chk_dir, name, write, 0)
    return size, crc


def write_state(chk_dir: Location, name: str, write: Callable[[ChecksumWriter], object],
                inline_limit: int) -> tuple[int, int, bytes | None]:
    """:func:`write_state_file`, but state of at most ``inline_limit`` bytes
    is not written at all: it is returned as the third item, for
    ``_metadata`` to keep (Flink's memory threshold; no file, no fsync). The
    bytes are buffered up to the limit, the file made only once they pass it."""
    spill = _Spill(fs.join(chk_dir, name), inline_limit)
    try:
        out = ChecksumWriter(spill)
        write(out)
    except BaseException:
        spill.close()
        raise
    return out.size, out.crc, spill.finish()


class _Spill:
    """Bytes kept in memory up to a limit, then in a new file (durable at
    :meth:`finish`)."""

    def __init__(self, location: str, limit: int) -> None:
        self.location = location
        self.limit = limit
        self.buffer: bytearray | None = bytearray() if limit > 0 else None
        self.file: IO[bytes] | None = None if limit > 0 else fs.open_write(location,
                                                                           private=True)

    def write(self, data: bytes) -> int:
        if self.buffer is not None:
            if len(self.buffer) + len(data) <= self.limit:
                self.buffer += data
                return len(data)
            self.file = fs.open_write(self.location, private=True)
            self.file.write(self.buffer)
            self.buffer = None
        assert self.file is not None
        return self.file.write(data)

    def finish(self) -> bytes | None:
        """The bytes if they stayed within the limit; else None, the file durable."""
        if self.buffer is not None:
            return bytes(self.buffer)
        assert self.file is not None
        fs.finish_write(self.file)
        return None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def read_state_file(chk_dir: Location, handle: StateHandle) -> bytes:
    """Read a whole state file (or its bytes kept inline), checking its size
    and CRC-32."""
    if handle.inline is not None:
        if len(handle.inline) != handle.size or zlib.crc32(handle.inline) != handle.crc32:
            raise CheckpointCorruptError(
                f"the inline state {handle.file} does not have its recorded size and CRC-32: "
                "the checkpoint is damaged")
        return handle.inline
    location = fs.join(chk_dir, handle.file)
    p = fs.redact(location)
    try:
        return read_checked(location, "state file", size=handle.size, crc32=handle.crc32)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(
            f"state file {p} is missing: the checkpoint is damaged"
        ) from None


def checkpoint_folders(job_dir: Location) -> dict[int, bool]:
    """Every ``chk-<n>`` folder under ``job_dir``: ``n`` -> whether it has
    ``_metadata`` (completed). One recursive listing on an object store."""
    out: dict[int, bool] = {}
    if fs.is_local(job_dir):
        for name in fs.listdir(job_dir):
            m = _CHK_RE.match(name)
            if m:
                out[int(m.group(1))] = fs.exists(fs.join(job_dir, name, METADATA))
        return out
    for rel in fs.walk_files(job_dir):
        folder, _, name = rel.partition("/")
        m = _CHK_RE.match(folder)
        if m:
            n = int(m.group(1))
            out[n] = out.get(n, False) or name == METADATA
    return out


def completed_checkpoints(job_dir: Location) -> list[int]:
    """Ids of the checkpoints under ``job_dir`` that have ``_metadata``, ascending."""
    return sorted(n for n, done in checkpoint_folders(job_dir).items() if done)


def latest_completed(job_dir: Location) -> str | None:
    ids = completed_checkpoints(job_dir)
    return checkpoint_dir(job_dir, ids[-1]) if ids else None


def discard(chk_dir: Location) -> None:
    """Delete a checkpoint: ``_metadata`` first, so a half-deleted one never looks valid."""
    fs.remove(fs.join(chk_dir, METADATA))
    fs.rmtree(chk_dir)


def savepoint_name(job_id: str, checkpoint_id: int) -> str:
    return f"savepoint-{job_id}-{checkpoint_id}"


def savepoint_target_problem(target: Location, job_dir: Location) -> str | None:
    """Why a savepoint must not go into the folder ``target`` (None: it may),
    for a job whose checkpoint folder is ``job_dir``; the answer says what to
    do instead. Refused: a file (or a folder that cannot be made, because a
    file is in its way); a folder inside ``job_dir`` (checkpoints there come
    and go); a folder inside another job's checkpoint folder (one with
    ``chk-N`` folders) or inside a checkpoint or savepoint (one with
    ``_metadata``), where Lockgate or a user cleaning up would take it for
    part of that. One listing per folder from ``target`` up to its root."""
    target, job_dir = fs.absolute(target), fs.absolute(job_dir)
    shown = fs.redact(target)
    fix = ("give another folder, e.g. one beside the checkpoint folders: "
           f"{fs.redact(fs.join(fs.parent(job_dir), 'savepoints'))}")
    try:
        if _within(target, job_dir):
            return (f"the savepoint folder {shown} is inside this job's checkpoint folder "
                    f"{fs.redact(job_dir)}, whose checkpoints are deleted as newer ones "
                    f"complete: {fix}")
        for i, level in enumerate(_ancestors(target)):
            is_ = f"is inside {fs.redact(level)}," if i else "is"
            if fs.is_file(level):
                return (f"the savepoint folder {shown} cannot be made: {fs.redact(level)} is a "
                        f"file: {fix}" if i else f"the savepoint folder {shown} is a file: {fix}")
            names = fs.list_sizes(level)
            if METADATA in names:
                return (f"the savepoint folder {shown} {is_} a checkpoint or savepoint (it has "
                        f"{METADATA}): {fix}")
            chk = sorted(n for n, size in names.items() if size is None and _CHK_RE.match(n))
            if chk:
                return (f"the savepoint folder {shown} {is_} another job's checkpoint folder "
                        f"(it holds {chk[0]}): {fix}")
    except (OSError, ValueError) as e:
        return f"the savepoint folder cannot be used: {explain(e, target)}"
    return None


def _within(location: Location, folder: Location) -> bool:
    """Whether ``location`` is ``folder`` or inside it (symbolic links resolved)."""
    loc, top = fs.local_path(location), fs.local_path(folder)
    if loc is not None and top is not None:
        loc, top = os.path.realpath(loc), os.path.realpath(top)
        return os.path.commonpath([loc, top]) == top
    if loc is not None or top is not None:
        return False
    (lfs, lp), (tfs, tp) = fs.resolve(location), fs.resolve(folder)
    return lfs is tfs and (lp == tp or lp.startswith(tp.rstrip("/") + "/"))


def _ancestors(location: Location) -> list[str]:
    """``location`` and every folder above it, up to its root."""
    out = [os.fspath(location)]
    path = fs.local_path(location)
    if path is not None:
        out = [os.path.realpath(path)]
    while True:
        up = (os.path.dirname(out[-1]) if path is not None else fs.parent(out[-1]))
        if up == out[-1] or not up:
            return out
        out.append(up)


def write_savepoint(chk_dir: Location, savepoint_dir: Location, job_id: str,
                    checkpoint_id: int, metadata: CheckpointMetadata) -> str:
    """Turn a fully acknowledged checkpoint's files into the savepoint folder
    ``<savepoint_dir>/savepoint-<job>-<n>``, on any filesystem the storage
    layer reaches (the checkpoint storage's, another device, another scheme or
    bucket), so that a reader never sees it with ``_metadata`` but without
    all of its files.

    Step 1. Make a hidden folder beside it, ``.savepoint-<job>-<n>.inprogress-<random>``
            (object store: the savepoint's own prefix; there a prefix is no
            folder, and only ``_metadata`` makes a savepoint exist).
    Step 2. Move every state file there: a rename where one filesystem holds
            both, else a streamed copy; then check every size (one listing).
    Step 3. Write ``_metadata`` there, last.
    Step 4. Rename the folder to its name (local, HDFS: atomic): now the
            savepoint exists (object store: since Step 3).
    Step 5. Remove the checkpoint folder the tasks wrote into.

    On any failure what was written is removed (no empty or partial folder is
    left) and an ``OSError`` names the target and the likely fix.

    The result is self-contained and relocatable: ``_metadata`` names files
    relative to its folder, and holds no task, host or process identity.
    Lockgate never deletes it.
    """
    name = savepoint_name(job_id, checkpoint_id)
    target = fs.join(savepoint_dir, name)
    made_dir = not fs.exists(savepoint_dir)
    in_place = fs.is_object_store(target)
    staging = target if in_place else fs.join(
        savepoint_dir, f".{name}.inprogress-{secrets.token_hex(4)}")
    try:
        if fs.exists(target):
            raise FileExistsError(f"{fs.redact(target)} already exists")
        # Step 1.
        fs.makedirs(staging, private=True)
        # Step 2.
        files = {h.file: h.size for _, h in metadata.state_files() if h.inline is None}
        for file in files:
            fs_transfer.move_or_copy(fs.join(chk_dir, file), fs.join(staging, file),
                                     private=True)
        _check_sizes(staging, files)
        # Step 3.
        write_metadata(staging, metadata)
        # Step 4.
        if not in_place:
            fs_transfer.rename_dir(staging, target)
    except (OSError, ValueError) as e:
        _remove_written(staging, savepoint_dir if made_dir else None, chk_dir)
        raise OSError(f"cannot write into {explain(e, savepoint_dir)}") from e
    except BaseException:
        _remove_written(staging, savepoint_dir if made_dir else None, chk_dir)
        raise
    # Step 5.
    fs.rmtree(chk_dir)
    return target


def _check_sizes(folder: Location, sizes: dict[str, int]) -> None:
    """Every file of ``sizes`` is in ``folder`` with its size (one listing)."""
    found = fs.list_sizes(folder)
    for file, size in sizes.items():
        if found.get(file) != size:
            raise OSError(f"{fs.redact(fs.join(folder, file))} has {found.get(file)} bytes "
                          f"after its copy, the checkpoint recorded {size}")


def _remove_written(staging: Location, made_dir: Location | None, chk_dir: Location) -> None:
    """After a failed savepoint: its unfinished folder, the savepoint folder
    if it was made for it and is empty, and the checkpoint's files (no
    checkpoint or savepoint names them). Errors are logged, never raised."""
    for what in (staging, chk_dir):
        try:
            fs.rmtree(what)
        except (OSError, ValueError) as e:
            log.warning("could not remove %s after a failed savepoint: %s", fs.redact(what), e)
    if fs.exists(staging):
        log.warning("could not remove %s after a failed savepoint", fs.redact(staging))
    try:
        if made_dir is not None and not fs.listdir(made_dir):
            fs.rmtree(made_dir)
    except (OSError, ValueError):
        pass
