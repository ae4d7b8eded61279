"""The keyed state backend a pipeline chooses, as data: :class:`HeapStateBackend`
or :class:`RocksDBStateBackend` with its options, and :class:`BackendScope`,
whose state a backend holds. Public as :mod:`lockgate.state.backends`
(``from lockgate.state.backends import RocksDBStateBackend``); here, below
both backends, so that each reads its options without importing the other."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from lockgate.errors import PipelineDefinitionError

__all__ = ["HeapStateBackend", "RocksDBStateBackend", "StateBackend", "BackendScope",
           "state_backend"]


@dataclass(frozen=True)
class HeapStateBackend:
    """Keyed state in Python dicts in the task's memory (the default): the
    fastest, bounded by memory; every checkpoint writes all of it."""

    name: ClassVar[str] = "heap"


@dataclass(frozen=True)
class RocksDBStateBackend:
    """Keyed state in an embedded RocksDB per keyed operator and task, on
    local disk: state larger than memory, and incremental checkpoints.

    Args:
        local_dir: where the tasks keep their databases (a local folder on
            every machine that runs tasks; default: the system's temp folder).
            Lockgate keeps them in its own folder there,
            ``lockgate-rocksdb-<uid>`` (0700, this user's), and deletes
            nothing it did not make (:mod:`lockgate.state.rocksdb.local`).
            Working files only: what survives a failure is in the checkpoint
            storage.
        memory_mb: the memory budget of one keyed operator in one task:
            RocksDB's block cache gets half of it, its write buffers (memtables)
            a quarter, index and filter blocks live in the cache.
        incremental: checkpoints upload only the files that are new since the
            previous one (savepoints are always full and canonical).
        early_flush: flush the memtable in the background shortly before a
            checkpoint is expected, so that the checkpoint's synchronous part
            flushes only the last writes (:mod:`lockgate.state.rocksdb.flush`;
            without a changelog).
        changelog: an incremental checkpoint uploads the entries written
            since the previous one (one sorted SST file), and RocksDB's own
            files only at a *materialization* now and then, taken between
            records; the synchronous part takes no RocksDB checkpoint
            (:mod:`lockgate.state.rocksdb.changelog`). False: every
            checkpoint is a RocksDB checkpoint whose new SST files (flushes
            and compactions) are uploaded.
        materialize_ratio: with a changelog, materialize once the changelog
            since the last materialization holds this many times its size
            (lower: fewer files to apply on restore, more bytes uploaded).
        max_changelog: with a changelog, materialize at the latest after this
            many checkpoints.
        local_recovery: with incremental checkpoints, each task keeps its last
            completed checkpoint's files in ``local_dir`` too (hard links of
            what it uploaded, no second write), and a restart on the same host
            at the same parallelism restores from them, checked against the
            checkpoint, instead of reading the checkpoint storage
            (:mod:`lockgate.state.rocksdb.recovery`). Costs disk: files that
            RocksDB compacted away since stay until the next checkpoint
            completes (at most about the state's size). False: every
            restore reads the checkpoint storage.
    """

    local_dir: str | None = None
    memory_mb: int = 256
    incremental: bool = True
    early_flush: bool = True
    changelog: bool = True
    materialize_ratio: float = 0.5
    max_changelog: int = 300
    local_recovery: bool = True
    name: ClassVar[str] = "rocksdb"

    def __post_init__(self) -> None:
        if type(self.memory_mb) is not int or self.memory_mb < 16:
            raise PipelineDefinitionError(
                f"RocksDBStateBackend(memory_mb={self.memory_mb!r}): give at least 16 (MiB)")
        if not (isinstance(self.materialize_ratio, int | float) and self.materialize_ratio > 0):
            raise PipelineDefinitionError(
                f"RocksDBStateBackend(materialize_ratio={self.materialize_ratio!r}): "
                "give a number above 0 (1.0: the changelog as big as the state)")
        if type(self.max_changelog) is not int or not 1 <= self.max_changelog <= 1000:
            raise PipelineDefinitionError(
                f"RocksDBStateBackend(max_changelog={self.max_changelog!r}): "
                "give a count of checkpoints from 1 to 1000")
        if type(self.local_recovery) is not bool:
            raise PipelineDefinitionError(
                f"RocksDBStateBackend(local_recovery={self.local_recovery!r}): give True or False")
        if self.local_dir is not None:
            object.__setattr__(self, "local_dir", os.path.abspath(self.local_dir))

    @property
    def keeps_local_copies(self) -> bool:
        """Whether tasks keep local copies of their checkpoints (local
        recovery works with incremental checkpoints only)."""
        return self.incremental and self.local_recovery

    @property
    def directory(self) -> str:
        import tempfile

        return self.local_dir or tempfile.gettempdir()


StateBackend = HeapStateBackend | RocksDBStateBackend


def state_backend(value: str | StateBackend | None) -> StateBackend:
    """The backend ``Pipeline(state_backend=value)`` means; ``None``: the
    environment's ``LOCKGATE_STATE_BACKEND`` (``heap`` or ``rocksdb``, read
    by the driver), else heap."""
    if value is None:
        value = os.environ.get("LOCKGATE_STATE_BACKEND") or "heap"
    if value == "heap":
        return HeapStateBackend()
    if value == "rocksdb":
        return RocksDBStateBackend()
    if isinstance(value, HeapStateBackend | RocksDBStateBackend):
        return value
    raise PipelineDefinitionError(
        f"state_backend={value!r:.60}: use 'heap', 'rocksdb' or RocksDBStateBackend(...)")


@dataclass(frozen=True)
class BackendScope:
    """Whose backend this is: names its local folder and its shared files."""

    job_id: str
    uid: str
    task_index: int
    attempt: int
    job_dir: str
    """The job's checkpoint folder (shared files go to ``<job_dir>/shared``)."""
