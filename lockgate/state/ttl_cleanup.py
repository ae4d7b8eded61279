"""The incremental cleanup of one TTL state (Flink's ``TtlIncrementalCleanup``):
a cursor over all the task's keys of the state, advanced a few keys at a
time, removing what expired. The keys come from the backend's
``iter_state_keys(name)`` (the RocksDB backend: a resumable walk over its key
groups, :mod:`lockgate.state.rocksdb.cleanup`; the heap backend: the keys
listed when a round starts).

The heap backend's live dict is checked directly (a value state's pairs
inline); any other backend's stored objects through its
``filter_keys(name, keys, keep)`` (reads without copying or holding, writes
back only what changed).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any, Protocol

from lockgate.state.ttl_config import SnapshotFilter, expiry_filter

__all__ = ["CleanupCursor", "CleanupBackend", "filter_table"]


class CleanupBackend(Protocol):
    """What the incremental cleanup needs of a keyed state backend (both
    backends have it: ``state.backends.KeyedStateBackend``)."""

    def raw(self, name: str) -> Any:
        """State ``name`` as a mapping key -> stored object (the heap
        backend's: its live dict)."""
        ...

    def iter_state_keys(self, name: str) -> Iterator[Any]:
        """The keys of state ``name``, safe to iterate while state changes
        (a key may be gone when it comes up)."""
        ...

    def filter_keys(self, name: str, keys: list[Any], keep: SnapshotFilter) -> None:
        """Replace the stored object ``o`` of each of ``keys`` by ``keep(o)``
        (the same object: no change; None: the key deleted), without copying
        or holding what it reads."""
        ...


def filter_table(table: dict[Any, Any], keys: list[Any], keep: SnapshotFilter) -> None:
    """Replace ``table[key]`` by ``keep(table[key])`` for each of ``keys``
    (the same object: left alone; None: deleted). ``keep`` builds new
    containers, so a snapshot's one-level copy never sees a change."""
    get = table.get
    for key in keys:
        stored = get(key)
        if stored is not None:
            kept = keep(stored)
            if kept is None:
                del table[key]
            elif kept is not stored:
                table[key] = kept


def _drop_expired_pairs(table: dict[Any, Any], keys: list[Any], deadline: int) -> None:
    """:func:`filter_table` of a value state, inlined (the common case)."""
    get = table.get
    try:
        for key in keys:
            pair = get(key)
            if pair is not None and pair[1] <= deadline:
                del table[key]
    except (TypeError, IndexError, KeyError):
        return  # not a (value, timestamp) pair: the read of it names the problem


class CleanupCursor:
    """Where the incremental cleanup of state ``name`` stands in its round."""

    def __init__(self, backend: CleanupBackend, name: str, structure: str, ttl_ms: int) -> None:
        self.backend = backend
        self.name = name
        self.structure = structure
        self.ttl_ms = ttl_ms
        self._keys: Iterator[Any] | None = None

    def run(self, count: int, now: int) -> None:
        """Check the next ``count`` keys for what expired at ``now`` and
        remove it. A round ends when its keys do and the next lists them anew
        (``backend.iter_state_keys``: the RocksDB backend's a lazy walk); at
        most one round starts per call, so a small state is checked at most
        once."""
        started = False
        while count > 0:
            if self._keys is None:
                if started:
                    return
                self._keys = self.backend.iter_state_keys(self.name)
                started = True
            keys = list(islice(self._keys, count))
            if len(keys) < count:
                self._keys = None
            count -= len(keys)
            if keys:
                self._clean(keys, now)

    def _clean(self, keys: list[Any], now: int) -> None:
        table = self.backend.raw(self.name)
        if type(table) is dict:  # the heap backend's live dict: at once
            if self.structure == "value":
                _drop_expired_pairs(table, keys, now - self.ttl_ms)
            else:
                filter_table(table, keys, expiry_filter(self.structure, self.ttl_ms, now))
            return
        self.backend.filter_keys(self.name, keys,
                                 expiry_filter(self.structure, self.ttl_ms, now))
