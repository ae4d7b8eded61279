"""Key-group assignment: stable hashing, ranges and routing agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lockgate.state.keygroups import (
    KeyGroupAssigner,
    check_parallelism,
    key_group_for_key,
    key_group_range,
    task_for_key_group,
)


def test_key_groups_are_stable_constants():
    # A change of these numbers would make every existing checkpoint unreadable.
    got = [key_group_for_key(k, 128) for k in (0, 1, 2, "a", "hello", (1, "x"), 2**70)]
    assert got == EXPECTED


EXPECTED = [23, 20, 58, 16, 55, 61, 6]


def test_key_groups_equal_in_another_process():
    keys = [0, 1, 2, "a", "hello", (1, "x"), 2**70, None, 1.5, b"\x00"]
    code = ("from lockgate.state.keygroups import key_group_for_key as k;"
            f"print([k(x, 128) for x in {keys!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "12345"}, check=True).stdout
    assert out.strip() == str([key_group_for_key(x, 128) for x in keys])


@pytest.mark.parametrize("m", [1, 7, 128])
def test_ranges_partition_key_groups_and_agree_with_owner(m):
    for p in range(1, m + 1):
        covered = []
        for i in range(p):
            r = key_group_range(i, p, m)
            covered += list(r)
            assert all(task_for_key_group(kg, p, m) == i for kg in r)
        assert covered == list(range(m))


def test_parallelism_limits():
    check_parallelism(128, 128)
    with pytest.raises(ValueError, match="max_parallelism"):
        check_parallelism(129, 128)
    with pytest.raises(ValueError):
        key_group_range(0, 0, 128)


def test_route_matches_key_group_owner_for_every_key_type():
    a = KeyGroupAssigner(128)
    keys = list(range(500)) + [f"k{i}" for i in range(200)] + [(1, 2), None, 2.5, True, 1]
    for p in (1, 2, 3, 5, 128):
        expected = [task_for_key_group(key_group_for_key(k, 128), p, 128) for k in keys]
        assert a.route(keys, p) == expected
        assert a.route(keys, p) == expected  # cached path
        ints = list(range(1000))
        assert a.route(ints, p) == [
            task_for_key_group(key_group_for_key(k, 128), p, 128) for k in ints
        ]
        # seen and new keys mixed, the new ones more than once in the batch
        mixed = [3, 10**6 + p, 3, 10**6 + p, "k1", f"new{p}", f"new{p}", 999]
        assert a.route(mixed, p) == [
            task_for_key_group(key_group_for_key(k, 128), p, 128) for k in mixed
        ]


def test_true_and_one_are_different_keys_for_routing():
    a = KeyGroupAssigner(128)
    assert a.key_group(1) == key_group_for_key(1, 128)
    assert a.key_group(True) == key_group_for_key(True, 128)
    assert a.route([True], 4) == [task_for_key_group(key_group_for_key(True, 128), 4, 128)]


def test_keys_spread_over_key_groups():
    counts = [0] * 128
    for k in range(128 * 100):
        counts[key_group_for_key(k, 128)] += 1
    assert min(counts) > 50 and max(counts) < 160


def test_composite_keys_route_by_their_bytes_through_the_cache():
    """Tuples of ints and strs share the cache; a tuple holding an equal
    float, bool or nested tuple is routed by its own bytes, never by a cached
    entry of an equal key."""
    a = KeyGroupAssigner(128)
    tuples = [(i, f"s{i % 7}") for i in range(300)] + [(i,) for i in range(50)] + [()]
    odd = [(1.0, "s1"), (True, "s1"), ((1,), "s1"), (1, 1.0), (True,), (1.0,)]
    for p in (2, 3, 7):
        for keys in (tuples, tuples, odd + tuples, tuples + odd):
            assert a.route(keys, p) == [
                task_for_key_group(key_group_for_key(k, 128), p, 128) for k in keys]
    # the float key's own group, not that of the equal int key seen before
    assert a.route([(1, "s1")], 128) == [key_group_for_key((1, "s1"), 128)]
    assert a.route([(1.0, "s1")], 128) == [key_group_for_key((1.0, "s1"), 128)]
