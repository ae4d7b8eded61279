"""The RocksDB backend's hooks for TTL's incremental cleanup
(:class:`~lockgate.state.ttl_cleanup.CleanupCursor`): a resumable walk over
one state's keys and a filter of some keys' stored objects.

- :func:`iter_keys`: the keys of one state in the task's key groups, read a
  chunk at a time, each chunk with a fresh RocksDB iterator that seeks past
  the last key read (no iterator, and so no pinned memtable or file, is held
  between chunks; a round costs what it reads, not a listing of the whole
  state up front). The raw view is written back when a round starts; keys
  first written during the round come up in the next one.
- :func:`filter_keys`: replaces each key's stored object ``o`` by
  ``keep(o)`` (the same object: nothing written; None: deleted), reading
  with one multi-get and writing with one batch, without decoding into or
  holding anything in the view's cache (a key the cache holds is filtered
  there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lockgate.state.rocksdb.tables import MapTable, ValueTable, kg_bytes, successor

if TYPE_CHECKING:
    from lockgate.state.ttl_config import SnapshotFilter

__all__ = ["filter_keys", "iter_keys", "CHUNK"]

CHUNK = 256
"""Keys read per RocksDB iterator."""


def iter_keys(table: ValueTable | MapTable, chunk: int = CHUNK) -> Iterator[Any]:
    """Every key of ``table``'s state, key group by key group (see the module)."""
    table.flush()
    backend, sid, loads = table.backend, table.sid, table.loads
    is_map = isinstance(table, MapTable)
    for kg in backend.key_group_range:
        start = kg_bytes(kg) + sid
        pos = start
        while True:
            found: list[bytes] = []
            it = backend.db.iter()
            it.seek(pos)
            while it.valid() and len(found) < chunk:
                k = it.key()
                if not k.startswith(start):
                    break
                n = 10 + int.from_bytes(k[6:10], "big")
                found.append(k[10:n])
                if is_map:
                    it.seek(successor(k[:n]))  # past this key's entries
                else:
                    it.next()
            del it
            for kb in found:
                yield loads(kb)
            if len(found) < chunk:
                break
            last = kg_bytes(kg) + sid + len(found[-1]).to_bytes(4, "big") + found[-1]
            pos = successor(last) if is_map else last + b"\x00"


def filter_keys(table: ValueTable | MapTable, keys: list[Any],
                keep: SnapshotFilter | Callable[[Any], Any]) -> None:
    """Filter the stored objects of ``keys`` (see the module)."""
    if isinstance(table, MapTable):
        _filter_map(table, keys, keep)
        return
    live, dirty = table.live, table.dirty
    cold = [k for k in keys if k not in live]
    for key in keys:
        if key in live:
            stored = live[key]
            kept = keep(stored)
            if kept is None:
                table.pop(key, None)
            elif kept is not stored:
                live[key] = kept
                dirty.add(key)
    if not cold:
        return
    prefixes = [table.prefix(k) for k in cold]
    db = table.backend.db
    datas = db.get(prefixes)
    batch = table.backend.batch()
    loads, dumps = table.loads, table.dumps
    changed = False
    for rk, data in zip(prefixes, datas, strict=True):
        if data is None:
            continue
        stored = loads(data)
        kept = keep(stored)
        if kept is None:
            batch.delete(rk)
            changed = True
        elif kept is not stored:
            batch.put(rk, dumps(kept))
            changed = True
    if changed:
        db.write(batch)


def _filter_map(table: MapTable, keys: list[Any],
                keep: SnapshotFilter | Callable[[Any], Any]) -> None:
    for key in keys:
        held = table.live.get(key)
        if held is not None:
            kept = keep(held[0])
            if kept is None:
                table.pop(key, None)
            elif kept is not held[0]:
                table.live[key] = (kept, held[1])
            continue
        prefix = table.prefix(key)
        entries, old = table._stored(prefix)
        if not old:
            continue
        kept = keep(entries)
        if kept is entries:
            continue
        batch = table.backend.batch()
        table.put_entries(batch, prefix, kept or {}, old)
        table.backend.db.write(batch)
