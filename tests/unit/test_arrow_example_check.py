"""The Arrow example's check (tests/integration/test_arrow.py) pairs each
user with its own totals, whatever order the part files' rows come in.

Its two failures with one user at 299 orders instead of 300 (user 0, the only
one with 300) were the check's: it ran one group-by per column and zipped
the columns, and Arrow's threaded group-by gives its groups in the order it
meets them, which for a table of several part files (chunks) varies from
call to call (about one call in 300 on the loaded machine), so user 0 got
another user's 299. The committed output was right each time."""

from __future__ import annotations

import pyarrow as pa

from tests.integration.arrow_diagnosis import check_current, latest_per_user


def _parts(n: int) -> tuple[pa.Table, pa.Table]:
    """The example's final upsert rows, split into two part files by user parity."""
    rows = [{"user": u, "orders": len(range(100 + u, n + 1, 100)),
             "total": sum(range(100 + u, n + 1, 100)) / 100} for u in range(100)]
    even = pa.Table.from_pylist([r for r in rows if r["user"] % 2 == 0])
    odd = pa.Table.from_pylist([r for r in rows if r["user"] % 2 == 1])
    return even, odd


def test_a_column_per_group_by_pairs_users_with_others_values() -> None:
    """Deterministically, what threads did by chance: the same rows in
    another chunk order give the groups in another order, so zipping the keys
    of one group-by with the values of another mismatches them."""
    even, odd = _parts(30_000)
    a = pa.concat_tables([even, odd]).group_by("user", use_threads=False).aggregate(
        [("orders", "max")])
    b = pa.concat_tables([odd, even]).group_by("user", use_threads=False).aggregate(
        [("orders", "max")])
    zipped = dict(zip(a.column("user").to_pylist(), b.column("orders_max").to_pylist(),
                      strict=True))
    assert zipped[0] == 299  # user 0 has 300 orders: the failure's numbers


def test_latest_per_user_is_exact_in_any_chunk_order() -> None:
    n = 30_000
    even, odd = _parts(n)
    for table in (pa.concat_tables([even, odd]), pa.concat_tables([odd, even])):
        for _ in range(50):  # the old check failed about once in 300 calls, threaded
            current = latest_per_user(table)
            assert check_current(current, n) is None, current
        assert current[0][0] == 300 and current[7][0] == 299
