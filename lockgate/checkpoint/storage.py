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
import os
import re
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate import fs
from lockgate.checkpoint.pending import CheckpointKind
from lockgate.errors import CheckpointCorruptError, ConfigurationError
from lockgate.fs_explain import explain
from lockgate.untrusted import plain_name

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

METADATA = "_metadata"
FORMAT_VERSION = 1
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


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_job_dir(storage: Location, job_id: str) -> str:
    """The job's checkpoint folder ``<storage>/<job_id>``, proven writable (a
    probe file is written and deleted): a wrong bucket, endpoint or permission
    fails the job before it starts, with the fix in the message."""
    job_dir = fs.join(fs.absolute(storage), job_id)
    probe = fs.join(job_dir, ".lockgate-probe-driver")
    try:
        fs.makedirs(job_dir)
        fs.write_atomic(probe, b"")
        fs.remove(probe)
    except (OSError, ValueError) as e:
        raise ConfigurationError(
            f"checkpoint storage {explain(e, job_dir)}"
        ) from e
    return job_dir


def checkpoint_dir(job_dir: Location, checkpoint_id: int) -> str:
    return fs.join(job_dir, f"chk-{checkpoint_id}")


def write_metadata(chk_dir: Location, metadata: dict[str, Any]) -> None:
    """Write ``_metadata`` atomically (see :func:`lockgate.fs.write_atomic`):
    temp file, fsync, rename, fsync the folder; one object write on S3."""
    fs.write_atomic(fs.join(chk_dir, METADATA), json.dumps(metadata, sort_keys=True).encode())


EARLIER = (
    "an earlier checkpoint of the job can be restored instead, but it is not exactly-once: "
    "its sinks write again what this one had already committed (duplicates in the "
    "output). To keep the output exact, restore it with new uids (or new folders) for the "
    "sinks and allow_non_restored_state=True (--allow-non-restored-state), and drop the old "
    "output after what the earlier checkpoint covers")
"""The advice for a damaged checkpoint: never a restore that silently breaks
exactly-once."""


def read_metadata(chk_dir: Location,
                  kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> dict[str, Any]:
    """Load and validate a checkpoint's (or savepoint's: ``kind``, for
    messages) ``_metadata``; clear errors otherwise."""
    chk = fs.absolute(chk_dir)
    shown = fs.redact(chk)
    path = fs.join(chk, METADATA)
    try:
        raw = fs.read_bytes(path)
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
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(
            f"{shown} is corrupt ({e}); {EARLIER}"
        ) from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CheckpointCorruptError(
            f"{shown} is not a Lockgate checkpoint of format {FORMAT_VERSION}"
        )
    for key in ("checkpoint_id", "operators", "max_parallelism"):
        if key not in meta:
            raise CheckpointCorruptError(f"{shown} lacks the field {key!r}: it is corrupt")
    _check_state_files(meta, shown)
    return meta


def _check_state_files(meta: dict[str, Any], shown: str) -> None:
    """Every state file ``_metadata`` names is a plain name inside its folder
    (untrusted input: see :mod:`lockgate.untrusted`), with integer sizes."""
    operators = meta["operators"]
    if not isinstance(operators, dict):
        raise CheckpointCorruptError(f"{shown}: 'operators' is not a mapping: it is corrupt")
    for uid, op in operators.items():
        subtasks = op.get("subtasks") if isinstance(op, dict) else None
        if not isinstance(subtasks, list):
            raise CheckpointCorruptError(
                f"{shown}: operator {uid!r} has no list of subtasks: it is corrupt")
        for i, handle in enumerate(subtasks):
            if handle is None:
                continue
            what = f"{shown}: the state file of operator {uid!r}, subtask {i},"
            if not isinstance(handle, dict):
                raise CheckpointCorruptError(f"{what} is described by {handle!r}: it is corrupt")
            plain_name(handle.get("file"), what)
            for field in ("size", "crc32"):
                if type(handle.get(field)) is not int or handle[field] < 0:
                    raise CheckpointCorruptError(
                        f"{what} has {field} {handle.get(field)!r}: it is corrupt")


def verify_files(chk_dir: Location, metadata: dict[str, Any]) -> None:
    """Check that every state file named in the metadata exists with its size
    (one listing of the folder)."""
    sizes = fs.list_sizes(chk_dir)
    for uid, op in metadata["operators"].items():
        for handle in op["subtasks"]:
            if not handle:
                continue
            p = fs.redact(fs.join(chk_dir, handle["file"]))
            size = sizes.get(handle["file"])
            if size is None:
                raise CheckpointCorruptError(
                    f"state file {p} of operator {uid!r} is missing: the checkpoint is damaged; "
                    f"{EARLIER}"
                )
            if size != handle["size"]:
                raise CheckpointCorruptError(
                    f"state file {p} of operator {uid!r} has {size} bytes, "
                    f"the checkpoint recorded {handle['size']}: it is truncated or damaged; "
                    f"{EARLIER}"
                )


def write_state_file(chk_dir: Location, name: str,
                     write: Callable[[ChecksumWriter], object]) -> tuple[int, int]:
    """Write the state file ``name`` durably: ``write(out)`` writes its bytes
    into a :class:`ChecksumWriter`; returns ``(size, crc32)``. Local: fsynced.
    Object store: one object, visible only once complete."""
    f = fs.open_write(fs.join(chk_dir, name))
    try:
        out = ChecksumWriter(f)
        write(out)
    except BaseException:
        f.close()
        raise
    fs.finish_write(f)
    return out.size, out.crc


def read_state_file(chk_dir: Location, handle: dict[str, Any]) -> bytes:
    """Read a whole state file, checking its size and CRC-32."""
    location = fs.join(chk_dir, handle["file"])
    p = fs.redact(location)
    try:
        data = fs.read_bytes(location)
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"state file {p} is missing: the checkpoint is damaged"
        ) from None
    if len(data) != handle["size"] or zlib.crc32(data) != handle["crc32"]:
        raise CheckpointCorruptError(
            f"state file {p} is truncated or damaged (size {len(data)}, expected "
            f"{handle['size']}; checksum mismatch); {EARLIER}"
        )
    return data


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


def write_savepoint(chk_dir: Location, savepoint_dir: Location, job_id: str,
                    checkpoint_id: int, metadata: dict[str, Any]) -> str:
    """Turn a fully acknowledged checkpoint's files into a savepoint folder.

    Step 1. Make ``<savepoint_dir>/savepoint-<job>-<n>`` (it must not exist).
    Step 2. Move every state file there (a rename on a local filesystem).
    Step 3. Write ``_metadata`` there, atomically: now the savepoint exists.
    Step 4. Remove the checkpoint folder the tasks wrote into.

    The result is self-contained and relocatable: ``_metadata`` names files
    relative to its folder, and holds no task, host or process identity.
    Lockgate never deletes it.
    """
    target = fs.join(savepoint_dir, savepoint_name(job_id, checkpoint_id))
    # Step 1.
    if fs.exists(target):
        raise FileExistsError(f"{fs.redact(target)} already exists")
    fs.makedirs(target)
    # Step 2.
    for op in metadata["operators"].values():
        for handle in op["subtasks"]:
            if handle:
                fs.move(fs.join(chk_dir, handle["file"]), fs.join(target, handle["file"]))
    # Step 3.
    write_metadata(target, metadata)
    # Step 4.
    fs.rmtree(chk_dir)
    return target
