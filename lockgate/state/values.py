"""Private copies of state values: what keeps ordinary Python code exactly-once.

User code mutates what it gets: ``acc = state.value(); acc["n"] += 1``, a
``reduce`` that does ``a[1] += b[1]; return a``. If the object the user holds
were the one in state, a change would reach a snapshot that a background thread
is still writing, or a record already emitted and waiting in an output batch,
and a job would silently count twice. So state has value semantics on every
backend (as Flink's RocksDB backend has, by serializing): what goes in is
copied, what comes out is copied, and the stored objects are never reachable
from user code.

Copies cost only for mutable values. Immutable ones (numbers, strings, bytes,
``None``, tuples and frozensets of them) are shared, so the fast path of a job
whose state holds numbers or tuples of numbers is a single type test.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from itertools import chain
from typing import Any

__all__ = ["private_copy", "immutable", "ATOMIC"]

ATOMIC: frozenset[type] = frozenset({
    int, float, str, bytes, bool, type(None), complex, range, type(Ellipsis),
})
"""Types whose values cannot change: shared, never copied."""


def immutable(value: Any) -> bool:
    """``value`` can never change: an atomic value, or a tuple of atomic values."""
    t = value.__class__
    return t in ATOMIC or (t is tuple and ATOMIC.issuperset(map(type, value)))


_TUPLES = {tuple}


def _rows_or_atomic(items: Collection[Any]) -> bool:
    """Every item is a tuple of atomic values (a row), or every item is
    atomic: told by type tests that run in C (``map``), the first item's
    type saying which to try (none for a container of dicts or lists)."""
    first = type(next(iter(items)))
    if first is tuple:
        return set(map(type, items)) == _TUPLES and ATOMIC.issuperset(
            map(type, chain.from_iterable(items)))
    return first in ATOMIC and ATOMIC.issuperset(map(type, items))


def private_copy(value: Any) -> Any:
    """A copy of ``value`` that shares nothing mutable with it.

    Plain data (dicts, lists, sets, tuples of them) is copied by a type
    dispatch that is several times faster than :func:`copy.deepcopy`; other
    objects (``allow_pickle`` state of user classes) fall back to
    ``copy.deepcopy``. Immutable values are returned as they are."""
    t = type(value)
    if t in ATOMIC:
        return value
    # a container of more than a few items (up to 4, copied item by item:
    # fewer steps), all rows or all atomic, is copied shallow
    if t is dict:
        if len(value) > 4 and _rows_or_atomic(value.values()):
            return dict(value)
        out = dict(value)
        for k, v in out.items():
            if type(v) not in ATOMIC:
                out[k] = private_copy(v)
        return out
    if t is list:
        if len(value) > 4 and _rows_or_atomic(value):
            return list(value)
        return [v if type(v) in ATOMIC else private_copy(v) for v in value]
    if t is tuple:
        for v in value:
            if type(v) not in ATOMIC:
                return tuple([private_copy(x) for x in value])
        return value
    if t is set:
        return set(value)  # elements are hashable: immutable for built-in types
    if t is frozenset:
        return value
    if t is bytearray:
        return bytearray(value)
    return copy.deepcopy(value)
