"""Checkpoint storage on a filesystem: state files, ``_metadata``, retention.

Layout (see docs/architecture.md)::

    <storage>/<job-id>/chk-<n>/_metadata        written last, atomically
    <storage>/<job-id>/chk-<n>/<uid>-<task>.state

A checkpoint folder without a valid ``_metadata`` does not exist.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from lockgate.errors import CheckpointCorruptError

METADATA = "_metadata"
FORMAT_VERSION = 1
_CHK_RE = re.compile(r"^chk-(\d+)$")


class ChecksumWriter:
    """A write-only file wrapper that counts bytes and computes CRC-32."""

    def __init__(self, raw: BinaryIO) -> None:
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


def checkpoint_dir(job_dir: str | Path, checkpoint_id: int) -> Path:
    return Path(job_dir) / f"chk-{checkpoint_id}"


def write_metadata(chk_dir: Path, metadata: dict[str, Any]) -> None:
    """Write ``_metadata`` atomically: temp file, fsync, rename, fsync the folder."""
    tmp = chk_dir / f".{METADATA}.tmp"
    data = json.dumps(metadata, sort_keys=True).encode()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, chk_dir / METADATA)
    fsync_dir(chk_dir)


def read_metadata(chk_dir: str | Path) -> dict[str, Any]:
    """Load and validate a checkpoint's ``_metadata``; clear errors otherwise."""
    chk = Path(chk_dir)
    if not chk.is_dir():
        raise CheckpointCorruptError(f"checkpoint folder {chk} does not exist")
    path = chk / METADATA
    if not path.exists():
        latest = latest_completed(chk.parent)
        hint = f"; the latest completed checkpoint there is {latest}" if latest else ""
        raise CheckpointCorruptError(
            f"{chk} has no {METADATA}: that checkpoint never completed, so it cannot be "
            f"restored{hint}"
        )
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(
            f"{path} is corrupt ({e}); restore from an earlier checkpoint instead"
        ) from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CheckpointCorruptError(
            f"{path} is not a Lockgate checkpoint of format {FORMAT_VERSION}"
        )
    for key in ("checkpoint_id", "operators", "max_parallelism"):
        if key not in meta:
            raise CheckpointCorruptError(f"{path} lacks the field {key!r}: it is corrupt")
    return meta


def verify_files(chk_dir: str | Path, metadata: dict[str, Any]) -> None:
    """Check that every state file named in the metadata exists with its size."""
    chk = Path(chk_dir)
    for uid, op in metadata["operators"].items():
        for handle in op["subtasks"]:
            if not handle:
                continue
            p = chk / handle["file"]
            if not p.exists():
                raise CheckpointCorruptError(
                    f"state file {p} of operator {uid!r} is missing: the checkpoint is damaged; "
                    "restore from an earlier checkpoint"
                )
            if p.stat().st_size != handle["size"]:
                raise CheckpointCorruptError(
                    f"state file {p} of operator {uid!r} has {p.stat().st_size} bytes, "
                    f"the checkpoint recorded {handle['size']}: it is truncated or damaged; "
                    "restore from an earlier checkpoint"
                )


def read_state_file(chk_dir: str | Path, handle: dict[str, Any]) -> bytes:
    """Read a whole state file, checking its size and CRC-32."""
    p = Path(chk_dir) / handle["file"]
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"state file {p} is missing: the checkpoint is damaged"
        ) from None
    if len(data) != handle["size"] or zlib.crc32(data) != handle["crc32"]:
        raise CheckpointCorruptError(
            f"state file {p} is truncated or damaged (size {len(data)}, expected "
            f"{handle['size']}; checksum mismatch); restore from an earlier checkpoint"
        )
    return data


def completed_checkpoints(job_dir: str | Path) -> list[int]:
    """Ids of the checkpoints under ``job_dir`` that have ``_metadata``, ascending."""
    d = Path(job_dir)
    if not d.is_dir():
        return []
    ids = []
    for entry in d.iterdir():
        m = _CHK_RE.match(entry.name)
        if m and (entry / METADATA).exists():
            ids.append(int(m.group(1)))
    return sorted(ids)


def latest_completed(job_dir: str | Path) -> Path | None:
    ids = completed_checkpoints(job_dir)
    return checkpoint_dir(job_dir, ids[-1]) if ids else None


def discard(chk_dir: str | Path) -> None:
    """Delete a checkpoint: ``_metadata`` first, so a half-deleted one never looks valid."""
    chk = Path(chk_dir)
    try:
        (chk / METADATA).unlink()
    except FileNotFoundError:
        pass
    shutil.rmtree(chk, ignore_errors=True)
