"""Which keyed state backend a job uses, and what every backend offers.

``Pipeline(state_backend=...)`` takes ``"heap"`` (the default: dicts in the
task's memory), ``"rocksdb"`` or a :class:`RocksDBStateBackend` with its
options. The choice travels to every task in its ``TaskSpec``; a keyed
operator makes its backend with :func:`create_keyed_backend`.

:class:`KeyedStateBackend` is what operators, timers and TTL use of a
backend; the heap backend (:mod:`lockgate.state.backend`) and the RocksDB
backend (:mod:`lockgate.state.rocksdb.backend`) both have it, with the same state
handles (``ValueState``, ``ListState``, ``MapState``), so code written
against one runs on the other. Savepoints are the same on both (one block per
key group, :class:`~lockgate.state.backend.KeyedBlocks`): a savepoint of a
heap job restores on RocksDB and the reverse, at any parallelism.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, overload

from lockgate.state.backend import (
    Descriptor,
    KeyedBlocks,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from lockgate.state.choice import (
    BackendScope,
    HeapStateBackend,
    RocksDBStateBackend,
    StateBackend,
    state_backend,
)
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl_config import SnapshotFilter

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from lockgate.state.incremental import IncrementalState
    from lockgate.state.rocksdb.recovery import LocalRestore

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
    "close_backend",
]


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
    fault: Callable[[str], None]
    """Fault injection at the backend's own protocol points (the task sets
    it before the restore: a RocksDB changelog's ``materialize`` and
    ``changelog``, a RocksDB restore's ``restore_ranges``)."""
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

    def snapshot(self, savepoint: bool = False) -> KeyedSnapshot:
        """The synchronous part of a snapshot. ``savepoint``: a savepoint's,
        written canonically (a RocksDB changelog then takes a RocksDB
        checkpoint for it; the heap backend writes canonically anyway)."""
        ...

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


def close_backend(backend: KeyedStateBackend | None) -> None:
    """Release what a backend holds (RocksDB: the database and its folder)."""
    if backend is not None:
        backend.close()
