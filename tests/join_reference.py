"""Joins computed in plain Python over a whole input: the reference the join
tests compare Lockgate's output with. Written apart from
``lockgate/runtime/interval_join.py``, from the rules as documented (Flink's
``IntervalJoinOperator``), declaratively: which pairs exist, not how a
buffer evolves.

Interval join: left ``l`` and right ``r`` of equal keys pair when ``l.ts +
lower <= r.ts <= l.ts + upper``, neither was late when it arrived (``ts <
watermark``), and the one that came first had not been cleaned up when the
second came: left ``l`` is kept until the watermark reaches ``l.ts + upper``
(``l.ts`` if ``upper <= 0``), right ``r`` until it reaches ``r.ts - lower``
(``r.ts`` if ``lower >= 0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MIN = float("-inf")


def interval_join(events: list[tuple[int, Any, float]], *, key_of: Callable[[int, Any], Any],
                  ts_of: Callable[[int, Any], int], lower: int,
                  upper: int) -> tuple[list[tuple[Any, Any]], list[Any], list[Any]]:
    """``events``: ``(side, record, watermark when it arrives)`` in arrival
    order (side 0 left, 1 right; watermarks non-decreasing). Returns the
    pairs ``(left, right)`` and the late records of each side."""
    late: tuple[list[Any], list[Any]] = ([], [])
    kept: list[tuple[int, int, Any, float]] = []  # (position, side, record, wm on arrival)
    for pos, (side, r, wm) in enumerate(events):
        if wm != MIN and ts_of(side, r) < wm:
            late[side].append(r)
        else:
            kept.append((pos, side, r, wm))

    def cleanup(side: int, ts: int) -> int:
        if side == 0:
            return ts + upper if upper > 0 else ts
        return ts - lower if lower < 0 else ts

    pairs = []
    lefts = [k for k in kept if k[1] == 0]
    rights = [k for k in kept if k[1] == 1]
    for lp, _, lr, lwm in lefts:
        lts = ts_of(0, lr)
        for rp, _, rr, rwm in rights:
            rts = ts_of(1, rr)
            if key_of(0, lr) != key_of(1, rr) or not lts + lower <= rts <= lts + upper:
                continue
            if lp < rp:  # the left came first: still kept when the right came?
                alive = cleanup(0, lts) > rwm
            else:
                alive = cleanup(1, rts) > lwm
            if alive:
                pairs.append((lr, rr))
    return pairs, late[0], late[1]
