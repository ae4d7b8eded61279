"""The references of ``queries_more.py``: each query in plain Python over the
whole input, as a list of result records."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from benchmarks.nexmark.generator import (
    A_CATEGORY,
    A_EXPIRES,
    A_ID,
    A_INITIAL,
    A_ITEM,
    A_RESERVE,
    A_SELLER,
    A_TIME,
    B_AUCTION,
    B_BIDDER,
    B_CHANNEL,
    B_EXTRA,
    B_PRICE,
    B_TIME,
    B_URL,
)
from benchmarks.nexmark.queries_more import (
    CHANNEL_ID,
    CHANNEL_IDS,
    DAY,
    LAST_AUCTIONS,
    SIDE_TABLE,
    day_and_minute,
    rank,
    side_value,
    split_index,
    time_of_day,
)

Events = list[tuple[Any, ...]]
Rows = list[tuple[Any, ...]]


def _bids(events: Events) -> Events:
    return [e for e in events if e[0] == "B"]


def _q9(events: Events, w: Any) -> Rows:
    bids = defaultdict(list)
    for b in _bids(events):
        bids[b[B_AUCTION]].append(b)
    rows = []
    for a in events:
        if a[0] != "A":
            continue
        open_ = [b for b in bids[a[A_ID]] if a[A_TIME] <= b[B_TIME] <= a[A_EXPIRES]]
        if not open_:
            continue
        best = max(open_, key=lambda b: (b[B_PRICE], -b[B_TIME], -b[B_BIDDER]))
        rows.append((a[A_ID], a[A_ITEM], a[A_INITIAL], a[A_RESERVE], a[A_TIME], a[A_EXPIRES],
                     a[A_SELLER], a[A_CATEGORY], best[B_BIDDER], best[B_PRICE], best[B_TIME],
                     a[A_EXPIRES]))
    return rows


def _q4(events: Events, w: Any) -> Rows:
    per_category = defaultdict(list)
    for r in _q9(events, w):
        per_category[r[7]].append((r[5], r[9]))  # expires, price
    rows = []
    for category, closed in per_category.items():
        closed.sort()
        total = n = 0
        for i, (expires, price) in enumerate(closed):
            total, n = total + price, n + 1
            if i + 1 == len(closed) or closed[i + 1][0] != expires:
                rows.append((category, total // n, expires))
    return rows


def _q6(events: Events, w: Any) -> Rows:
    per_seller = defaultdict(list)
    for r in _q9(events, w):
        per_seller[r[6]].append((r[10], r[0], r[9], r[5]))  # bid time, id, price, expires
    rows = []
    for seller, wins in per_seller.items():
        wins.sort()
        for i, (_, _, _, expires) in enumerate(wins):
            prices = [p for _, _, p, _ in wins[max(0, i - LAST_AUCTIONS):i + 1]]
            rows.append((seller, sum(prices) // len(prices), expires))
    return rows


def _q10(events: Events, w: Any) -> Rows:
    return [(b[B_AUCTION], b[B_BIDDER], b[B_PRICE], *day_and_minute(b[B_TIME]), b[B_TIME])
            for b in _bids(events)]


def _q11(events: Events, w: Any) -> Rows:
    times = defaultdict(list)
    for b in _bids(events):
        times[b[B_BIDDER]].append(b[B_TIME])
    rows = []
    for bidder, ts in times.items():
        ts.sort()
        start, last, n = ts[0], ts[0], 1
        for t in ts[1:]:
            if t <= last + w.size:  # touching windows merge
                last, n = max(last, t), n + 1
            else:
                rows.append((bidder, n, start, last + w.size))
                start, last, n = t, t, 1
        rows.append((bidder, n, start, last + w.size))
    return rows


def q12_on_clock(timed: list[tuple[tuple[Any, ...], int]], size: int) -> Rows:
    """q12 when bid ``b`` was processed at ``t`` for each ``(b, t)`` of
    ``timed``: per bidder and tumbling window of ``size`` ms, the bids."""
    counts: Counter[tuple[Any, int]] = Counter()
    for b, t in timed:
        counts[(b[B_BIDDER], t - t % size)] += 1
    return [(bidder, n, start, start + size) for (bidder, start), n in counts.items()]


def _q13(events: Events, w: Any) -> Rows:
    return [(b[B_AUCTION], b[B_BIDDER], b[B_PRICE], side_value(b[B_AUCTION] % SIDE_TABLE),
             b[B_TIME]) for b in _bids(events)]


def _q14(events: Events, w: Any) -> Rows:
    return [(b[B_AUCTION], b[B_BIDDER], 0.908 * b[B_PRICE], time_of_day(b[B_TIME]),
             b[B_EXTRA].count("c"), b[B_TIME])
            for b in _bids(events) if 1_000_000 < 0.908 * b[B_PRICE] < 50_000_000]


def _daily(bids: Events) -> tuple[Any, ...]:
    per = [[b for b in bids if rank(b[B_PRICE]) == r] for r in range(3)]
    return (len(bids), *map(len, per), len({b[B_BIDDER] for b in bids}),
            *(len({b[B_BIDDER] for b in p}) for p in per), len({b[B_AUCTION] for b in bids}),
            *(len({b[B_AUCTION] for b in p}) for p in per))


def _by(events: Events, key: Any) -> dict[Any, Events]:
    groups = defaultdict(list)
    for b in _bids(events):
        groups[(key(b), b[B_TIME] - b[B_TIME] % DAY)].append(b)
    return groups


def _q15(events: Events, w: Any) -> Rows:
    return [(day_and_minute(start)[0], *_daily(bids), start + DAY)
            for (_, start), bids in _by(events, lambda b: None).items()]


def _q16(events: Events, w: Any) -> Rows:
    return [(channel, day_and_minute(start)[0], *_daily(bids),
             day_and_minute(max(b[B_TIME] for b in bids))[1], start + DAY)
            for (channel, start), bids in _by(events, lambda b: b[B_CHANNEL]).items()]


def _q17(events: Events, w: Any) -> Rows:
    rows = []
    for (auction, start), bids in _by(events, lambda b: b[B_AUCTION]).items():
        prices = [b[B_PRICE] for b in bids]
        ranks = [sum(1 for p in prices if rank(p) == r) for r in range(3)]
        rows.append((auction, day_and_minute(start)[0], len(prices), *ranks, min(prices),
                     max(prices), sum(prices) // len(prices), sum(prices), start + DAY))
    return rows


def _q18(events: Events, w: Any) -> Rows:
    last: dict[Any, tuple[Any, ...]] = {}
    for b in _bids(events):
        bid = (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_TIME])
        key = (b[B_BIDDER], b[B_AUCTION])
        kept = last.get(key)
        if kept is None or (bid[3], bid[2]) > (kept[3], kept[2]):
            last[key] = bid
    return list(last.values())


def _q19(events: Events, w: Any) -> Rows:
    per = defaultdict(list)
    for b in _bids(events):
        per[b[B_AUCTION]].append((b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_TIME]))
    rows = []
    for bids in per.values():
        top = sorted(bids, key=lambda x: (-x[2], x[3], x[1]))[:10]
        rows += [(*b, n + 1, b[3]) for n, b in enumerate(top)]
    return rows


def _q20(events: Events, w: Any) -> Rows:
    auctions = {a[A_ID]: (a[A_ITEM], a[A_INITIAL], a[A_RESERVE], a[A_TIME], a[A_EXPIRES],
                          a[A_SELLER], a[A_CATEGORY])
                for a in events if a[0] == "A" and a[A_CATEGORY] == 10}
    return [(b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL], b[B_TIME], *a,
             max(b[B_TIME], a[3]))
            for b in _bids(events) for a in [auctions.get(b[B_AUCTION])] if a is not None]


def _q21(events: Events, w: Any) -> Rows:
    rows = []
    for b in _bids(events):
        cid = CHANNEL_IDS.get(b[B_CHANNEL].lower())
        if cid is None:
            m = CHANNEL_ID.search(b[B_URL])
            cid = m.group(2) if m else None
        if cid is not None:
            rows.append((b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL], cid, b[B_TIME]))
    return rows


def _q22(events: Events, w: Any) -> Rows:
    return [(b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL],
             *(split_index(b[B_URL], "/", i) for i in (3, 4, 5)), b[B_TIME])
            for b in _bids(events)]


REFERENCES = {name[1:]: fn for name, fn in list(globals().items())
              if name.startswith("_q") and callable(fn)}
