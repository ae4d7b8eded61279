"""The Nexmark queries on Lockgate's DataStream API.

Each query takes the stream of events (``NexmarkSource`` with ``WATERMARKS``)
and returns its result stream; ``result_time(record)`` says when, in event
time, a result could first be known (the latency runs measure the wall
clock at the sink against it). The queries follow Flink's Nexmark SQL
(``nexmark-flink/src/main/resources/queries``):

* q0  pass-through: every bid.
* q1  currency: every bid with its price in euros (``0.908 * price``).
* q2  selection: ``(auction, price)`` of the bids whose ``auction % 123 == 0``.
* q3  local item suggestion: people of OR, ID or CA who sell in category 10,
  with the auction: an unbounded join of persons and auctions
  (``connect`` with a keyed ``CoProcessFunction``).
* q5  hot items: per sliding window (10 s, every 2 s), the auctions with the
  most bids.
* q7  highest bid: per tumbling window (10 s), the bids with the highest price.
* q8  monitor new users: people who created an auction in the same tumbling
  window (10 s) as they registered (a window join).

Every output record ends with its result time, so the runner needs nothing
else of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
from lockgate import (
    AggregateFunction,
    DataStream,
    KeyedProcessFunction,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
)
from lockgate.api.connected import CoProcessFunction
from lockgate.state.backend import ListStateDescriptor

__all__ = ["Windows", "CORE", "Count", "result_time"]


@dataclass(frozen=True)
class Windows:
    """Window sizes of q5, q7 and q8 (ms): Flink Nexmark's by default."""

    size: int = 10_000
    slide: int = 2_000


def is_bid(e: tuple[Any, ...]) -> bool:
    return e[0] == "B"


def is_person(e: tuple[Any, ...]) -> bool:
    return e[0] == "P"


def is_auction(e: tuple[Any, ...]) -> bool:
    return e[0] == "A"


def q0(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    return (events.filter(is_bid, uid="q0.bids")
                  .map(lambda b: (b[B_AUCTION], b[B_BIDDER], b[B_PRICE], b[B_TIME]), uid="q0"))


def euros(b: tuple[Any, ...]) -> tuple[Any, ...]:
    return (b[B_AUCTION], b[B_BIDDER], 0.908 * b[B_PRICE], b[B_TIME])


def q1(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    return events.filter(is_bid, uid="q1.bids").map(euros, uid="q1")


def q2(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    return (events.filter(lambda e: e[0] == "B" and e[B_AUCTION] % 123 == 0, uid="q2.bids")
                  .map(lambda b: (b[B_AUCTION], b[B_PRICE], b[B_TIME]), uid="q2"))


# ---------------------------------------------------------------- q3
LOCAL_STATES = ("OR", "ID", "CA")


class SellerJoin(CoProcessFunction):
    """Persons (input 1) and auctions (input 2) keyed by the person id: each
    auction of category 10 with its seller, whichever came first (an
    unbounded join, as Flink's regular join: state is never dropped)."""

    def open(self, ctx: Any) -> None:
        self.person = ctx.get_state(ValueStateDescriptor("person"))
        self.waiting = ctx.get_list_state(ListStateDescriptor("auctions"))

    def process_element1(self, p: Any, ctx: Any) -> Iterable[Any] | None:
        seller = (p[P_NAME], p[P_CITY], p[P_STATE], p[P_TIME])
        self.person.update(seller)
        waiting = self.waiting.get()
        if not waiting:
            return None
        self.waiting.clear()
        return [_q3_row(seller, a) for a in waiting]

    def process_element2(self, a: Any, ctx: Any) -> Iterable[Any] | None:
        auction = (a[A_ID], a[A_TIME])
        seller = self.person.value()
        if seller is None:
            self.waiting.add(auction)
            return None
        return [_q3_row(seller, auction)]


def _q3_row(seller: tuple[Any, ...], auction: tuple[Any, ...]) -> tuple[Any, ...]:
    name, city, state, p_time = seller
    auction_id, a_time = auction
    return (name, city, state, auction_id, max(p_time, a_time))


def _q3_events(batch: list[Any]) -> list[Any]:
    """The persons of the local states and the auctions of category 10: q3's
    filters, in the source's task (Flink's planner puts them before the
    shuffle), so that its two inputs take only these events, not every one."""
    return [e for e in batch if e[0] == "A" and e[A_CATEGORY] == 10
            or e[0] == "P" and e[P_STATE] in LOCAL_STATES]


def q3(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    wanted = events.map_batch(_q3_events, uid="q3.events")
    persons = wanted.filter(lambda e: e[0] == "P", uid="q3.persons")
    auctions = wanted.filter(lambda e: e[0] == "A", uid="q3.auctions")
    return (persons.key_by(lambda p: p[P_ID])
                   .connect(auctions.key_by(lambda a: a[A_SELLER]))
                   .process(SellerJoin(), uid="q3"))


# ---------------------------------------------------------------- q5
class Count(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + 1

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


class WithWindow(ProcessWindowFunction):
    """``(key, window start, window end, value)``."""

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        return [(key, context.window.start, context.window.end, elements[0])]


class MostBids(ProcessWindowFunction):
    """Of one window's ``(auction, start, end, count)``: those with the most bids,
    as ``(start, end, auction, count)``."""

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        top = max(r[3] for r in elements)
        return [(r[1], r[2], r[0], r[3]) for r in elements if r[3] == top]


def q5(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    counts = (events.filter(is_bid, uid="q5.bids")
                    .key_by(lambda b: b[B_AUCTION])
                    .window(SlidingEventTimeWindows.of(w.size, w.slide))
                    .aggregate(Count(), WithWindow(), uid="q5.counts"))
    # every window's counts meet in one tumbling window of the slide's size
    return (counts.key_by(lambda r: r[2])
                  .window(TumblingEventTimeWindows.of(w.slide), timestamp_of=lambda r: r[2] - 1)
                  .process(MostBids(), uid="q5"))


# ---------------------------------------------------------------- q7
class HighestBids(AggregateFunction):
    """``(price, bids)``: the highest price so far and the bids at it."""

    def create_accumulator(self) -> tuple[Any, ...]:
        return (-1, ())

    def add(self, b: Any, acc: tuple[Any, ...]) -> tuple[Any, ...]:
        price = b[B_PRICE]
        if price > acc[0]:
            return (price, ((b[B_AUCTION], price, b[B_BIDDER], b[B_TIME]),))
        if price == acc[0]:
            return (price, acc[1] + ((b[B_AUCTION], price, b[B_BIDDER], b[B_TIME]),))
        return acc

    def get_result(self, acc: tuple[Any, ...]) -> tuple[Any, ...]:
        return acc

    def merge(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        return a if a[0] > b[0] else b if b[0] > a[0] else (a[0], a[1] + b[1])


class Highest(ProcessWindowFunction):
    """Of one window's per-auction highest bids: those at the highest price,
    as ``(auction, price, bidder, date_time, window end)``."""

    def process(self, key: Any, context: Any, elements: list[Any]) -> Iterable[Any]:
        top = max(r[3][0] for r in elements)
        end = context.window.end
        return [(*bid, end) for r in elements if r[3][0] == top for bid in r[3][1]]


def q7(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    highest = (events.filter(is_bid, uid="q7.bids")
                     .key_by(lambda b: b[B_AUCTION])
                     .window(TumblingEventTimeWindows.of(w.size))
                     .aggregate(HighestBids(), WithWindow(), uid="q7.per-auction"))
    return (highest.key_by(lambda r: r[1])
                   .window(TumblingEventTimeWindows.of(w.size), timestamp_of=lambda r: r[1])
                   .process(Highest(), uid="q7"))


# ---------------------------------------------------------------- q8
class FirstOnly(KeyedProcessFunction):
    """Each key once (the join gives a person once per auction of the window);
    the flag is dropped when the window is over (an event-time timer)."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("seen"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        if self.seen.value() is not None:
            return None
        self.seen.update(True)
        ctx.timer_service.register_event_time_timer(value[3])
        return [value]

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        self.seen.clear()
        return None


def _q8_rows(batch: list[Any]) -> list[Any]:
    """``("P", id, name, date_time)`` of each person and ``("A", seller,
    date_time)`` of each auction: the columns q8 reads, in the source's task
    (Flink's planner puts this projection and filter before the shuffle), so
    the join's inputs take only these rows, not every event."""
    return [("P", e[P_ID], e[P_NAME], e[P_TIME]) if e[0] == "P" else ("A", e[A_SELLER], e[A_TIME])
            for e in batch if e[0] != "B"]


def q8(events: DataStream[Any], w: Windows) -> DataStream[Any]:
    size = w.size
    rows = events.map_batch(_q8_rows, uid="q8.rows")
    persons = rows.filter(lambda r: r[0] == "P", uid="q8.persons")
    auctions = rows.filter(lambda r: r[0] == "A", uid="q8.auctions")
    pairs = (persons.join(auctions).where(lambda p: p[1]).equal_to(lambda a: a[1])
                    .window(TumblingEventTimeWindows.of(size),
                            timestamp_of=lambda p: p[3], other_timestamp_of=lambda a: a[2])
                    .apply(lambda p, a: (p[1], p[2], p[3] // size * size,
                                         p[3] // size * size + size), uid="q8.join"))
    return pairs.key_by(lambda r: (r[0], r[2])).process(FirstOnly(), uid="q8")


CORE: dict[str, Callable[[DataStream[Any], Windows], DataStream[Any]]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8,
}
"""This module's queries; ``job.QUERIES`` has every query (``queries_more``'s too)."""


def result_time(query: str, record: tuple[Any, ...]) -> int:
    """When (event time, ms) the result ``record`` of ``query`` could first be
    known: its last event's time, or the end of its window."""
    if query == "q5":
        return int(record[1])
    return int(record[-1])
