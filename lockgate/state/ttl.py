"""State TTL over any backend: handles that wrap a backend's own (Flink's
``TtlStateFactory`` and ``TtlValueState``, ``TtlListState``, ``TtlMapState``).

A state registered with ``ttl=StateTtlConfig(...)`` is stored by the backend
as an ordinary state of the same structure holding ``(value, timestamp)``
pairs (Flink's ``TtlValue``): one for a value state, one per element of a
list state, one per entry of a map state, each with its own time. The
wrappers here read and write that form through the backend's handle API
(``value``/``update``, ``get``/``add``, ``get``/``put``/``items`` of the key
in ``backend.current_key``), so the same code serves the heap backend and any
other backend with the same handles, and value semantics stay the backend's:
what goes in is copied, what comes out is copied.

Cleanup, as in Flink:

- **on access**: a read that finds an expired value removes it;
- **in full snapshots**: ``ttl_config.snapshot_filters`` (the backend's
  snapshot leaves expired entries out);
- **incrementally**: every access of a state checks ``size`` more of its keys
  (and, with ``run_for_every_record``, every record the operator processes),
  in rounds over all the task's keys (``backend.iter_state_keys(name)``), so keys
  never touched again are removed too.

Expiry only hides or removes values; it never changes one.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, overload

from lockgate.errors import CheckpointCorruptError
from lockgate.state.backend import (
    Descriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ValueState,
    ValueStateDescriptor,
)
from lockgate.state.ttl_cleanup import CleanupBackend, CleanupCursor
from lockgate.state.ttl_config import StateTtlConfig, StateVisibility, UpdateType
from lockgate.state.values import ATOMIC, private_copy

__all__ = ["TtlStates", "TtlValueState", "TtlListState", "TtlMapState", "TtlBackend"]


class TtlBackend(CleanupBackend, Protocol):
    """What TTL needs of a keyed state backend (the incremental cleanup's
    needs included)."""

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...
    def get_state(self, descriptor: Descriptor) -> ValueState | ListState | MapState: ...


_END = object()


def _wall_ms() -> int:
    return int(time.time() * 1000)

ACCESS_BATCH = 8
"""The incremental cleanup on access runs every this many accesses of a state."""


def _checked(name: str, pair: Any) -> tuple[Any, int]:
    """A stored ``(value, timestamp)`` pair, validated: it may come from a checkpoint."""
    if type(pair) is tuple and len(pair) == 2 and type(pair[1]) is int:
        return pair
    raise CheckpointCorruptError(
        f"TTL state {name!r} holds {type(pair).__name__} where a (value, timestamp) pair "
        "belongs: the checkpoint is corrupt, or was not written by a TTL state")


class _TtlHandle:
    """What the TTL handles share: the wrapped handle, the clock, the rules,
    and the incremental cleanup of their state."""

    _structure = "value"

    def _setup(self, backend: TtlBackend, name: str, config: StateTtlConfig) -> None:
        self._ttl_backend = backend
        self._name = name
        self._config = config
        self._ttl_ms = config.ttl_ms
        self._on_read = config.update_type == UpdateType.ON_READ_AND_WRITE
        self._return_expired = (
            config.state_visibility == StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)
        inc = config.cleanup_incrementally
        self._cleanup_size = inc.size if inc is not None else 0
        self._cursor = CleanupCursor(backend, name, self._structure, self._ttl_ms)
        self._debt = 0
        self._now: Callable[[], int] = config.now if config.clock is not None else _wall_ms

    def _alive(self, ts: int, now: int) -> bool:
        return ts + self._ttl_ms > now

    def _accessed(self) -> None:
        """Incremental cleanup on access: ``size`` keys per access, checked
        every ``ACCESS_BATCH`` accesses (one clock read and set-up for many)."""
        if self._cleanup_size:
            self._debt += 1
            if self._debt >= ACCESS_BATCH:
                self._debt = 0
                self.cleanup_some(self._cleanup_size * ACCESS_BATCH)

    def cleanup_some(self, count: int) -> None:
        """Check the next ``count`` keys of this state's round for expired
        values and remove them (:class:`CleanupCursor`); the current key is
        left as it was."""
        self._cursor.run(count, self._now())


class TtlValueState(_TtlHandle, ValueState):
    """A value state with TTL: ``value()`` returns the default once the value
    expired (Flink's ``TtlValueState``)."""

    _structure = "value"

    def __init__(self, backend: TtlBackend, inner: ValueState,
                 descriptor: ValueStateDescriptor, config: StateTtlConfig) -> None:
        self._setup(backend, descriptor.name, config)
        self._inner = inner
        self._default = descriptor.default

    def _default_value(self) -> Any:
        d = self._default
        return d if type(d) in ATOMIC else private_copy(d)

    def value(self) -> Any:
        if self._cleanup_size:
            self._accessed()
        stored = self._inner.value()
        if stored is None:
            return self._default_value()
        if type(stored) is not tuple or len(stored) != 2 or type(stored[1]) is not int:
            _checked(self._name, stored)
        v, ts = stored
        now = self._now()
        if ts + self._ttl_ms <= now:
            self._inner.clear()
            return v if self._return_expired else self._default_value()
        if self._on_read:
            self._inner.update((v, now))
        return v

    def update(self, value: Any) -> None:
        if self._cleanup_size:
            self._accessed()
        if value is None:
            self._inner.clear()
        else:
            self._inner.update((value, self._now()))

    def clear(self) -> None:
        self._accessed()
        self._inner.clear()


class TtlListState(_TtlHandle, ListState):
    """A list state with TTL: each element has its own timestamp and expires
    on its own (Flink's ``TtlListState``)."""

    _structure = "list"

    def __init__(self, backend: TtlBackend, inner: ListState,
                 descriptor: ListStateDescriptor, config: StateTtlConfig) -> None:
        self._setup(backend, descriptor.name, config)
        self._inner = inner

    def get(self) -> list[Any]:
        self._accessed()
        stored = self._inner.get()
        if not stored:
            return []
        now = self._now()
        pairs = [_checked(self._name, p) for p in stored]
        alive = [p for p in pairs if self._alive(p[1], now)]
        out = [v for v, _ in (pairs if self._return_expired else alive)]
        if self._on_read:
            alive = [(v, now) for v, _ in alive]
        if len(alive) != len(pairs) or (self._on_read and alive):
            self._inner.update(alive)  # cleanup on access; renewed timestamps
        return out

    def add(self, value: Any) -> None:
        self._accessed()
        self._inner.add((value, self._now()))

    def add_all(self, values: Iterable[Any]) -> None:
        self._accessed()
        now = self._now()
        self._inner.add_all([(v, now) for v in values])

    def update(self, values: Iterable[Any]) -> None:
        self._accessed()
        now = self._now()
        self._inner.update([(v, now) for v in values])

    def clear(self) -> None:
        self._accessed()
        self._inner.clear()


class TtlMapState(_TtlHandle, MapState):
    """A map state with TTL: each entry has its own timestamp and expires on
    its own (Flink's ``TtlMapState``). ``contains`` and ``get`` of an entry
    count as reads of it."""

    _structure = "map"

    def __init__(self, backend: TtlBackend, inner: MapState,
                 descriptor: MapStateDescriptor, config: StateTtlConfig) -> None:
        self._setup(backend, descriptor.name, config)
        self._inner = inner

    def _entry(self, key: Any) -> tuple[bool, Any]:
        """``(found, value)`` of ``key`` under the TTL rules."""
        stored = self._inner.get(key)  # a pair, or None: no entry
        if stored is None:
            return False, None
        v, ts = _checked(self._name, stored)
        now = self._now()
        if not self._alive(ts, now):
            self._inner.remove(key)
            return self._return_expired, v
        if self._on_read:
            self._inner.put(key, (v, now))
        return True, v

    def _live_items(self) -> list[tuple[Any, Any]]:
        """Every entry under the TTL rules; expired ones are removed."""
        stored = self._inner.items()
        if not stored:
            return []
        now = self._now()
        out: list[tuple[Any, Any]] = []
        renewed: dict[Any, Any] = {}
        for k, pair in stored:
            v, ts = _checked(self._name, pair)
            if self._alive(ts, now):
                out.append((k, v))
                if self._on_read:
                    renewed[k] = (v, now)
            else:
                self._inner.remove(k)
                if self._return_expired:
                    out.append((k, v))
        if renewed:
            self._inner.put_all(renewed)
        return out

    def get(self, key: Any, default: Any = None) -> Any:
        self._accessed()
        found, v = self._entry(key)
        if found:
            return v
        return default if type(default) in ATOMIC else private_copy(default)

    def put(self, key: Any, value: Any) -> None:
        self._accessed()
        self._inner.put(key, (value, self._now()))

    def put_all(self, items: dict[Any, Any]) -> None:
        self._accessed()
        if items:
            now = self._now()
            self._inner.put_all({k: (v, now) for k, v in items.items()})

    def contains(self, key: Any) -> bool:
        self._accessed()
        return self._entry(key)[0]

    def remove(self, key: Any) -> None:
        self._accessed()
        self._inner.remove(key)

    def keys(self) -> list[Any]:
        self._accessed()
        return [k for k, _ in self._live_items()]

    def values(self) -> list[Any]:
        self._accessed()
        return [v for _, v in self._live_items()]

    def items(self) -> list[tuple[Any, Any]]:
        self._accessed()
        return self._live_items()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def is_empty(self) -> bool:
        self._accessed()
        return not self._live_items()

    def clear(self) -> None:
        self._accessed()
        self._inner.clear()


TtlHandle = TtlValueState | TtlListState | TtlMapState


def _cleanup_per_record(handle: TtlHandle, size: int, records: int) -> None:
    handle.cleanup_some(size * records)


class TtlStates:
    """The keyed states of one operator as its user functions see them: with
    TTL wrapped, without as the backend gives them (Flink's
    ``TtlStateFactory.createStateAndWrapWithTtlIfEnabled``)."""

    def __init__(self, backend: TtlBackend) -> None:
        self.backend = backend
        self._handles: dict[str, tuple[Descriptor, TtlHandle]] = {}
        self._per_record: dict[str, Callable[[int], None]] = {}
        """State name -> its incremental cleanup, run for every record."""

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    def get_state(self, descriptor: Descriptor) -> ValueState | ListState | MapState:
        config = descriptor.ttl
        if config is None:
            return self.backend.get_state(descriptor)
        if not isinstance(config, StateTtlConfig):
            raise TypeError(f"the ttl of state {descriptor.name!r} must be a StateTtlConfig, "
                            f"got {type(config).__name__}")
        known = self._handles.get(descriptor.name)
        if known is not None and known[0] == descriptor:
            return known[1]
        handle: TtlHandle
        match descriptor:
            case ValueStateDescriptor():
                inner = self.backend.get_state(dataclasses.replace(descriptor, default=None))
                handle = TtlValueState(self.backend, inner, descriptor, config)
            case ListStateDescriptor():
                handle = TtlListState(self.backend, self.backend.get_state(descriptor),
                                      descriptor, config)
            case MapStateDescriptor():
                handle = TtlMapState(self.backend, self.backend.get_state(descriptor),
                                     descriptor, config)
        self._handles[descriptor.name] = (descriptor, handle)
        inc = config.cleanup_incrementally
        if inc is not None and inc.run_for_every_record:
            self._per_record[descriptor.name] = functools.partial(
                _cleanup_per_record, handle, inc.size)
        else:
            self._per_record.pop(descriptor.name, None)
        return handle

    @property
    def per_record(self) -> bool:
        """Some state cleans up incrementally for every record."""
        return bool(self._per_record)

    def records_processed(self, n: int) -> None:
        """``n`` records were processed: the incremental cleanup that runs for
        every record checks ``size`` keys per record, per state."""
        for run in self._per_record.values():
            run(n)
