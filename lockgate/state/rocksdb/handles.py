"""The state handles on RocksDB (``ValueState``, ``ListState``, ``MapState``
with the heap backend's methods and value semantics), over the tables of
:mod:`lockgate.state.rocksdb.tables`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from lockgate.state.backend import ListState, MapState, ValueState
from lockgate.state.rocksdb.tables import MISSING as _MISSING
from lockgate.state.rocksdb.tables import MapTable, ValueTable
from lockgate.state.values import ATOMIC, private_copy

__all__ = ["RocksListState", "RocksMapState", "RocksValueState"]


def _copy(v: Any) -> Any:
    return v if v.__class__ in ATOMIC else private_copy(v)


class RocksValueState(ValueState):
    """``ValueState`` on RocksDB (same methods, same value semantics)."""

    def __init__(self, table: ValueTable, default: Any) -> None:
        self.t = table
        self._default = default

    def value(self) -> Any:
        t = self.t
        key = t.backend.current_key
        v = t.read(key, _MISSING)
        return _copy(self._default if v is _MISSING else v)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self.t.write(self.t.backend.current_key, value)

    def clear(self) -> None:
        self.t.pop(self.t.backend.current_key, None)


class RocksListState(ListState):
    """``ListState`` on RocksDB: the list is one value (``add`` reads and
    writes it)."""

    def __init__(self, table: ValueTable) -> None:
        self.t = table

    def get(self) -> list[Any]:
        v = self.t.read(self.t.backend.current_key, ())
        return [_copy(e) for e in v]

    def add(self, value: Any) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        values = list(values)
        if values:
            key = self.t.backend.current_key
            current = self.t.read(key, None)
            self.t.write(key, (list(current) if current else []) + values)

    def update(self, values: Iterable[Any]) -> None:
        values = list(values)
        if values:
            self.t.write(self.t.backend.current_key, values)
        else:
            self.clear()

    def clear(self) -> None:
        self.t.pop(self.t.backend.current_key, None)


class RocksMapState(MapState):
    """``MapState`` on RocksDB: one RocksDB entry per map key."""

    def __init__(self, table: MapTable) -> None:
        self.t = table

    def _map(self) -> dict[Any, Any]:
        return self.t.entries(self.t.backend.current_key)

    def get(self, key: Any, default: Any = None) -> Any:
        return _copy(self.t.entry(self.t.backend.current_key, key, default))

    def put(self, key: Any, value: Any) -> None:
        self.t.put_entry(self.t.backend.current_key, key, _copy(value))

    def put_all(self, items: dict[Any, Any]) -> None:
        for k, v in items.items():
            self.put(k, v)

    def contains(self, key: Any) -> bool:
        return self.t.entry(self.t.backend.current_key, key, _MISSING) is not _MISSING

    def remove(self, key: Any) -> None:
        self.t.remove_entry(self.t.backend.current_key, key)

    def clear(self) -> None:
        self.t.pop(self.t.backend.current_key, None)

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return [_copy(v) for v in self._map().values()]

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, _copy(v)) for k, v in self._map().items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def is_empty(self) -> bool:
        return not self._map()
