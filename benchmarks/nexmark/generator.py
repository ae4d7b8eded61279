"""A deterministic Nexmark event generator.

The model and its proportions follow the Nexmark benchmark as Flink's
``nexmark`` project (and Arroyo, after it) generate it: an online auction
system with people, auctions and bids in the proportions 1 : 3 : 46 (2 %,
6 %, 92 %); event ``i`` is a person when ``i % 50 < 1``, an auction when
``< 4``, a bid otherwise. Ids start at 1000 (people, auctions) and 10
(categories, 5 of them); a bid is for a *hot* auction (one of the most recent
hundred's first) with probability 1 - 1/2, by a hot bidder with 1 - 1/4; an
auction's seller is hot with 1 - 1/4; otherwise the id is drawn among the
active people (1000) or the auctions in flight (100), plus a small lead of
ids not created yet. Prices are ``round(10 ** (6 u) * 100)`` cents for a uniform
``u``; an auction lasts ``1 + uniform(2 * horizon)`` ms, the horizon being the
time until 100 more auctions exist. Event time advances by ``1 / rate``
seconds per event from ``base_time`` (ms).

The code is this project's own. Every field of event ``i`` is a function of
``i`` alone (a SplitMix64 stream seeded by ``i``, not Java's ``Random``,
so the values differ from Flink's generator while their distributions and
id relations are the same): any task can generate any event, which is what
makes the source replayable and rescalable (``source.py``).

Events are tuples (cheap to pickle between tasks, exact in state):

* person:  ``("P", id, name, email, credit_card, city, state, date_time, extra)``
* auction: ``("A", id, item_name, description, initial_bid, reserve, date_time,
  expires, seller, category, extra)``
* bid:     ``("B", auction, bidder, price, channel, url, date_time, extra)``

A bid's channel and URL follow Flink's generator: with probability 1/2 one
of four hot channels (``Google`` ... ``Apple``, each with its URL), else
``channel-N`` of 10,000, whose URL ends with ``&channel_id=`` and ``N``'s
32 bits reversed (as Java's ``Math.abs(Integer.reverse(N))``) for 9 in 10
of them. URLs are ``https://www.nexmark.com/<dir>/<dir>/<dir>/item.htm?query=1``,
each directory 3 or 4 letters, now and then ``_``.

The field positions are the constants below (``BID_PRICE`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- field positions -------------------------------------------------------
KIND = 0
P_ID, P_NAME, P_EMAIL, P_CARD, P_CITY, P_STATE, P_TIME, P_EXTRA = range(1, 9)
A_ID, A_ITEM, A_DESC, A_INITIAL, A_RESERVE, A_TIME, A_EXPIRES, A_SELLER, A_CATEGORY, \
    A_EXTRA = range(1, 11)
B_AUCTION, B_BIDDER, B_PRICE, B_CHANNEL, B_URL, B_TIME, B_EXTRA = range(1, 8)

Event = tuple[Any, ...]

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_GROUP = 100
"""Hot sellers, bidders and auctions are the first of each group of 100
recent ids (Flink's HOT_*_RATIO constants of the generator's models)."""

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
HOT_CHANNELS_RATIO = 2
NUM_CHANNELS = 10_000

_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's step and finalizer: a well-mixed 64-bit value of ``z``."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _letters() -> str:
    z, out = 0x5EED, []
    for _ in range(4096):
        z = _mix(z)
        out.append(chr(ord("a") + z % 26))
    return "".join(out)


_TEXT = _letters()
"""Random lowercase text; a random string is a slice of it."""


class _Draws:
    """The random draws of one event: a SplitMix64 stream seeded by its id,
    each 64-bit value spent on several draws (mixed radix: ``x % n``, then
    ``x // n``), so an event costs one or two mixes, not one per draw."""

    __slots__ = ("z", "x", "room")

    def __init__(self, seed: int) -> None:
        self.z = seed * 0x2545F4914F6CDD1D & _M64
        self.x = self.z = _mix(self.z)
        self.room = _M64

    def below(self, n: int) -> int:
        if self.room < n << 8:  # too few values left for an unbiased draw: a new word
            self.x = self.z = _mix(self.z)
            self.room = _M64
        x = self.x
        self.x = x // n
        self.room //= n
        return x % n

    def unit(self) -> float:
        return self.below(1 << 24) / 16777216.0

    def text(self, n: int) -> str:
        start = self.below(len(_TEXT) - n)
        return _TEXT[start:start + n]


@dataclass(frozen=True)
class GeneratorConfig:
    """The workload (Flink nexmark's ``nexmark.workload.*`` defaults but the rate)."""

    rate: int = 10_000
    """Events per second of event time (the generator's ``first-event.rate``)."""
    base_time: int = 1_700_000_000_000
    """Event time of event 0, ms since the epoch."""
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    @property
    def total(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def timestamp(self, i: int) -> int:
        """Event time of event ``i`` (ms)."""
        return self.base_time + i * 1000 // self.rate

    def last_person(self, i: int) -> int:
        """The newest person id (base 0) as of event ``i`` (its own if a person)."""
        epoch, offset = divmod(i, self.total)
        return epoch * self.person_proportion + min(offset, self.person_proportion - 1)

    def last_auction(self, i: int) -> int:
        """The newest auction id (base 0) as of event ``i`` (its own if an auction)."""
        epoch, offset = divmod(i, self.total)
        if offset < self.person_proportion:
            epoch -= 1
            offset = self.auction_proportion - 1
        elif offset >= self.person_proportion + self.auction_proportion:
            offset = self.auction_proportion - 1
        else:
            offset -= self.person_proportion
        return epoch * self.auction_proportion + offset


class NexmarkGenerator:
    """``event(i)``: the ``i``-th event of the workload, always the same."""

    def __init__(self, config: GeneratorConfig | None = None) -> None:
        self.config = c = config or GeneratorConfig()
        self._person_below = c.person_proportion
        self._auction_below = c.person_proportion + c.auction_proportion
        # the time until num_in_flight_auctions more auctions exist, in ms
        events_ahead = c.num_in_flight_auctions * c.total // c.auction_proportion
        self._horizon_ms = max(events_ahead * 1000 // c.rate, 1)

    def kind(self, i: int) -> str:
        offset = i % self.config.total
        return "P" if offset < self._person_below else "A" if offset < self._auction_below \
            else "B"

    def event(self, i: int) -> Event:
        offset = i % self.config.total
        if offset >= self._auction_below:
            return self.bid(i)
        if offset < self._person_below:
            return self.person(i)
        return self.auction(i)

    def events(self, start: int, stop: int) -> list[Event]:
        event = self.event
        return [event(i) for i in range(start, stop)]

    # --------------------------------------------------------------- models
    def person(self, i: int) -> Event:
        c, r = self.config, _Draws(i)
        name = f"{FIRST_NAMES[r.below(len(FIRST_NAMES))]} {LAST_NAMES[r.below(len(LAST_NAMES))]}"
        email = f"{r.text(7)}@{r.text(5)}.com"
        card = " ".join(f"{r.below(10000):04d}" for _ in range(4))
        city = US_CITIES[r.below(len(US_CITIES))]
        state = US_STATES[r.below(len(US_STATES))]
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        return ("P", c.last_person(i) + FIRST_PERSON_ID, name, email, card, city, state,
                c.timestamp(i), _extra(r, size, c.avg_person_bytes))

    def auction(self, i: int) -> Event:
        c, r = self.config, _Draws(i)
        auction_id = c.last_auction(i) + FIRST_AUCTION_ID
        if r.below(c.hot_sellers_ratio) > 0:
            seller = c.last_person(i) // HOT_GROUP * HOT_GROUP
        else:
            seller = self._some_person(i, r)
        category = FIRST_CATEGORY_ID + r.below(NUM_CATEGORIES)
        initial = _price(r)
        ts = c.timestamp(i)
        expires = ts + 1 + r.below(2 * self._horizon_ms)
        item, desc = r.text(20), r.text(100)
        reserve = initial + _price(r)
        size = 8 + len(item) + len(desc) + 8 * 5
        return ("A", auction_id, item, desc, initial, reserve, ts, expires,
                seller + FIRST_PERSON_ID, category, _extra(r, size, c.avg_auction_bytes))

    def bid(self, i: int) -> Event:
        c, r = self.config, _Draws(i)
        if r.below(c.hot_auction_ratio) > 0:
            auction = c.last_auction(i) // HOT_GROUP * HOT_GROUP
        else:
            newest = c.last_auction(i)
            low = max(newest - c.num_in_flight_auctions, 0)
            auction = low + r.below(newest - low + 1 + AUCTION_ID_LEAD)
        if r.below(c.hot_bidders_ratio) > 0:
            bidder = c.last_person(i) // HOT_GROUP * HOT_GROUP + 1
        else:
            bidder = self._some_person(i, r)
        price = _price(r)
        if r.below(HOT_CHANNELS_RATIO) > 0:
            channel, url = _HOT[r.below(len(HOT_CHANNELS))]
        else:
            channel, url = _channel(r.below(NUM_CHANNELS))
        return ("B", auction + FIRST_AUCTION_ID, bidder + FIRST_PERSON_ID, price, channel, url,
                c.timestamp(i), _extra(r, 32, c.avg_bid_bytes))

    def _some_person(self, i: int, r: _Draws) -> int:
        """An active person (base 0), or one of the next few not created yet."""
        people = self.config.last_person(i) + 1
        active = min(people, self.config.num_active_people)
        return people - active + r.below(active + PERSON_ID_LEAD)


def _dir(r: _Draws) -> str:
    """3 or 4 letters, each ``_`` with probability 1/13 (Flink's ``nextString(5, '_')``)."""
    return "".join("_" if r.below(13) == 0 else chr(ord("a") + r.below(26))
                   for _ in range(3 + r.below(2)))


def _url(r: _Draws) -> str:
    return f"https://www.nexmark.com/{_dir(r)}/{_dir(r)}/{_dir(r)}/item.htm?query=1"


def java_abs_reverse(n: int) -> int:
    """Java's ``Math.abs(Integer.reverse(n))`` (``Integer.MIN_VALUE`` stays negative)."""
    v = int(f"{n & 0xFFFFFFFF:032b}"[::-1], 2)
    if v >= 1 << 31:
        v -= 1 << 32
    return v if v == -(1 << 31) else abs(v)


_URL_SEED = 0x4E45584D41524B  # the URLs' own random stream, apart from the events'
_HOT = tuple((ch, _url(_Draws(_URL_SEED + k))) for k, ch in enumerate(HOT_CHANNELS))
_CHANNELS: list[tuple[str, str] | None] = [None] * NUM_CHANNELS


def _channel(n: int) -> tuple[str, str]:
    """``("channel-<n>", its URL)``, made on first use (Flink's channel cache)."""
    got = _CHANNELS[n]
    if got is None:
        r = _Draws(_URL_SEED + len(HOT_CHANNELS) + n)
        url = _url(r)
        if r.below(10) > 0:
            url += f"&channel_id={java_abs_reverse(n)}"
        got = _CHANNELS[n] = (f"channel-{n}", url)
    return got


def _price(r: _Draws) -> int:
    return round(10.0 ** (r.unit() * 6.0) * 100.0)


def _extra(r: _Draws, size: int, average: int) -> str:
    """Padding that brings the event to ``average`` bytes on average (± 20 %)."""
    if size >= average:
        return ""
    want = average - size
    delta = round(want * 0.2)
    return r.text(want - delta + r.below(2 * delta + 1))
