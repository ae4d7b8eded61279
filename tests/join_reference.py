"""Joins computed in plain Python over a whole input: the reference the join
tests compare Lockgate's output with. Written apart from
``lockgate/runtime/interval_join.py``, from the rules as documented,
declaratively: which pairs exist, not how a buffer evolves.

Interval join: a record is late when its timestamp is below its own input's
watermark when it arrives (``ts < watermark``); left ``l`` and right ``r``
of equal keys pair when ``l.ts + lower <= r.ts <= l.ts + upper`` and
neither was late, whichever came first (the first is kept until the
watermark passes the last timestamp a record of the other side that is not
late could match it with).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MIN = float("-inf")


def interval_join(events: list[tuple[int, Any, float]], *, key_of: Callable[[int, Any], Any],
                  ts_of: Callable[[int, Any], int], lower: int,
                  upper: int) -> tuple[list[tuple[Any, Any]], list[Any], list[Any]]:
    """``events``: ``(side, record, its side's watermark when it arrives)``
    in arrival order (side 0 left, 1 right; each side's watermarks
    non-decreasing). Returns the pairs ``(left, right)`` and the late
    records of each side."""
    late: tuple[list[Any], list[Any]] = ([], [])
    kept: tuple[list[Any], list[Any]] = ([], [])
    for side, r, wm in events:
        (late if wm != MIN and ts_of(side, r) < wm else kept)[side].append(r)
    pairs = []
    for lr in kept[0]:
        lts = ts_of(0, lr)
        for rr in kept[1]:
            if key_of(0, lr) == key_of(1, rr) and lts + lower <= ts_of(1, rr) <= lts + upper:
                pairs.append((lr, rr))
    return pairs, late[0], late[1]
