"""Which keyed state backend a job uses, and what every backend offers.

``Pipeline(state_backend=...)`` takes ``"heap"`` (the default: dicts in the
task's memory), ``"rocksdb"`` or a :class:`RocksDBStateBackend` with its
options. The choice travels to every task in its ``TaskSpec``; a keyed
operator makes its backend with :func:`create_keyed_backend`.

:class:`KeyedStateBackend` is what operators, timers and TTL use of a
backend; the heap backend (:mod:`lockgate.state.backend`) and the RocksDB
backend (:mod:`lockgate.state.rocksdb`) both have it, with the same state
handles (``ValueState``, ``ListState``, ``MapState``), so code written
against one runs on the other. Savepoints are the same on both (one block per
key group, :class:`~lockgate.state.backend.KeyedBlocks`): a savepoint of a
heap job restores on RocksDB and the reverse, at any parallelism.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, overload

from lockgate.errors import PipelineDefinitionError
from lockgate.state.backend import (
    Descriptor,
    HeapKeyedStateBackend,
    KeyedBlocks,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl_config import SnapshotFilter

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from lockgate.state.incremental import IncrementalState
    from lockgate.state.rocksdb_recovery import LocalRestore

__all__ = [
    "HeapStateBackend",
    "RocksDBStateBackend",
    "StateBackend",
    "BackendScope",
    "KeyedStateBackend",
    "KeyedSnapshot",
    "IncrementalSnapshot",
    "StateFileWriter",
    "state_backend",
    "create_keyed_backend",
    "close_backend",
    "remove_local_copies",
]


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
            nothing it did not make (:mod:`lockgate.state.rocksdb_local`).
            Working files only: what survives a failure is in the checkpoint
            storage.
        memory_mb: the memory budget of one keyed operator in one task:
            RocksDB's block cache gets half of it, its write buffers (memtables)
            a quarter, index and filter blocks live in the cache.
        incremental: checkpoints upload only the files that are new since the
            previous one (savepoints are always full and canonical).
        early_flush: flush the memtable in the background shortly before a
            checkpoint is expected, so that the checkpoint's synchronous part
            flushes only the last writes (:mod:`lockgate.state.rocksdb_flush`;
            without a changelog).
        changelog: an incremental checkpoint uploads the entries written
            since the previous one (one sorted SST file), and RocksDB's own
            files only at a *materialization* now and then, taken between
            records; the synchronous part takes no RocksDB checkpoint
            (:mod:`lockgate.state.rocksdb_changelog`). False: every
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
            (:mod:`lockgate.state.rocksdb_recovery`). Costs disk: files that
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


class StateFileWriter(Protocol):
    """A state file being written (``checkpoint.storage.ChecksumWriter``)."""

    def write(self, data: bytes) -> int: ...

    def tell(self) -> int:
        """The bytes written so far: where the next write lands."""
        ...


class KeyedSnapshot(Protocol):
    """The synchronous part of a keyed snapshot; ``write`` (on the snapshot
    thread) writes it in the canonical format: one block per key group."""

    def write(self, out: SupportsWrite[bytes]) -> KeyedBlocks: ...

    def discard(self) -> None:
        """It will never be written (its checkpoint was aborted after the
        synchronous part, or failed before this state): hand back what it
        holds, on the snapshot thread. Nothing once written; the heap
        backend's holds nothing to hand back."""
        ...


class IncrementalSnapshot(ABC):
    """A snapshot that can also be written incrementally (checkpoints, not
    savepoints): new files uploaded, the others referenced. A base class, not
    a protocol: the RocksDB backend's snapshots that can say so, and a
    method renamed there fails loudly instead of turning the format off."""

    kinds: dict[str, str]
    """The kind of each state (a state file's handle records them)."""

    @abstractmethod
    def write(self, out: SupportsWrite[bytes]) -> KeyedBlocks:
        """Canonically: one block per key group (a savepoint)."""

    @abstractmethod
    def discard(self) -> None:
        """As :meth:`KeyedSnapshot.discard`."""

    @abstractmethod
    def write_incremental(self, out: StateFileWriter, checkpoint_id: int) -> IncrementalState:
        """Incrementally, into the state file ``out``; the handle names the
        files it references."""


class KeyedStateBackend(Protocol):
    """What operators, timers, TTL and the task use of a keyed state backend.

    Every capability is here, so the type checker sees each use; where the
    heap backend has nothing to do, its method says so and does nothing."""

    max_parallelism: int
    key_group_range: range
    serializer: StateSerializer
    current_key: Any
    savepoint_next: bool
    """The next snapshot is a savepoint's (the task sets it before every
    snapshot): a RocksDB changelog then takes a RocksDB checkpoint for the
    canonical write; the heap backend writes canonically anyway."""
    fault: Callable[[str], None]
    """Fault injection at the backend's own protocol points (the task sets
    it: a RocksDB changelog's ``materialize`` and ``changelog``)."""
    prepares_snapshots: bool
    """:meth:`prepare_snapshot` has work to do between records (RocksDB:
    the early flush, the materialization); the heap backend's has none."""

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...
    def get_state(self, descriptor: Descriptor) -> ValueState | ListState | MapState: ...

    def raw(self, name: str) -> Any:
        """A registered state as a mapping key -> stored object (built-in
        operators' fast path; on RocksDB a view that writes changes back)."""
        ...

    def state_kinds(self) -> dict[str, str]: ...

    def state_keys(self, name: str) -> list[Any]: ...

    def iter_state_keys(self, name: str) -> Iterator[Any]:
        """The keys of state ``name``, safe to iterate while state changes
        (TTL's incremental cleanup; RocksDB reads them lazily, a chunk at a
        time)."""
        ...

    def filter_keys(self, name: str, keys: list[Any], keep: SnapshotFilter) -> None:
        """Replace the stored object ``o`` of each of ``keys`` in state
        ``name`` by ``keep(o)`` (the same object: no change; None: the key
        deleted), without copying or holding what it reads (TTL's
        incremental cleanup)."""
        ...

    def num_keys(self) -> int: ...

    def approximate_keys(self) -> int:
        """A cheap estimate of the keys, safe from another thread (metrics)."""
        ...

    def expect_checkpoints(self, interval: float | None) -> None:
        """Checkpoints come every ``interval`` seconds (None: not
        periodically), counted from now: the task starts running."""
        ...

    def prepare_snapshot(self, now: float) -> float:
        """Get ready for the next checkpoint between records (``now``:
        ``time.monotonic()``); returns the seconds until it wants to be
        asked again (``inf``: not before the next snapshot)."""
        ...

    def snapshot(self) -> KeyedSnapshot: ...

    def restore_block(self, data: bytes, states: dict[str, str]) -> None: ...

    def restore_incremental(self, restore_dir: str, parts: list[tuple[IncrementalState, bytes]],
                            states: dict[str, str], checkpoint_id: int | None = None
                            ) -> LocalRestore | None:
        """Restore the task's key groups from incremental state handles
        (RocksDB checkpoints: each with its state file's bytes; ``states``:
        the kinds of the states, as the handles record them) of checkpoint
        ``checkpoint_id``; returns what the backend did about its local copy
        (local recovery; None: it looked for none)."""
        ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (RocksDB: older local copies
        for local recovery go; the heap backend keeps nothing)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (RocksDB: the database and its
        folder); the heap backend holds nothing outside memory."""
        ...


def create_keyed_backend(config: StateBackend | None, max_parallelism: int,
                         key_group_range: range, serializer: StateSerializer,
                         scope: BackendScope | None = None) -> KeyedStateBackend:
    """The keyed state backend of one keyed operator in one task."""
    if config is None or isinstance(config, HeapStateBackend):
        return HeapKeyedStateBackend(max_parallelism, key_group_range, serializer)
    from lockgate.state.rocksdb import RocksDBKeyedStateBackend

    if scope is None:
        raise ValueError("the RocksDB backend needs its scope")
    return RocksDBKeyedStateBackend(config, max_parallelism, key_group_range, serializer,
                                    scope)


def remove_local_copies(config: StateBackend | None, job_id: str) -> None:
    """The job ended: delete its RocksDB backend's local copies on this
    machine (local recovery, :func:`lockgate.state.rocksdb_recovery.remove_job`)."""
    if isinstance(config, RocksDBStateBackend) and config.local_recovery:
        from lockgate.state.rocksdb_recovery import remove_job

        remove_job(config.directory, job_id)


def close_backend(backend: KeyedStateBackend | None) -> None:
    """Release what a backend holds (RocksDB: the database and its folder)."""
    if backend is not None:
        backend.close()
