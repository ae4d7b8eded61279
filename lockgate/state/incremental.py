"""Incremental checkpoints: what a state handle says about them, and the
clean-up of shared files. Pure types and checks, plus one listing-driven
deletion (:func:`delete_unreferenced`).

An incremental snapshot (the RocksDB backend's) is a set of files: the SST
files, immutable and shared between checkpoints, uploaded once into
``<job>/shared/`` and referenced by every later checkpoint that still holds
them; and a few small private files (``CURRENT``, ``MANIFEST-*``,
``OPTIONS-*``), stored inside the task's state file of that checkpoint.
With a changelog (the default), those files are a *materialization* taken
now and then, and each checkpoint adds the *changelog*: one shared SST file
per checkpoint since the materialization with the entries written since the
previous one, applied in order on restore (:mod:`lockgate.state.rocksdb.changelog`).
:class:`IncrementalState` lists them all; it is read back from ``_metadata`` as
untrusted input: every name is a plain name in its folder, every size and
offset a count.

A shared file's name carries the id of the checkpoint that uploaded it
(``<uid>-<task>-c<n>-<random>.sst``), so the coordinator knows which files
may still be in flight (uploaded for a checkpoint newer than the latest
completed one) without any state of its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lockgate.errors import CheckpointCorruptError
from lockgate.untrusted import plain_name

log = logging.getLogger("lockgate.checkpoint")

SHARED_DIR = "shared"
"""The folder of shared files, inside the job's checkpoint folder."""

_SHARED_RE = re.compile(r"^[A-Za-z0-9_.\-]+-c(\d+)-[0-9a-f]{16}\.sst$")
_LOCAL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def shared_file_name(uid: str, task_index: int, checkpoint_id: int, token: str) -> str:
    """The name of a shared file uploaded for ``checkpoint_id`` (``token``:
    16 hex digits, unique)."""
    return f"{uid}-{task_index}-c{checkpoint_id}-{token}.sst"


def shared_checkpoint_id(name: str) -> int | None:
    """The checkpoint that uploaded the shared file ``name``; None if ``name``
    is not a shared file's."""
    m = _SHARED_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class SharedFile:
    """A file in ``<job>/shared/``, its size and the CRC-32 of its bytes
    (None in checkpoints written before it was recorded)."""

    name: str
    size: int
    crc32: int | None = None

    def to_json(self) -> list[Any]:
        return [self.name, self.size] if self.crc32 is None else [self.name, self.size,
                                                                   self.crc32]


@dataclass(frozen=True)
class IncrementalState:
    """The keyed state of one task in an incremental checkpoint.

    ``key_groups``: the ``[start, stop)`` range the writing task owned (the
    files hold nothing else that counts); ``private``: local file name ->
    ``(offset, length)`` of its bytes inside the state file; ``shared``:
    local file name -> the shared file that holds it; ``changelog``: the
    changes since those files were taken, oldest first (shared SST files,
    applied in order over them)."""

    backend: str
    key_groups: tuple[int, int]
    private: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    shared: Mapping[str, SharedFile] = field(default_factory=dict)
    changelog: tuple[SharedFile, ...] = ()

    @property
    def size(self) -> int:
        """Bytes of the state's files, shared ones and the changelog included."""
        return (sum(n for _, n in self.private.values())
                + sum(f.size for f in self.shared.values())
                + sum(f.size for f in self.changelog))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backend": self.backend,
            "key_groups": list(self.key_groups),
            "private": {n: [o, ln] for n, (o, ln) in self.private.items()},
            "shared": {n: f.to_json() for n, f in self.shared.items()},
        }
        if self.changelog:
            out["changelog"] = [f.to_json() for f in self.changelog]
        return out

    @classmethod
    def from_json(cls, data: object, what: str,
                  max_parallelism: int | None = None) -> IncrementalState:
        if not isinstance(data, dict):
            raise CheckpointCorruptError(f"{what}: incremental is not a mapping: it is corrupt")
        backend = data.get("backend")
        if backend != "rocksdb":
            raise CheckpointCorruptError(f"{what}: unknown incremental backend {backend!r:.40}")
        span = data.get("key_groups")
        if not (isinstance(span, list) and len(span) == 2
                and all(type(v) is int and v >= 0 for v in span) and span[0] <= span[1]
                and (max_parallelism is None or span[1] <= max_parallelism)):
            raise CheckpointCorruptError(f"{what}: key_groups {span!r:.40} is not a range "
                                         "of key groups: it is corrupt")
        private_raw, shared_raw = data.get("private"), data.get("shared")
        if not isinstance(private_raw, dict) or not isinstance(shared_raw, dict):
            raise CheckpointCorruptError(f"{what}: private or shared files are not mappings")
        private: dict[str, tuple[int, int]] = {}
        for name, pos in private_raw.items():
            private[_local(name, what)] = _pair(pos, f"{what}: private file {name!r:.40}")
        shared: dict[str, SharedFile] = {}
        for name, ref in shared_raw.items():
            local = _local(name, what)
            if not local.endswith(".sst"):
                raise CheckpointCorruptError(f"{what}: shared file {local!r} is no SST file")
            shared[local] = _shared_ref(ref, f"{what}: shared file {local!r}")
        if private.keys() & shared.keys():
            raise CheckpointCorruptError(f"{what}: a file is both private and shared")
        log_raw = data.get("changelog", [])
        if not isinstance(log_raw, list) or len(log_raw) > MAX_CHANGELOG:
            raise CheckpointCorruptError(f"{what}: changelog is not a list of at most "
                                         f"{MAX_CHANGELOG} files: it is corrupt")
        changelog = tuple(_shared_ref(ref, f"{what}: changelog file {i}")
                          for i, ref in enumerate(log_raw))
        return cls("rocksdb", (span[0], span[1]), private, shared, changelog)


MAX_CHANGELOG = 10_000
"""More changelog files than this in one handle: a crafted one."""


def _shared_ref(ref: object, what: str) -> SharedFile:
    if not (isinstance(ref, list) and len(ref) in (2, 3)):
        raise CheckpointCorruptError(f"{what} is {ref!r:.60}: it is corrupt")
    target = plain_name(ref[0], what)
    if shared_checkpoint_id(target) is None:
        raise CheckpointCorruptError(f"{what}: {target!r:.80} is not the name of a shared file")
    size = ref[1]
    if type(size) is not int or size < 0:
        raise CheckpointCorruptError(f"{what}: {target!r} has size {size!r:.40}: it is corrupt")
    crc = ref[2] if len(ref) == 3 else None
    if crc is not None and not (type(crc) is int and 0 <= crc < 1 << 32):
        raise CheckpointCorruptError(f"{what}: {target!r} has the checksum {crc!r:.40}, not a "
                                     "CRC-32: it is corrupt")
    return SharedFile(target, size, crc)


def _local(name: object, what: str) -> str:
    value = plain_name(name, f"{what}: a local file name")
    if not _LOCAL_RE.match(value):
        raise CheckpointCorruptError(f"{what}: {value!r:.60} is not a RocksDB file name")
    return value


def _pair(value: object, what: str) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2
            and all(type(v) is int and v >= 0 for v in value)):
        raise CheckpointCorruptError(f"{what} is {value!r:.40}, not [offset, length]: "
                                     "it is corrupt")
    return value[0], value[1]


def referenced_shared(states: Iterable[IncrementalState | None]) -> set[str]:
    """Names of the shared files ``states`` reference (changelogs included)."""
    return {f.name for s in states if s is not None
            for f in (*s.shared.values(), *s.changelog)}


def unreferenced(names: Iterable[str], referenced: set[str], latest: int) -> list[str]:
    """Which of the shared files ``names`` may be deleted: those no retained
    checkpoint references (``referenced``) that were uploaded for a checkpoint
    at or before ``latest`` (the newest completed one; a newer checkpoint may
    still be uploading). Other names are left alone. Pure."""
    out = []
    for name in names:
        n = shared_checkpoint_id(name)
        if n is not None and n <= latest and name not in referenced:
            out.append(name)
    return sorted(out)


def delete_unreferenced(job_dir: str, referenced: set[str], latest: int) -> list[str]:
    """Delete the shared files of ``job_dir`` that :func:`unreferenced` picks;
    returns their names. Driven by a listing and by the references of the
    retained ``_metadata`` files, never by a count kept in memory: a crash in
    the middle leaves files that the next call deletes, and never deletes a
    referenced one. Errors are logged (the next call tries again)."""
    from lockgate import fs  # I/O, kept out of the pure part's imports

    folder = fs.join(job_dir, SHARED_DIR)
    try:
        if not fs.exists(folder):
            return []
        names = [n for n, size in fs.list_sizes(folder).items() if size is not None]
    except (OSError, ValueError) as e:
        log.warning("cannot list %s to delete unreferenced shared files: %s",
                    fs.redact(folder), e)
        return []
    doomed = unreferenced(names, referenced, latest)
    for name in doomed:
        try:
            fs.remove(fs.join(folder, name))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("could not delete shared file %s: %s", name, e)
    return doomed
