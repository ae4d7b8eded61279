"""Key groups (Flink's unit of keyed state and of rescaling).

``key -> stable hash of its canonical bytes -> key group in [0, max_parallelism)``;
task ``i`` of ``p`` owns key groups ``[ceil(i*m/p), ceil((i+1)*m/p))``. Python's
``hash()`` is never used: it differs between processes.
"""

from __future__ import annotations

import zlib
from itertools import chain
from typing import Any

from lockgate.state.serde import key_bytes

DEFAULT_MAX_PARALLELISM = 128
_CACHE_LIMIT = 1_000_000


def _fmix32(h: int) -> int:
    """MurmurHash3's finalizer: spreads CRC-32's bits over the whole word."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


fmix32 = _fmix32


def key_group_for_key(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``: stable across processes, machines and versions."""
    return _fmix32(zlib.crc32(key_bytes(key))) % max_parallelism


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    if parallelism < 1 or parallelism > max_parallelism:
        raise ValueError(
            f"parallelism {parallelism} must be in 1..max_parallelism ({max_parallelism}); "
            "max_parallelism fixes the number of key groups and so the highest parallelism"
        )


def key_group_range(task_index: int, parallelism: int, max_parallelism: int) -> range:
    """Key groups owned by task ``task_index`` of ``parallelism``."""
    check_parallelism(parallelism, max_parallelism)
    m, p, i = max_parallelism, parallelism, task_index
    return range((i * m + p - 1) // p, ((i + 1) * m + p - 1) // p)


def task_for_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The task that owns ``key_group`` (agrees with ``key_group_range``)."""
    return key_group * parallelism // max_parallelism


class KeyGroupAssigner:
    """Computes key groups with a cache for int and str keys (the common case)."""

    def __init__(self, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self._ints: dict[int, int] = {}
        self._strs: dict[str, int] = {}
        self._targets: dict[int, dict[Any, int]] = {}

    def key_group(self, key: Any) -> int:
        t = type(key)
        if t is int:
            cache: dict[Any, int] = self._ints
        elif t is str:
            cache = self._strs
        else:
            return key_group_for_key(key, self.max_parallelism)
        kg = cache.get(key)
        if kg is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            kg = cache[key] = key_group_for_key(key, self.max_parallelism)
        return kg

    def route(self, keys: list[Any], parallelism: int) -> list[int]:
        """Target task of each key. Batches of int and str keys (never equal to
        each other), or of tuples of them (a composite key), take a C-speed
        path: one dict lookup per key through ``map``. (Keys equal as dict
        keys must have one key group: ``1``, ``1.0`` and ``True`` are equal
        but encode differently, so only these types share a cache.)"""
        types = set(map(type, keys))
        if types <= _CACHEABLE or types == _TUPLE and set(
                map(type, chain.from_iterable(keys))) <= _CACHEABLE:
            cache = self._targets.get(parallelism)
            if cache is None or len(cache) >= _CACHE_LIMIT:
                cache = self._targets[parallelism] = {}
            try:  # every key seen before: one lookup each, no pass to find the misses
                return list(map(cache.__getitem__, keys))
            except KeyError:
                pass
            # the new keys, each once however often the batch has it, found
            # at C speed; then the lookups again
            m = self.max_parallelism
            for k in set(keys).difference(cache):
                cache[k] = key_group_for_key(k, m) * parallelism // m
            return list(map(cache.__getitem__, keys))
        m, kg_of = self.max_parallelism, self.key_group
        return [kg_of(k) * parallelism // m for k in keys]


_CACHEABLE = frozenset((int, str))
_TUPLE = {tuple}
