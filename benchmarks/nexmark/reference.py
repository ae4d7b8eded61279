"""The Nexmark queries' results computed in plain Python over the whole input
(no Lockgate): the references the correctness test compares each query's
output with, as multisets of records."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from benchmarks.nexmark.generator import (
    A_CATEGORY,
    A_ID,
    A_SELLER,
    A_TIME,
    B_AUCTION,
    B_BIDDER,
    B_PRICE,
    B_TIME,
    P_CITY,
    P_ID,
    P_NAME,
    P_STATE,
    P_TIME,
)
from benchmarks.nexmark.queries import LOCAL_STATES, Windows

Events = list[tuple[Any, ...]]


def reference(query: str, events: Events, w: Windows) -> Counter[tuple[Any, ...]]:
    from benchmarks.nexmark.reference_more import REFERENCES

    fn = REFERENCES.get(query) or globals()[f"_{query}"]
    rows: list[tuple[Any, ...]] = fn(events, w)
    return Counter(rows)


def _bids(events: Events) -> Events:
    return [e for e in events if e[0] == "B"]


def _q0(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    return [(b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_TIME]) for b in _bids(events)]


def _q1(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    return [(b[B_AUCTION], b[B_BIDDER], 0.908 * b[B_PRICE], b[B_TIME]) for b in _bids(events)]


def _q2(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    return [(b[B_AUCTION], b[B_PRICE], b[B_TIME]) for b in _bids(events)
            if b[B_AUCTION] % 123 == 0]


def _q3(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    people = {e[P_ID]: e for e in events if e[0] == "P" and e[P_STATE] in LOCAL_STATES}
    return [(p[P_NAME], p[P_CITY], p[P_STATE], a[A_ID], max(p[P_TIME], a[A_TIME]))
            for a in events if a[0] == "A" and a[A_CATEGORY] == 10
            for p in [people.get(a[A_SELLER])] if p is not None]


def _windows_of(t: int, size: int, slide: int) -> list[int]:
    """Starts of the sliding windows ``[s, s + size)`` holding ``t``."""
    last = t - t % slide
    return list(range(last, t - size, -slide))


def _q5(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for b in _bids(events):
        for start in _windows_of(b[B_TIME], w.size, w.slide):
            counts[start][b[B_AUCTION]] += 1
    rows = []
    for start, per_auction in counts.items():
        top = max(per_auction.values())
        rows += [(start, start + w.size, a, n) for a, n in per_auction.items() if n == top]
    return rows


def _q7(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    per_window: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for b in _bids(events):
        per_window[b[B_TIME] - b[B_TIME] % w.size].append(b)
    rows = []
    for start, bids in per_window.items():
        top = max(b[B_PRICE] for b in bids)
        rows += [(b[B_AUCTION], b[B_PRICE], b[B_BIDDER], b[B_TIME], start + w.size)
                 for b in bids if b[B_PRICE] == top]
    return rows


def _q8(events: Events, w: Windows) -> list[tuple[Any, ...]]:
    size = w.size
    sellers = {(a[A_SELLER], a[A_TIME] - a[A_TIME] % size) for a in events if a[0] == "A"}
    return [(p[P_ID], p[P_NAME], start, start + size) for p in events if p[0] == "P"
            for start in [p[P_TIME] - p[P_TIME] % size] if (p[P_ID], start) in sellers]
