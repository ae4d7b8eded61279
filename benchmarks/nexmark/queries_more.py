"""More Nexmark queries (Flink's ``nexmark-flink`` SQL, on the DataStream API).

* q4   average price per category: per category, the average of the winning
  prices (q9's) of the auctions closed so far, a new row each time auctions
  of it close (the event time they close at ends the row). Flink's SQL keeps
  one average per category and updates it (retract and insert) on every
  bid; the last row of each category here is its final value.
* q6   average selling price per seller: for each auction with a winning bid,
  the average price of it and the seller's 10 auctions before it, ordered
  by the time of the winning bid (``ROWS BETWEEN 10 PRECEDING AND CURRENT
  ROW``: 11 auctions, though the SQL's comment says 10). A row is emitted
  once no auction of the seller that could still come before it is open,
  so each row is final (Flink's SQL cannot run this query: its OVER window
  does not take retractions); it ends with its auction's expiry.
* q9   winning bids: each auction with its highest bid made while it was open
  (``date_time <= bid time <= expires``; the earliest of equal prices, then
  the lowest bidder), known when the auction expires.
* q10  log to file system: every bid with its day and ``HH:mm`` (``dt``,
  ``hm``), for a partitioned file sink (the job writes it through the
  exactly-once ``FileSink``).
* q11  user sessions: per bidder, the bids of each session (event-time
  session windows, the gap of the ``Windows``' size).
* q12  processing-time windows: per bidder, the bids of each tumbling window
  of the task's clock (the ``Windows``' size; Flink's: 10 s), as
  ``(bidder, bids, start, end)``. The windows still open when the input ends
  fire then (a trigger: the window's end on the clock, or the end of input),
  so every bid is counted once; a run's result depends on when each bid was
  processed, so the check is by invariant (``tests/integration/test_nexmark.py``)
  and, on a clock the test sets, record by record.
* q13  bounded side input join: every bid with the value of its auction in a
  side table of 10,000 entries (the table is in every task, as Flink's
  lookup join of a bounded file).
* q14  calculation: bids of 1,000,000 to 50,000,000 euros, with the time of
  day of the bid and a count of the ``c`` in its extra field.
* q15  bidding statistics per day: bids, bidders and auctions by price rank.
* q16  channel statistics per day and channel: the same per channel, with the
  last minute of the day that saw a bid.
* q17  auction statistics per day and auction: bids by rank, minimum,
  maximum, average and sum of prices.
* q18  last bid of each bidder on each auction.
* q19  the ten highest bids of each auction.
* q20  bids of auctions in category 10, with the auction (an unbounded join).
* q21  every bid with its channel's id: 0-3 for the four hot channels, else
  the ``channel_id`` parameter of its URL (bids with neither are left out).
* q22  every bid with the first three directories of its URL
  (``SPLIT_INDEX(url, '/', 3..5)``).

The daily queries (q15-q17) use event-time tumbling windows of a day, and
q18/q19 emit their result once the input ended (Flink's versions emit
updates and retract them; a final result is what a bounded run of theirs
ends with).

Every output record ends with its result time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
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
from benchmarks.nexmark.queries import Count
from lockgate import (
    END_OF_TIME,
    AggregateFunction,
    DataStream,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    ValueStateDescriptor,
)
from lockgate.api.connected import CoProcessFunction
from lockgate.api.triggers import Trigger, TriggerResult
from lockgate.state.backend import ListStateDescriptor

DAY = 86_400_000
SIDE_TABLE = 10_000
CHANNEL_IDS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
CHANNEL_ID = re.compile(r"(&|^)channel_id=([^&]*)")


def _is_bid(e: tuple[Any, ...]) -> bool:
    return e[0] == "B"


def _bids(events: DataStream[Any], uid: str) -> DataStream[Any]:
    return events.filter(_is_bid, uid=uid)


# ---------------------------------------------------------------- q9
class WinningBid(CoProcessFunction):
    """Auctions (input 1) and bids (input 2) keyed by auction: the best bid
    within ``[date_time, expires)``, emitted at the auction's expiry."""

    def open(self, ctx: Any) -> None:
        self.auction = ctx.get_state(ValueStateDescriptor("auction"))
        self.best = ctx.get_state(ValueStateDescriptor("best"))
        self.early = ctx.get_list_state(ListStateDescriptor("early"))
        self.closed = ctx.get_state(ValueStateDescriptor("closed"))

    def process_element1(self, a: Any, ctx: Any) -> Iterable[Any] | None:
        auction = (a[A_ID], a[A_ITEM], a[A_INITIAL], a[A_RESERVE], a[A_TIME], a[A_EXPIRES],
                   a[A_SELLER], a[A_CATEGORY])
        self.auction.update(auction)
        ctx.timer_service.register_event_time_timer(a[A_EXPIRES])
        for bid in self.early.get():
            self._offer(auction, bid)
        self.early.clear()
        return None

    def process_element2(self, b: Any, ctx: Any) -> Iterable[Any] | None:
        bid = (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_TIME])
        auction = self.auction.value()
        if auction is None:
            if self.closed.value() is None:
                self.early.add(bid)  # the bid's auction is not seen yet
        else:
            self._offer(auction, bid)
        return None

    def _offer(self, auction: tuple[Any, ...], bid: tuple[Any, ...]) -> None:
        if not auction[4] <= bid[3] <= auction[5]:
            return
        best = self.best.value()
        if best is None or (bid[2], -bid[3], -bid[1]) > (best[2], -best[3], -best[1]):
            self.best.update(bid)

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        auction, best = self.auction.value(), self.best.value()
        self.auction.clear()
        self.best.clear()
        self.closed.update(True)  # bids after the end are dropped
        if auction is None or best is None:
            return None
        return [(*auction, best[1], best[2], best[3], auction[5])]


def _winning_bids(events: DataStream[Any], q: str) -> DataStream[Any]:
    """q9's rows: ``(id, item, initial, reserve, date_time, expires, seller,
    category, bidder, price, bid time, expires)``."""
    auctions = events.filter(lambda e: e[0] == "A", uid=f"{q}.auctions")
    uid = "q9" if q == "q9" else f"{q}.winning"
    return (auctions.key_by(lambda a: a[A_ID])
                    .connect(_bids(events, f"{q}.bids").key_by(lambda b: b[B_AUCTION]))
                    .process(WinningBid(), uid=uid))


def q9(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return _winning_bids(events, "q9")


# ---------------------------------------------------------------- q4
class CategoryAverage(KeyedProcessFunction):
    """q9's rows keyed by category: at each expiry time, the average of the
    winning prices of every auction of the category closed by then. Rows of
    auctions that close later (from upstream tasks ahead of the others) wait
    in ``pending`` until the watermark reaches their expiry."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total"))
        self.pending = ctx.get_state(ValueStateDescriptor("pending"))

    def process_element(self, r: Any, ctx: Any) -> Iterable[Any] | None:
        expires, price = r[5], r[9]
        pending = dict(self.pending.value() or {})
        s, n = pending.get(expires, (0, 0))
        pending[expires] = (s + price, n + 1)
        self.pending.update(pending)
        ctx.timer_service.register_event_time_timer(expires)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        pending = self.pending.value() or {}
        s, n = self.total.value() or (0, 0)
        for t in [t for t in pending if t <= timestamp]:
            ps, pn = pending.pop(t)
            s, n = s + ps, n + pn
        self.total.update((s, n))
        self.pending.update(pending or None)
        return [(ctx.current_key, s // n, timestamp)]


def q4(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (_winning_bids(events, "q4").key_by(lambda r: r[7])
            .process(CategoryAverage(), uid="q4"))


# ---------------------------------------------------------------- q6
LAST_AUCTIONS = 10
"""q6's window: the current auction and this many before it."""


class SellerAverage(CoProcessFunction):
    """Auctions (input 1) and q9's rows (input 2) keyed by seller. A winning
    row waits (``pending``) until every auction of the seller that started
    at or before its winning bid has closed: then no row can still come
    before it in the order of the winning bids' times (an auction not seen
    yet starts after the watermark). Rows leave in that order, each with the
    average of its price and the ``LAST_AUCTIONS`` prices before it."""

    def open(self, ctx: Any) -> None:
        self.open_ = ctx.get_state(ValueStateDescriptor("open"))  # {id: (start, expires)}
        self.pending = ctx.get_state(ValueStateDescriptor("pending"))  # [(bid time, id, ...)]
        self.recent = ctx.get_state(ValueStateDescriptor("recent"))  # the last prices

    def process_element1(self, a: Any, ctx: Any) -> Iterable[Any] | None:
        opened = dict(self.open_.value() or {})
        opened[a[A_ID]] = (a[A_TIME], a[A_EXPIRES])
        self.open_.update(opened)
        ctx.timer_service.register_event_time_timer(a[A_EXPIRES])
        return None

    def process_element2(self, r: Any, ctx: Any) -> Iterable[Any] | None:
        pending = list(self.pending.value() or [])
        pending.append((r[10], r[0], r[9], r[5]))  # bid time, auction, price, expires
        self.pending.update(pending)
        ctx.timer_service.register_event_time_timer(r[10])
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        opened = self.open_.value() or {}
        left = {k: v for k, v in opened.items() if v[1] > timestamp}
        if len(left) != len(opened):
            self.open_.update(left or None)
        pending = sorted(self.pending.value() or [])
        first_open = min((start for start, _ in left.values()), default=None)
        ready = 0
        for bid_time, _, _, _ in pending:
            if bid_time > timestamp or (first_open is not None and first_open <= bid_time):
                break
            ready += 1
        if not ready:
            return None
        recent = list(self.recent.value() or [])
        out = []
        for _, _, price, expires in pending[:ready]:
            recent.append(price)
            out.append((ctx.current_key, sum(recent) // len(recent), expires))
            del recent[:-LAST_AUCTIONS]
        self.recent.update(recent)
        self.pending.update(pending[ready:] or None)
        return out


def q6(events: DataStream[Any], w: Any) -> DataStream[Any]:
    auctions = events.filter(lambda e: e[0] == "A", uid="q6.sellers")
    return (auctions.key_by(lambda a: a[A_SELLER])
                    .connect(_winning_bids(events, "q6").key_by(lambda r: r[6]))
                    .process(SellerAverage(), uid="q6"))


# ---------------------------------------------------------------- q10
def day_and_minute(t: int) -> tuple[str, str]:
    """``(YYYY-MM-DD, HH:mm)`` of a time in ms (UTC)."""
    import datetime as _dt

    d = _dt.datetime.fromtimestamp(t / 1000, _dt.UTC)
    return d.strftime("%Y-%m-%d"), d.strftime("%H:%M")


@functools.lru_cache(maxsize=4096)
def _of_minute(minute: int) -> tuple[str, str]:
    return day_and_minute(minute * 60_000)


def day_and_minute_of(t: int) -> tuple[str, str]:
    """:func:`day_and_minute`, remembered per minute (the date and time a
    query formats for every bid; the references call the plain function)."""
    return _of_minute(t // 60_000)


def _q10_row(b: tuple[Any, ...]) -> tuple[Any, ...]:
    dt, hm = day_and_minute_of(b[B_TIME])
    return (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], dt, hm, b[B_TIME])


def q10(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return _bids(events, "q10.bids").map(_q10_row, uid="q10")


# ---------------------------------------------------------------- q11
class SessionCount(ProcessWindowFunction):
    """``(bidder, bids, session start, session end)``."""

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        return [(key, len(elements), context.window.start, context.window.end)]


def q11(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (_bids(events, "q11.bids").map(lambda b: (b[B_BIDDER], b[B_TIME]), uid="q11.pairs")
            .key_by(lambda p: p[0])
            .window(EventTimeSessionWindows.with_gap(w.size), timestamp_of=lambda p: p[1])
            .process(SessionCount(), uid="q11"))


# ---------------------------------------------------------------- q12
class ClockOrEndOfInput(Trigger):
    """Fire and purge a processing-time window at its end on the clock, or
    at the end of the input, whichever comes first."""

    def on_element(self, element: Any, timestamp: int, window: Any, ctx: Any) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        ctx.register_event_time_timer(END_OF_TIME)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if time == window.max_timestamp() \
            else TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Any) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if time == END_OF_TIME else TriggerResult.CONTINUE


class BidCount(ProcessWindowFunction):
    """``(bidder, bids, window start, window end)``."""

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        return [(key, elements[0], context.window.start, context.window.end)]


def q12_bidders(batch: list[Any]) -> list[Any]:
    """The bidder of each bid: the one column q12 reads (the projection
    Flink's planner puts before the shuffle)."""
    return [e[B_BIDDER] for e in batch if e[0] == "B"]


def q12(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (events.map_batch(q12_bidders, uid="q12.bids").key_by(lambda b: b)
            .window(TumblingProcessingTimeWindows.of(w.size))
            .trigger(ClockOrEndOfInput())
            .aggregate(Count(), BidCount(), uid="q12"))


# ---------------------------------------------------------------- q13
def side_value(key: int) -> str:
    """The side table's value of ``key`` (a bounded table every task holds)."""
    return f"side-{key * 7919 % SIDE_TABLE}"


def q13(events: DataStream[Any], w: Any) -> DataStream[Any]:
    table = {k: side_value(k) for k in range(SIDE_TABLE)}
    return _bids(events, "q13.bids").map(
        lambda b: (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], table[b[B_AUCTION] % SIDE_TABLE],
                   b[B_TIME]), uid="q13")


# ---------------------------------------------------------------- q14
def time_of_day(t: int) -> str:
    hour = t // 3_600_000 % 24
    if 8 <= hour <= 18:
        return "dayTime"
    if hour <= 6 or hour >= 20:
        return "nightTime"
    return "otherTime"


def q14(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (events.filter(lambda e: e[0] == "B" and 1_000_000 < 0.908 * e[B_PRICE] < 50_000_000,
                          uid="q14.bids")
                  .map(lambda b: (b[B_AUCTION], b[B_BIDDER], 0.908 * b[B_PRICE],
                                  time_of_day(b[B_TIME]), b[B_EXTRA].count("c"), b[B_TIME]),
                       uid="q14"))


# ---------------------------------------------------------------- q15-q17
def rank(price: int) -> int:
    """Flink's price ranks: 0 below 10,000, 1 below 1,000,000, 2 above."""
    return 0 if price < 10_000 else 1 if price < 1_000_000 else 2


class DailyStats(AggregateFunction):
    """Bids, bidders and auctions in all and by price rank, and the last minute."""

    def create_accumulator(self) -> list[Any]:
        # bids per rank, bidders per rank (sets), auctions per rank (sets), last time
        return [[0, 0, 0], [set(), set(), set()], [set(), set(), set()], 0]

    def add(self, b: Any, acc: list[Any]) -> list[Any]:
        r = rank(b[B_PRICE])
        acc[0][r] += 1
        acc[1][r].add(b[B_BIDDER])
        acc[2][r].add(b[B_AUCTION])
        acc[3] = max(acc[3], b[B_TIME])
        return acc

    def get_result(self, acc: list[Any]) -> tuple[Any, ...]:
        bids, bidders, auctions = acc[0], acc[1], acc[2]
        return (sum(bids), *bids, len(set().union(*bidders)), *map(len, bidders),
                len(set().union(*auctions)), *map(len, auctions), acc[3])

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [[x + y for x, y in zip(a[0], b[0], strict=True)],
                [x | y for x, y in zip(a[1], b[1], strict=True)],
                [x | y for x, y in zip(a[2], b[2], strict=True)], max(a[3], b[3])]


class PerDay(ProcessWindowFunction):
    """``(key, day, *stats, window end)``; the key left out when it is None."""

    def __init__(self, with_minute: bool = False) -> None:
        self.with_minute = with_minute

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        stats = elements[0]
        day, _ = day_and_minute_of(context.window.start)
        extra = (day_and_minute_of(stats[-1])[1],) if self.with_minute else ()
        head = () if key == "all" else (key,)
        return [(*head, day, *stats[:-1], *extra, context.window.end)]


def q15(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (_bids(events, "q15.bids").key_by(lambda b: "all")
            .window(TumblingEventTimeWindows.of(DAY))
            .aggregate(DailyStats(), PerDay(), uid="q15"))


def q16(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (_bids(events, "q16.bids").key_by(lambda b: b[B_CHANNEL])
            .window(TumblingEventTimeWindows.of(DAY))
            .aggregate(DailyStats(), PerDay(with_minute=True), uid="q16"))


class AuctionStats(AggregateFunction):
    """Bids by rank, min, max and sum of prices (the average is the sum / bids)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0, 0, -1, -1, 0]

    def add(self, b: Any, acc: list[int]) -> list[int]:
        price = b[1]  # (auction, price, date_time)
        acc[0 if price < 10_000 else 1 if price < 1_000_000 else 2] += 1  # rank(price)
        if price < acc[3] or acc[3] < 0:
            acc[3] = price
        if price > acc[4]:
            acc[4] = price
        acc[5] += price
        return acc

    def get_result(self, acc: list[int]) -> tuple[Any, ...]:
        n = acc[0] + acc[1] + acc[2]
        return (n, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5] // n, acc[5])

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        mins = [x for x in (a[3], b[3]) if x >= 0]
        return [a[0] + b[0], a[1] + b[1], a[2] + b[2], min(mins) if mins else -1,
                max(a[4], b[4]), a[5] + b[5]]


class AuctionDay(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        day, _ = day_and_minute_of(context.window.start)
        return [(key, day, *elements[0], context.window.end)]


def _q17_columns(batch: list[Any]) -> list[Any]:
    """``(auction, price, date_time)`` of each bid: the columns q17 reads (the
    projection Flink's planner puts before the shuffle)."""
    return [(e[B_AUCTION], e[B_PRICE], e[B_TIME]) for e in batch if e[0] == "B"]


def q17(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (events.map_batch(_q17_columns, uid="q17.bids").key_by(lambda b: b[0])
            .window(TumblingEventTimeWindows.of(DAY), timestamp_of=lambda b: b[2])
            .aggregate(AuctionStats(), AuctionDay(), uid="q17"))


# ---------------------------------------------------------------- q18, q19
class AtTheEnd(KeyedProcessFunction):
    """Keeps ``pick(kept, bid)`` per key (of bids as ``(auction, bidder, price,
    date_time)``) and emits it once the input ended."""

    def __init__(self, pick: Callable[[Any, Any], Any],
                 rows: Callable[[Any, Any], list[Any]]) -> None:
        self.pick = pick
        self.rows = rows

    def open(self, ctx: Any) -> None:
        self.kept = ctx.get_state(ValueStateDescriptor("kept"))

    def process_element(self, b: Any, ctx: Any) -> Iterable[Any] | None:
        kept = self.kept.value()
        if kept is None:
            ctx.timer_service.register_event_time_timer(END_OF_TIME)
        self.kept.update(self.pick(kept, b))
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        kept = self.kept.value()
        self.kept.clear()
        return self.rows(ctx.current_key, kept)


def later(kept: Any, bid: tuple[Any, ...]) -> Any:
    """The later bid (the higher price of two at the same time)."""
    return bid if kept is None or (bid[3], bid[2]) > (kept[3], kept[2]) else kept


def top10(kept: Any, bid: tuple[Any, ...]) -> Any:
    """The ten highest bids, ties by the earlier time (a tuple: immutable
    state is never copied)."""
    return tuple(sorted([*(kept or ()), bid], key=lambda x: (-x[2], x[3], x[1]))[:10])


def _bid_columns(batch: list[Any]) -> list[Any]:
    """``(auction, bidder, price, date_time)`` of each bid: the columns q18
    and q19 read (the projection Flink's planner puts before the shuffle)."""
    return [(e[B_AUCTION], e[B_BIDDER], e[B_PRICE], e[B_TIME]) for e in batch if e[0] == "B"]


def q18(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (events.map_batch(_bid_columns, uid="q18.bids").key_by(lambda b: (b[1], b[0]))
            .process(AtTheEnd(later, lambda key, bid: [bid]), uid="q18"))


def q19(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return (events.map_batch(_bid_columns, uid="q19.bids").key_by(lambda b: b[0])
            .process(AtTheEnd(top10, lambda key, bids: [(*b, n + 1, b[3])
                                                         for n, b in enumerate(bids)]),
                     uid="q19"))


# ---------------------------------------------------------------- q20
class BidWithAuction(CoProcessFunction):
    """Auctions of category 10 (input 1) and bids (input 2) keyed by auction:
    every bid with its auction, whichever came first (an unbounded join)."""

    def open(self, ctx: Any) -> None:
        self.auction = ctx.get_state(ValueStateDescriptor("auction"))
        self.waiting = ctx.get_list_state(ListStateDescriptor("bids"))

    def process_element1(self, a: Any, ctx: Any) -> Iterable[Any] | None:
        auction = (a[A_ITEM], a[A_INITIAL], a[A_RESERVE], a[A_TIME], a[A_EXPIRES],
                   a[A_SELLER], a[A_CATEGORY])
        self.auction.update(auction)
        waiting = self.waiting.get()
        self.waiting.clear()
        return [_q20_row(b, auction) for b in waiting]

    def process_element2(self, b: Any, ctx: Any) -> Iterable[Any] | None:
        bid = (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL], b[B_TIME])
        auction = self.auction.value()
        if auction is None:
            self.waiting.add(bid)
            return None
        return [_q20_row(bid, auction)]


def _q20_row(bid: tuple[Any, ...], auction: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*bid, *auction, max(bid[4], auction[3]))


def q20(events: DataStream[Any], w: Any) -> DataStream[Any]:
    auctions = events.filter(lambda e: e[0] == "A" and e[A_CATEGORY] == 10, uid="q20.auctions")
    return (auctions.key_by(lambda a: a[A_ID])
                    .connect(_bids(events, "q20.bids").key_by(lambda b: b[B_AUCTION]))
                    .process(BidWithAuction(), uid="q20"))


# ---------------------------------------------------------------- q21
def channel_id(channel: str, url: str) -> str | None:
    """Flink's ``CASE lower(channel) ... ELSE REGEXP_EXTRACT(url,
    '(&|^)channel_id=([^&]*)', 2)``: None where neither gives one."""
    known = CHANNEL_IDS.get(channel.lower())
    if known is not None:
        return known
    m = CHANNEL_ID.search(url)
    return None if m is None else m.group(2)


def _q21_rows(batch: list[Any]) -> list[Any]:
    out = []
    for b in batch:
        if b[0] != "B":
            continue
        cid = channel_id(b[B_CHANNEL], b[B_URL])
        if cid is not None:
            out.append((b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL], cid, b[B_TIME]))
    return out


def q21(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return events.map_batch(_q21_rows, uid="q21")


# ---------------------------------------------------------------- q22
def split_index(s: str, sep: str, index: int) -> str | None:
    """Flink's ``SPLIT_INDEX``: the ``index``-th piece (from 0), None past the last."""
    parts = s.split(sep)
    return parts[index] if 0 <= index < len(parts) else None


def _q22_row(b: tuple[Any, ...]) -> tuple[Any, ...]:
    parts = b[B_URL].split("/")
    n = len(parts)
    return (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_CHANNEL],
            parts[3] if n > 3 else None, parts[4] if n > 4 else None,
            parts[5] if n > 5 else None, b[B_TIME])


def q22(events: DataStream[Any], w: Any) -> DataStream[Any]:
    return _bids(events, "q22.bids").map(_q22_row, uid="q22")


MORE: dict[str, Callable[[DataStream[Any], Any], DataStream[Any]]] = {
    "q4": q4, "q6": q6, "q9": q9, "q10": q10, "q11": q11, "q12": q12, "q13": q13, "q14": q14,
    "q15": q15, "q16": q16, "q17": q17, "q18": q18, "q19": q19, "q20": q20, "q21": q21, "q22": q22,
}
