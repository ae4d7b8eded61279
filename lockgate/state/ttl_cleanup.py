"""The incremental cleanup of one TTL state (Flink's ``TtlIncrementalCleanup``):
a cursor over all the task's keys of the state, advanced a few keys at a
time, removing what expired. The keys come from the backend's lazy
``iter_state_keys(name)`` where it has one (the RocksDB backend: a resumable
walk over its key groups, :mod:`lockgate.state.rocksdb_cleanup`), else from
``state_keys(name)`` listed when a round starts.

Each key is checked by the fastest means the backend offers: the heap
backend's live dict directly; a backend's ``filter_keys(name, keys, keep)``
(reads without copying or holding, writes back only what changed); a raw
view with ``read`` and ``write`` (the RocksDB backend's value and list
states); or else the state's own handles with ``current_key`` set to each
key in turn (and restored after).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from lockgate.state.ttl_config import SnapshotFilter, expiry_filter

__all__ = ["CleanupCursor", "filter_table"]


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
    """Where the incremental cleanup of state ``name`` stands in its round.

    ``clean_current(now)`` cleans the backend's current key through the
    state's handles (the fallback)."""

    def __init__(self, backend: Any, name: str, structure: str, ttl_ms: int,
                 clean_current: Callable[[int], None]) -> None:
        self.backend = backend
        self.name = name
        self.structure = structure
        self.ttl_ms = ttl_ms
        self.clean_current = clean_current
        self._keys: Iterator[Any] | None = None

    def run(self, count: int, now: int) -> None:
        """Check the next ``count`` keys for what expired at ``now`` and
        remove it. A round ends when its keys do and the next lists them anew
        (``backend.iter_state_keys``, a lazy walk, where the backend has one:
        the RocksDB backend's; else ``backend.state_keys``); at most one round
        starts per call, so a small state is checked at most once."""
        started = False
        while count > 0:
            if self._keys is None:
                if started:
                    return
                lazy = getattr(self.backend, "iter_state_keys", None)
                self._keys = iter(lazy(self.name) if lazy is not None
                                  else self.backend.state_keys(self.name))
                started = True
            keys = list(islice(self._keys, count))
            if len(keys) < count:
                self._keys = None
            count -= len(keys)
            if keys:
                self._clean(keys, now)

    def _clean(self, keys: list[Any], now: int) -> None:
        backend = self.backend
        raw = getattr(backend, "raw", None)
        table = raw(self.name) if raw is not None else None
        if type(table) is dict:
            if self.structure == "value":
                _drop_expired_pairs(table, keys, now - self.ttl_ms)
            else:
                filter_table(table, keys, expiry_filter(self.structure, self.ttl_ms, now))
            return
        filter_keys = getattr(backend, "filter_keys", None)
        if filter_keys is not None:
            filter_keys(self.name, keys, expiry_filter(self.structure, self.ttl_ms, now))
            return
        if self.structure != "map" and callable(getattr(table, "read", None)) \
                and callable(getattr(table, "write", None)):
            # the RocksDB backend's view of a value or list state: ``read``
            # decodes without holding, ``write`` stores at once
            keep = expiry_filter(self.structure, self.ttl_ms, now)
            view: Any = table
            for key in keys:
                stored = view.read(key)
                if stored is not None:
                    kept = keep(stored)
                    if kept is None:
                        view.pop(key, None)
                    elif kept is not stored:
                        view.write(key, kept)
            return
        saved = backend.current_key
        try:
            for key in keys:
                backend.current_key = key
                self.clean_current(now)
        finally:
            backend.current_key = saved
