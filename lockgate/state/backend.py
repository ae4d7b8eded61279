"""In-memory keyed state, snapshotted per key group.

Each state name has one dict ``key -> value``. ``snapshot()`` is the
synchronous part of a checkpoint: it copies the dicts (values of list and map
state one level deep) so that records keep being processed while
``KeyedStateSnapshot.write`` serializes the copy on another thread, one block
per key group.

State has value semantics (:mod:`lockgate.state.values`): every mutable value
is copied on its way in (``update``, ``add``, ``put``) and on its way out
(``value``, ``get``, ``items``), so the objects stored here are never
reachable from user code, and nothing the user does to an object it got from
state or handed to it can change live state, a snapshot being written, or a
record already emitted. A change takes effect when it is written back.
Immutable values (numbers, strings, tuples of them) are never copied.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, overload

from lockgate.errors import LockgateError
from lockgate.state.keygroups import KeyGroupAssigner
from lockgate.state.serde import StateSerializer
from lockgate.state.ttl_cleanup import filter_table
from lockgate.state.ttl_config import (
    SnapshotFilter,
    StateTtlConfig,
    kind_change_message,
    snapshot_filters,
    stored_kind,
    structure_kind,
)
from lockgate.state.values import ATOMIC, private_copy

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from lockgate.state.incremental import IncrementalState
    from lockgate.state.rocksdb.recovery import LocalRestore

__all__ = [
    "StateKind",
    "ValueStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ValueState",
    "ListState",
    "MapState",
    "StateTypeError",
    "HeapKeyedStateBackend",
    "KeyedStateSnapshot",
]


class StateTypeError(LockgateError):
    """A state name is used with another kind of state than before."""


class StateKind(StrEnum):
    """The kind of a keyed state (``states`` of a state file's handle)."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"


@dataclass(frozen=True)
class ValueStateDescriptor:
    """A value per key; ``default`` is what ``value()`` returns for a key
    with none (a mutable default, such as ``[]`` or ``{}``, is copied for
    every key: no two keys share it). ``ttl``: a :class:`StateTtlConfig`
    gives values a time to live (docs/state-ttl.md)."""

    name: str
    default: Any = None
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.VALUE


@dataclass(frozen=True)
class ListStateDescriptor:
    name: str
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.LIST


@dataclass(frozen=True)
class MapStateDescriptor:
    name: str
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.MAP


Descriptor = ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor


class _State:
    def __init__(self, backend: HeapKeyedStateBackend, table: dict[Any, Any]) -> None:
        self._backend = backend
        self._table = table

    def clear(self) -> None:
        self._table.pop(self._backend.current_key, None)


class ValueState(_State):
    """One value per key.

    ``value()`` returns your own copy of a mutable value: change it as you
    like, then ``update()`` it to store the change. ``update(v)`` stores a
    copy, so changing ``v`` afterwards (or emitting it and changing it later)
    neither changes the state nor a checkpoint. Immutable values are not
    copied. The same holds for list and map state, element by element."""

    def __init__(self, backend: HeapKeyedStateBackend, table: dict[Any, Any],
                 default: Any) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> Any:
        v = self._table.get(self._backend.current_key, self._default)
        return v if type(v) in ATOMIC else private_copy(v)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._table[self._backend.current_key] = (
                value if type(value) in ATOMIC else private_copy(value))


class ListState(_State):
    """A list of values per key. ``get()`` returns a new list of copies of
    mutable elements; ``add``, ``add_all`` and ``update`` store copies."""

    def get(self) -> list[Any]:
        return _copies(self._table.get(self._backend.current_key, ()))

    def add(self, value: Any) -> None:
        self._table.setdefault(self._backend.current_key, []).append(
            value if type(value) in ATOMIC else private_copy(value))

    def add_all(self, values: Iterable[Any]) -> None:
        values = _copies(values)
        if values:
            self._table.setdefault(self._backend.current_key, []).extend(values)

    def update(self, values: Iterable[Any]) -> None:
        values = _copies(values)
        if values:
            self._table[self._backend.current_key] = values
        else:
            self.clear()


class MapState(_State):
    """A dict per key. Values come out as copies (``get``, ``values``,
    ``items``) and go in as copies (``put``, ``put_all``) when mutable; map
    keys are hashable, so immutable for built-in types."""

    def _map(self) -> dict[Any, Any]:
        m: dict[Any, Any] = self._table.get(self._backend.current_key, {})
        return m

    def get(self, key: Any, default: Any = None) -> Any:
        v = self._map().get(key, default)
        return v if type(v) in ATOMIC else private_copy(v)

    def put(self, key: Any, value: Any) -> None:
        self._table.setdefault(self._backend.current_key, {})[key] = (
            value if type(value) in ATOMIC else private_copy(value))

    def put_all(self, items: dict[Any, Any]) -> None:
        if items:
            self._table.setdefault(self._backend.current_key, {}).update(
                {k: v if type(v) in ATOMIC else private_copy(v) for k, v in items.items()})

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def remove(self, key: Any) -> None:
        m = self._table.get(self._backend.current_key)
        if m is not None:
            m.pop(key, None)
            if not m:
                self.clear()

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return _copies(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, v if type(v) in ATOMIC else private_copy(v))
                for k, v in self._map().items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def is_empty(self) -> bool:
        return not self._map()


def registered_kind(descriptor: Descriptor, kinds: dict[str, str],
                    restored: dict[str, str]) -> str:
    """The stored kind of ``descriptor``'s state (TTL marked), refused when
    the state is registered or was restored as another kind (every backend)."""
    name, kind = descriptor.name, stored_kind(descriptor.kind, descriptor.ttl)
    known = kinds.get(name) or restored.get(name)
    if known is not None and known != kind:
        raise StateTypeError(kind_change_message(name, known, kind, in_checkpoint=False))
    return kind


def note_restored_kinds(states: dict[str, str], kinds: dict[str, str],
                        restored: dict[str, str]) -> None:
    """Record the kinds a checkpoint gives its states in ``restored``, refusing
    one registered here as another kind (every backend)."""
    for name, kind in states.items():
        known = kinds.get(name)
        if known is not None and known != kind:
            raise StateTypeError(kind_change_message(name, kind, known, in_checkpoint=True))
        restored[name] = kind


def _no_fault(point: str) -> None:
    pass


def _copies(values: Iterable[Any]) -> list[Any]:
    """A new list of ``values``, mutable ones copied."""
    return [v if type(v) in ATOMIC else private_copy(v) for v in values]


class HeapKeyedStateBackend:
    """Keyed state of one task: the key groups in ``key_group_range``."""

    prepares_snapshots = False
    """Nothing to get ready between records: a snapshot copies the dicts."""

    def __init__(self, max_parallelism: int, key_group_range: range,
                 serializer: StateSerializer) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.serializer = serializer
        self.current_key: Any = None
        self._tables: dict[str, dict[Any, Any]] = {}
        self._kinds: dict[str, str] = {}
        """Registered: the kind, with TTL marked (``ttl_config.stored_kind``)."""
        self._ttl: dict[str, StateTtlConfig] = {}
        self._restored_kinds: dict[str, str] = {}
        """As read back from a checkpoint: strings."""
        self._handles: dict[str, ValueState | ListState | MapState] = {}
        self._assigner = KeyGroupAssigner(max_parallelism)
        self.fault: Callable[[str], None] = _no_fault
        """The heap backend has no protocol points of its own."""

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    def get_state(self, descriptor: Descriptor) -> ValueState | ListState | MapState:
        name = descriptor.name
        kind = registered_kind(descriptor, self._kinds, self._restored_kinds)
        if descriptor.ttl is not None:
            self._ttl[name] = descriptor.ttl  # (the state layer wraps: lockgate.state.ttl)
        if name in self._handles:
            return self._handles[name]
        table = self._tables.setdefault(name, {})
        self._kinds[name] = kind
        handle: ValueState | ListState | MapState
        match descriptor:
            case ValueStateDescriptor():
                handle = ValueState(self, table, descriptor.default)
            case ListStateDescriptor():
                handle = ListState(self, table)
            case MapStateDescriptor():
                handle = MapState(self, table)
        self._handles[name] = handle
        return handle

    def raw(self, name: str) -> dict[Any, Any]:
        """The live dict of a registered state (fast path for built-in operators)."""
        return self._tables[name]

    def num_keys(self) -> int:
        keys: set[Any] = set()
        for t in self._tables.values():
            keys.update(t)
        return len(keys)

    def approximate_keys(self) -> int:
        """The most keys of any one state: cheap, and safe from another thread
        (a monitoring estimate, not :meth:`num_keys`)."""
        return max((len(t) for t in list(self._tables.values())), default=0)

    def state_kinds(self) -> dict[str, str]:
        return {**self._restored_kinds, **self._kinds}

    def snapshot(self, savepoint: bool = False) -> KeyedStateSnapshot:
        """Every snapshot here is written canonically: a savepoint's too."""
        tables: dict[str, dict[Any, Any]] = {}
        kinds = self.state_kinds()
        for name, table in self._tables.items():
            kind = structure_kind(kinds[name])
            if kind == StateKind.LIST:
                tables[name] = {k: list(v) for k, v in table.items()}
            elif kind == StateKind.MAP:
                tables[name] = {k: dict(v) for k, v in table.items()}
            else:
                tables[name] = dict(table)
        return KeyedStateSnapshot(tables, kinds, self._assigner, self.serializer,
                                  snapshot_filters(self._ttl, kinds))

    def state_keys(self, name: str) -> list[Any]:
        """Every key with a value in state ``name`` now, safe to iterate
        while state changes (TTL's incremental cleanup visits them)."""
        return list(self._tables.get(name, ()))

    def iter_state_keys(self, name: str) -> Iterator[Any]:
        """:meth:`state_keys`, listed now."""
        return iter(self.state_keys(name))

    def filter_keys(self, name: str, keys: list[Any], keep: SnapshotFilter) -> None:
        """Replace the stored object ``o`` of each of ``keys`` by ``keep(o)``
        (None: deleted) in the live dict (``ttl_cleanup.filter_table``)."""
        table = self._tables.get(name)
        if table is not None:
            filter_table(table, keys, keep)

    def expect_checkpoints(self, interval: float | None) -> None:
        """Nothing to plan: a snapshot copies the dicts."""

    def prepare_snapshot(self, now: float) -> float:
        """Nothing to get ready (:attr:`prepares_snapshots` is False)."""
        return float("inf")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: heap state keeps no local copies."""

    def restore_block(self, data: bytes, states: dict[str, str]) -> None:
        """Merge one key-group block written by ``KeyedStateSnapshot.write``."""
        note_restored_kinds(states, self._kinds, self._restored_kinds)
        block = self.serializer.loads(data)
        kg, content = block
        if kg not in self.key_group_range:
            raise LockgateError(
                f"state block of key group {kg} given to a task owning key groups "
                f"{self.key_group_range.start}..{self.key_group_range.stop - 1}: "
                "the checkpoint is corrupt or misassigned"
            )
        for name, entries in content.items():
            table = self._tables.setdefault(name, {})
            for key, value in entries:
                table[key] = value

    def restore_incremental(self, restore_dir: str, parts: list[tuple[IncrementalState, bytes]],
                            states: dict[str, str], checkpoint_id: int | None = None
                            ) -> LocalRestore | None:
        """Incremental state (a RocksDB backend's checkpoint) restored here:
        read out of a temporary database as canonical blocks of this task's
        key groups (:func:`~lockgate.state.rocksdb.io.canonical_blocks`); no
        local copy is looked for."""
        from lockgate.state.rocksdb.io import canonical_blocks

        for state, data in parts:
            for blob in canonical_blocks(state, data, restore_dir, self.key_group_range,
                                         self.serializer):
                self.restore_block(blob, states)
        return None

    def close(self) -> None:
        """Nothing held outside memory."""


@dataclass(frozen=True)
class KeyedBlocks:
    """Where :meth:`KeyedStateSnapshot.write` put each key group's block
    (offset and length, relative to its first byte) and the kind of each state."""

    key_groups: dict[int, tuple[int, int]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)


class KeyedStateSnapshot:
    """A consistent copy of keyed state; ``write`` runs on a background thread."""

    def __init__(self, tables: dict[str, dict[Any, Any]], kinds: dict[str, str],
                 assigner: KeyGroupAssigner, serializer: StateSerializer,
                 filters: dict[str, SnapshotFilter] | None = None) -> None:
        self.tables = tables
        self.kinds = kinds
        self.assigner = assigner
        self.serializer = serializer
        self.filters = filters or {}
        """Per state name: what of a stored object is written (TTL: the
        unexpired part), None for nothing (``ttl_config.snapshot_filters``)."""

    def discard(self) -> None:
        """Never to be written: a copy in memory, nothing to hand back."""

    def write(self, out: SupportsWrite[bytes]) -> KeyedBlocks:
        """Write one block per non-empty key group, ascending; return offsets
        relative to the first byte written here and the state kinds."""
        groups: dict[int, dict[str, list[list[Any]]]] = defaultdict(dict)
        kg_of = self.assigner.key_group
        for name, table in self.tables.items():
            keep = self.filters.get(name)
            for key, value in table.items():
                if keep is not None and (value := keep(value)) is None:
                    continue  # expired: cleanup in full snapshots
                groups[kg_of(key)].setdefault(name, []).append([key, value])
        offsets: dict[int, tuple[int, int]] = {}
        pos = 0
        dumps = StateSerializer(self.serializer.allow_pickle).dumps
        for kg in sorted(groups):
            blob = dumps([kg, groups[kg]])
            out.write(blob)
            offsets[kg] = (pos, len(blob))
            pos += len(blob)
        return KeyedBlocks(offsets, {n: str(k) for n, k in self.kinds.items()})
