"""Keyed state in RocksDB: the key layout and the raw views of the built-in
operators (the state handles over them: :mod:`lockgate.state.rocksdb.handles`).

Layout of a RocksDB key (all states of an operator in one database)::

    key group (2 bytes, big endian) | state id (4 bytes) | len(key) (4 bytes) | key
                                                                  [| map key]

so the entries of one key group are one contiguous byte range (a rescale
cuts and merges ranges), and the entries of one key of a map state are one
prefix. Keys, map keys and values are encoded with the state's
:class:`~lockgate.state.serde.StateSerializer` (msgpack; pickle only on
opt-in). A value state and a list state store one value per key (a list
state the whole list), a map state one entry per map key. Keys compare by
their encoded bytes (as in Flink's RocksDB backend): ``1`` and ``1.0`` are
different keys here.

Value semantics come from serialization: what a handle returns is decoded
anew, what it stores is encoded at once. The raw views (:class:`ValueTable`,
:class:`MapTable`) serve the built-in operators (reduce, windows, timers),
which keep the objects they get and change them in place: a mutable object
read or stored through a view is *live* — kept in the view and written back
when the view is flushed (before every snapshot, and when more than
:data:`LIVE_LIMIT` objects are live; an operator holds one key's object at a
time, so writing them back between records loses nothing). Immutable values
go to RocksDB at once.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, overload

from lockgate.state.keygroups import fmix32
from lockgate.state.serde import StateSerializer, key_bytes
from lockgate.state.values import ATOMIC, private_copy

_KG = struct.Struct(">H")
_LEN = struct.Struct(">I")
META = b"\xff\xff"
"""Key prefix of the backend's own entries (above every key group)."""
KIND_PREFIX = META + b"kind:"
"""``KIND_PREFIX + name`` -> the state's recorded kind."""
LIVE_LIMIT = 4096
MISSING: Any = object()
"""A default no stored value equals."""
_MISSING = MISSING


def state_id(name: str) -> bytes:
    """The 4-byte id of a state name: a hash, the same in every task and
    database, so ranges copy between databases without renaming."""
    return hashlib.blake2b(name.encode(), digest_size=4).digest()


def kg_bytes(key_group: int) -> bytes:
    return _KG.pack(key_group)


def successor(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with ``prefix``."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return META + b"\xff" * 8
    p[-1] += 1
    return bytes(p)


class KeyCodec:
    """Encodes the current key once: ``kg | ... | len | key`` parts."""

    def __init__(self, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self._key: Any = _MISSING
        self._kg = b""
        self._lk = b""

    def parts(self, key: Any) -> tuple[bytes, bytes]:
        """``(key group bytes, length + key bytes)`` of ``key``."""
        if key is not self._key:
            kb = key_bytes(key)
            self._kg = _KG.pack(fmix32(zlib.crc32(kb)) % self.max_parallelism)
            self._lk = _LEN.pack(len(kb)) + kb
            self._key = key
        return self._kg, self._lk


def split_key(entry: bytes) -> tuple[bytes, int]:
    """``(the key's bytes, where the map key starts)`` of a RocksDB key."""
    (n,) = _LEN.unpack_from(entry, 6)
    return entry[10:10 + n], 10 + n


class WriteBatch(Protocol):
    """A write batch of a :class:`StateDB` (rocksdict's ``WriteBatch`` in raw
    mode, or the changelog's ``LoggedBatch`` over one)."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...


class DBIterator(Protocol):
    """A raw iterator over a :class:`StateDB` (rocksdict's ``RdictIter``)."""

    def seek(self, key: bytes) -> None: ...

    def valid(self) -> bool: ...

    def key(self) -> bytes: ...

    def value(self) -> bytes: ...

    def next(self) -> None: ...


class StateDB(Protocol):
    """What the tables, and the code that reads and filters their entries,
    use of the database: rocksdict's ``Rdict`` opened in raw mode (keys and
    values are bytes), or the changelog's ``LoggedDB`` over one."""

    @overload
    def get(self, key: bytes) -> bytes | None: ...

    @overload
    def get(self, key: list[bytes]) -> list[bytes | None]: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def write(self, batch: Any) -> None:
        """Apply ``batch``, one that the backend's ``batch()`` made."""

    def iter(self) -> DBIterator: ...


class TableHost(Protocol):
    """What a table uses of its backend (``state.rocksdb.RocksDBKeyedStateBackend``)."""

    db: StateDB
    serializer: StateSerializer
    codec: KeyCodec
    key_group_range: range
    current_key: Any
    """The key the state handles over a table read and write."""

    def batch(self) -> WriteBatch: ...


class _Table:
    """The common part of a raw view: one state of one backend."""

    def __init__(self, backend: TableHost, name: str) -> None:
        self.backend = backend
        self.name = name
        self.sid = state_id(name)
        self.db: StateDB = backend.db
        self.dumps: Callable[[Any], bytes] = backend.serializer.dumps
        self.loads: Callable[[bytes], Any] = backend.serializer.loads
        self.codec = backend.codec

    def prefix(self, key: Any) -> bytes:
        kg, lk = self.codec.parts(key)
        return kg + self.sid + lk

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(RocksDB key, value)`` of this state, key group by key group."""
        db = self.backend.db
        for kg in self.backend.key_group_range:
            start = _KG.pack(kg) + self.sid
            yield from prefix_items(db, start)

    def flush(self) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    def keys(self) -> list[Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


def prefix_items(db: StateDB, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every entry of ``db`` whose key starts with ``prefix``."""
    it = db.iter()
    it.seek(prefix)
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            return
        yield k, it.value()
        it.next()


class ValueTable(_Table):
    """A value or list state as a mapping key -> value, with a write-back
    cache of at most :data:`LIVE_LIMIT` keys: ``live`` holds decoded values
    (hot keys cost a dict lookup), ``dirty`` the keys to write at the next
    flush (stored ones, and mutable ones handed out: they may be changed in
    place), ``encoded`` the RocksDB keys of those read from the database (a
    flush, which the synchronous part of a checkpoint waits for, need not
    encode them again). A flush (every snapshot) writes the dirty ones in one
    batch; a full cache is flushed and emptied."""

    def __init__(self, backend: TableHost, name: str) -> None:
        super().__init__(backend, name)
        self.live: dict[Any, Any] = {}
        self.dirty: set[Any] = set()
        self.encoded: dict[Any, bytes] = {}

    def flush(self) -> None:
        if not self.dirty:
            return
        batch = self.backend.batch()
        dumps, prefix, live, encoded = self.dumps, self.prefix, self.live, self.encoded
        for key in self.dirty:
            rk = encoded.get(key)
            batch.put(rk if rk is not None else prefix(key), dumps(live[key]))
        self.backend.db.write(batch)
        self.dirty.clear()

    def _cache(self, key: Any, value: Any, dirty: bool, rk: bytes | None = None) -> None:
        live = self.live
        if len(live) >= LIVE_LIMIT and key not in live:
            self.flush()
            live.clear()
            self.encoded.clear()
        live[key] = value
        if rk is not None:
            self.encoded[key] = rk
        if dirty:
            self.dirty.add(key)

    def read(self, key: Any, default: Any = None) -> Any:
        """The stored object (the caller copies it before it leaves)."""
        value = self.live.get(key, _MISSING)
        if value is not _MISSING:
            return value
        rk = self.prefix(key)
        data = self.db.get(rk)
        if data is None:
            return default
        value = self.loads(data)
        self._cache(key, value, False, rk)
        return value

    def write(self, key: Any, value: Any) -> None:
        """Store a private copy of ``value``."""
        self._cache(key, value if frozen(value) else private_copy(value), True)

    def get(self, key: Any, default: Any = None) -> Any:
        value = self.live.get(key, _MISSING)
        if value is not _MISSING:
            if value.__class__ not in ATOMIC and not frozen(value):
                self.dirty.add(key)
            return value
        rk = self.prefix(key)
        data = self.db.get(rk)
        if data is None:
            return default
        value = self.loads(data)
        self._cache(key, value, not frozen(value), rk)
        return value

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._cache(key, value, True)

    def __contains__(self, key: Any) -> bool:
        return key in self.live or self.db.get(self.prefix(key)) is not None

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        value = self.read(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self.live.pop(key, None)
        self.encoded.pop(key, None)
        self.dirty.discard(key)
        self.db.delete(self.prefix(key))
        return value

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            self[key] = value = default
        return value

    def items(self) -> list[tuple[Any, Any]]:
        self.flush()
        loads = self.loads
        return [(loads(split_key(k)[0]), loads(v)) for k, v in self.scan()]

    def keys(self) -> list[Any]:
        self.flush()
        loads = self.loads
        return [loads(split_key(k)[0]) for k, _ in self.scan()]

    def values(self) -> list[Any]:
        self.flush()
        loads = self.loads
        return [loads(v) for _, v in self.scan()]


class MapTable(_Table):
    """A map state as a mapping key -> dict (entries stored one by one)."""

    def __init__(self, backend: TableHost, name: str) -> None:
        super().__init__(backend, name)
        self.live: dict[Any, tuple[dict[Any, Any], set[bytes]]] = {}
        """Key -> (its dict, the RocksDB keys of its entries when it was read)."""

    def _stored(self, prefix: bytes) -> tuple[dict[Any, Any], set[bytes]]:
        loads, n = self.loads, len(prefix)
        out: dict[Any, Any] = {}
        keys: set[bytes] = set()
        for k, v in prefix_items(self.db, prefix):
            out[loads(k[n:])] = loads(v)
            keys.add(k)
        return out, keys

    def flush(self) -> None:
        if not self.live:
            return
        batch = self.backend.batch()
        for key, (entries, old) in self.live.items():
            self.put_entries(batch, self.prefix(key), entries, old)
        self.backend.db.write(batch)
        self.live.clear()

    def put_entries(self, batch: WriteBatch, prefix: bytes, entries: dict[Any, Any],
                    old: set[bytes]) -> None:
        """Into ``batch``: ``entries`` as the map of the key at ``prefix``,
        and the deletion of its stored RocksDB keys ``old`` it no longer holds."""
        dumps = self.dumps
        new = set()
        for mk, value in entries.items():
            k = prefix + dumps(mk)
            new.add(k)
            batch.put(k, dumps(value))
        for k in old - new:
            batch.delete(k)

    def _hold(self, key: Any, entries: dict[Any, Any], old: set[bytes]) -> None:
        if len(self.live) >= LIVE_LIMIT and key not in self.live:
            self.flush()
        self.live[key] = (entries, old)

    def get(self, key: Any, default: Any = None) -> Any:
        held = self.live.get(key)
        if held is not None:
            return held[0]
        entries, old = self._stored(self.prefix(key))
        if not old:
            return default
        self._hold(key, entries, old)
        return entries

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, entries: dict[Any, Any]) -> None:
        held = self.live.get(key)
        old = held[1] if held is not None else self._stored(self.prefix(key))[1]
        self._hold(key, entries, old)

    def __contains__(self, key: Any) -> bool:
        if key in self.live:
            return True
        for _ in prefix_items(self.db, self.prefix(key)):
            return True
        return False

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        held = self.live.pop(key, None)
        prefix = self.prefix(key)
        stored, old = self._stored(prefix)
        if held is None and not old:
            if default is _MISSING:
                raise KeyError(key)
            return default
        batch = self.backend.batch()
        for k in old | (held[1] if held is not None else set()):
            batch.delete(k)
        self.backend.db.write(batch)
        return held[0] if held is not None else stored

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            self[key] = value = default
        return value

    def _grouped(self) -> Iterator[tuple[Any, dict[Any, Any]]]:
        self.flush()
        loads = self.loads
        current: bytes | None = None
        entries: dict[Any, Any] = {}
        for k, v in self.scan():
            kb, start = split_key(k)
            if kb != current:
                if current is not None:
                    yield loads(current), entries
                current, entries = kb, {}
            entries[loads(k[start:])] = loads(v)
        if current is not None:
            yield loads(current), entries

    def items(self) -> list[tuple[Any, dict[Any, Any]]]:
        return list(self._grouped())

    def keys(self) -> list[Any]:
        return [k for k, _ in self._grouped()]

    def values(self) -> list[dict[Any, Any]]:
        return [v for _, v in self._grouped()]

    # -- one entry (MapState) -------------------------------------------
    def entry(self, key: Any, mk: Any, default: Any) -> Any:
        held = self.live.get(key)
        if held is not None:
            return held[0].get(mk, default)
        data = self.db.get(self.prefix(key) + self.dumps(mk))
        return default if data is None else self.loads(data)

    def put_entry(self, key: Any, mk: Any, value: Any) -> None:
        held = self.live.get(key)
        if held is not None:
            held[0][mk] = value
        else:
            self.db.put(self.prefix(key) + self.dumps(mk), self.dumps(value))

    def remove_entry(self, key: Any, mk: Any) -> None:
        held = self.live.get(key)
        if held is not None:
            held[0].pop(mk, None)
        else:
            self.db.delete(self.prefix(key) + self.dumps(mk))

    def entries(self, key: Any) -> dict[Any, Any]:
        held = self.live.get(key)
        if held is not None:
            return held[0]
        return self._stored(self.prefix(key))[0]


def frozen(v: Any) -> bool:
    """Whether ``v`` cannot change: an immutable value, or a tuple of them
    (a view need not write it back after handing it out)."""
    c = v.__class__
    return c in ATOMIC or (c is tuple and all(e.__class__ in ATOMIC for e in v))
