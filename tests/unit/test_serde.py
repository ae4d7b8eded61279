"""State values round-trip exactly; nothing executes code on load without opt-in."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from collections import namedtuple

import pytest

from lockgate.state.serde import StateSerializationError, StateSerializer, key_bytes


def random_value(rng: random.Random, depth: int = 0):
    leaves = [
        lambda: rng.randint(-2**63, 2**63 - 1),
        lambda: rng.randint(-2**200, 2**200),
        lambda: rng.random(),
        lambda: rng.choice([None, True, False]),
        lambda: "".join(rng.choice("aé,[\"\x00") for _ in range(rng.randrange(5))),
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(4))),
        lambda: dt.datetime(2026, 11, 22, 18, rng.randrange(60)),
        lambda: dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        lambda: dt.date(2020, 2, 29),
        lambda: dt.timedelta(days=-1, microseconds=5),
        lambda: decimal.Decimal("3.14159"),
    ]
    if depth >= 3 or rng.random() < 0.4:
        return rng.choice(leaves)()
    n = rng.randrange(4)
    kind = rng.randrange(5)
    if kind == 0:
        return [random_value(rng, depth + 1) for _ in range(n)]
    if kind == 1:
        return tuple(random_value(rng, depth + 1) for _ in range(n))
    if kind == 2:
        return {rng.choice([rng.randint(0, 9), "k", (1, "t"), None]): random_value(rng, depth + 1)
                for _ in range(n)}
    if kind == 3:
        return {rng.randint(0, 100) for _ in range(n)}
    return frozenset((rng.randint(0, 5), "x") for _ in range(n))


def same(a, b) -> bool:
    """Equal, and of exactly the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(k1, k2) and same(a[k1], b[k2])
                                          for k1, k2 in zip(a, b, strict=True))
    return a == b


def test_random_values_round_trip_exactly():
    rng = random.Random(11)
    s = StateSerializer()
    for _ in range(2000):
        v = random_value(rng)
        assert same(s.loads(s.dumps(v)), v), v


def test_tuple_int_and_bool_keep_their_types():
    s = StateSerializer()
    v = {(1, 2): [(3,), True, 1, 1.0]}
    back = s.loads(s.dumps(v))
    assert same(back, v)


class Point:
    def __init__(self, x):
        self.x = x


def test_arbitrary_objects_need_the_pickle_opt_in():
    with pytest.raises(StateSerializationError, match="Point.*allow_pickle=True"):
        StateSerializer().dumps(Point(1))
    Pair = namedtuple("Pair", "a b")
    with pytest.raises(StateSerializationError, match="Pair"):
        StateSerializer().dumps(Pair(1, 2))
    data = StateSerializer(allow_pickle=True).dumps([Point(3)])
    assert StateSerializer(allow_pickle=True).loads(data)[0].x == 3
    with pytest.raises(StateSerializationError, match="execute code"):
        StateSerializer().loads(data)


def test_key_bytes_are_canonical_and_never_pickle():
    assert key_bytes((1, "a")) == key_bytes((1, "a"))
    assert key_bytes(1) != key_bytes(True) != key_bytes(1.0)
    with pytest.raises(StateSerializationError):
        key_bytes(Point(1))


def test_nested_values_encode_as_msgpack_packb_would_even_after_a_failure():
    """The packers of nested values are made once and reused: the bytes are
    those of a fresh ``msgpack.packb`` at every depth (key groups hash them),
    and a value that fails half-way leaves nothing behind for the next one."""
    import msgpack

    s = StateSerializer()

    def fresh(obj):  # the encoding with a new packer for every nested value
        return msgpack.packb(obj, default=lambda o: fresh_default(o), strict_types=True,
                             use_bin_type=True)

    def fresh_default(o):
        if type(o) is tuple:
            return msgpack.ExtType(1, fresh(list(o)))
        return s._default(o)

    rng = random.Random(3)
    values = [random_value(rng) for _ in range(300)] + [((1, (2, (3, "x"))), [(4,)])]
    for v in values:
        if not any(type(x) in (set, frozenset) for x in _walk(v)):
            assert s.dumps(v) == fresh(v), v
    for bad in [(1, (2, Point(1))), [(1, Point(2))], {(1,): (Point(3),)}]:
        with pytest.raises(StateSerializationError):
            s.dumps(bad)
        for v in values[:50]:
            assert same(s.loads(s.dumps(v)), v), v


def _walk(v):
    yield v
    if isinstance(v, list | tuple | set | frozenset):
        for x in v:
            yield from _walk(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _walk(k)
            yield from _walk(x)
