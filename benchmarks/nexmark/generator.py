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
``i`` alone, not Java's ``Random``, so the values differ from Flink's
generator while their distributions and id relations are the same: any task
can generate any event, which is what makes the source replayable and
rescalable (``source.py``). The random draws are counter-based: draw ``k``
of event ``i`` comes from the 64-bit word ``SplitMix64(i, k)``, several small
draws from the bit fields of one word, so a batch of events is computed
with numpy, column by column (``batch``), and only the tuples are built
one by one; ``event(i)`` is the same computation for one event. Prices are
drawn from a table of 65,536 (``round(10 ** (6 u) * 100)`` for ``u`` in steps
of 1/65,536), so no floating-point function of numpy's is in the way of
equal results everywhere.

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

import numpy as np

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
_GOLDEN = 0x9E3779B97F4A7C15
_DRAW = 0xD1B54A32D192ED03
"""Word ``k`` of event ``i`` is ``_mix(i * _GOLDEN + k * _DRAW)``."""


def _mix(z: int) -> int:
    """SplitMix64's step and finalizer: a well-mixed 64-bit value of ``z``."""
    z = (z + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _word(i: int, k: int) -> int:
    return _mix((i * _GOLDEN + k * _DRAW) & _M64)


_U = np.uint64


def _words(i: np.ndarray, k: int) -> np.ndarray:
    """``_word(i, k)`` of every ``i`` (uint64, wrapping as the ints are masked)."""
    z = i * _U(_GOLDEN) + _U((k * _DRAW + _GOLDEN) & _M64)
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    return z ^ (z >> _U(31))


def _text() -> str:
    out = []
    for k in range(4096):
        out.append(chr(ord("a") + _word(0x5EED, k) % 26))
    return "".join(out)


_TEXT = _text()
"""Random lowercase text; a random string is a slice of it."""

PRICES = tuple(round(10.0 ** (u / 65536 * 6.0) * 100.0) for u in range(65536))
"""A price in cents for each 16-bit draw: ``round(10 ** (6 u) * 100)``."""


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
    """``event(i)``: the ``i``-th event of the workload, always the same;
    ``batch(numbers)``: the events of a list of event numbers."""

    def __init__(self, config: GeneratorConfig | None = None) -> None:
        self.config = c = config or GeneratorConfig()
        self._person_below = c.person_proportion
        self._auction_below = c.person_proportion + c.auction_proportion
        # the time until num_in_flight_auctions more auctions exist, in ms
        events_ahead = c.num_in_flight_auctions * c.total // c.auction_proportion
        self._horizon_ms = max(events_ahead * 1000 // c.rate, 1)
        # a bid's padding: want - delta + uniform(2 delta + 1) characters
        self._bid_want = max(c.avg_bid_bytes - 32, 0)
        self._bid_delta = round(self._bid_want * 0.2)

    def kind(self, i: int) -> str:
        offset = i % self.config.total
        return "P" if offset < self._person_below else "A" if offset < self._auction_below \
            else "B"

    def event(self, i: int) -> Event:
        return self.batch([i])[0]

    def events(self, start: int, stop: int) -> list[Event]:
        out: list[Event] = []
        for lo in range(start, stop, 4096):
            out += self.batch(list(range(lo, min(lo + 4096, stop))))
        return out

    def batch(self, numbers: list[int]) -> list[Event]:
        """The events ``numbers`` (in that order)."""
        if not numbers:
            return []
        c = self.config
        i = np.array(numbers, dtype=np.uint64)
        offset = i % _U(c.total)
        is_bid = offset >= _U(self._auction_below)
        is_auction = ~is_bid & (offset >= _U(self._person_below))
        if is_bid.all():
            return self._bids(i)
        out: list[Any] = [None] * len(numbers)
        for where, events in ((is_bid, self._bids), (is_auction, self._auctions),
                              (~is_bid & ~is_auction, self._people)):
            at = np.flatnonzero(where)
            if len(at):
                for k, e in zip(at.tolist(), events(i[at]), strict=True):
                    out[k] = e
        return out

    # --------------------------------------------------------------- models
    def _last_ids(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``last_person`` and ``last_auction`` of each ``i`` (GeneratorConfig's)."""
        c = self.config
        epoch, offset = i // _U(c.total), i % _U(c.total)
        pp, ap = c.person_proportion, c.auction_proportion
        last_person = (epoch * _U(pp) + np.minimum(offset, _U(pp - 1))).astype(np.int64)
        is_person = offset < _U(pp)
        a_off = np.where(is_person | (offset >= _U(pp + ap)), _U(ap - 1), offset - _U(pp))
        last_auction = (epoch.astype(np.int64) - is_person.astype(np.int64)) * ap \
            + a_off.astype(np.int64)
        return last_person, last_auction

    def _some_people(self, last_person: np.ndarray, w: np.ndarray) -> np.ndarray:
        """An active person (base 0) each, or one of the next few not created yet."""
        people = last_person + 1
        active = np.minimum(people, self.config.num_active_people)
        return people - active + (w % (active + PERSON_ID_LEAD).astype(np.uint64)).astype(
            np.int64)

    def _bids(self, i: np.ndarray) -> list[Event]:
        """The bids ``i``."""
        c = self.config
        last_person, last_auction = self._last_ids(i)
        w0, w1, w2, w3, w4 = (_words(i, k) for k in range(5))
        m16 = _U(0xFFFF)
        hot_auction = (w0 & m16) % _U(c.hot_auction_ratio) > _U(0)
        low = np.maximum(last_auction - c.num_in_flight_auctions, 0)
        span = (last_auction - low + 1 + AUCTION_ID_LEAD).astype(np.uint64)
        auction = np.where(hot_auction, last_auction // HOT_GROUP * HOT_GROUP,
                           low + (w1 % span).astype(np.int64)) + FIRST_AUCTION_ID
        hot_bidder = ((w0 >> _U(16)) & m16) % _U(c.hot_bidders_ratio) > _U(0)
        bidder = np.where(hot_bidder, last_person // HOT_GROUP * HOT_GROUP + 1,
                          self._some_people(last_person, w2)) + FIRST_PERSON_ID
        price = PRICES_ARRAY[(w3 & m16).astype(np.intp)]
        hot_channel = ((w0 >> _U(32)) & m16) % _U(HOT_CHANNELS_RATIO) > _U(0)
        channel = np.where(hot_channel, (w0 >> _U(48)) % _U(len(HOT_CHANNELS)),
                           _U(len(HOT_CHANNELS)) + (w3 >> _U(16)) % _U(NUM_CHANNELS))
        ts = c.base_time + i.astype(np.int64) * 1000 // c.rate
        want, delta = self._bid_want, self._bid_delta
        length = want - delta + ((w4 & m16) % _U(2 * delta + 1)).astype(np.int64)
        start = ((w4 >> _U(16)) % _U(len(_TEXT) - want - delta)).astype(np.int64)
        stop = start + length
        names, urls = _channels()
        text = _TEXT
        return [("B", a, b, p, names[ch], urls[ch], t, text[s:e])
                for a, b, p, ch, t, s, e in zip(
                    auction.tolist(), bidder.tolist(), price.tolist(), channel.tolist(),
                    ts.tolist(), start.tolist(), stop.tolist(), strict=True)]

    def _auctions(self, i: np.ndarray) -> list[Event]:
        """The auctions ``i``."""
        c = self.config
        last_person, last_auction = self._last_ids(i)
        w0, w1, w2, w3, w4, w5 = (_words(i, k) for k in range(6))
        m16, m32 = _U(0xFFFF), _U(0xFFFFFFFF)
        hot_seller = (w0 & m16) % _U(c.hot_sellers_ratio) > _U(0)
        seller = np.where(hot_seller, last_person // HOT_GROUP * HOT_GROUP,
                          self._some_people(last_person, w1)) + FIRST_PERSON_ID
        category = FIRST_CATEGORY_ID + ((w0 >> _U(16)) & m16) % _U(NUM_CATEGORIES)
        initial = PRICES_ARRAY[(w2 & m16).astype(np.intp)]
        reserve = initial + PRICES_ARRAY[((w2 >> _U(16)) & m16).astype(np.intp)]
        ts = c.base_time + i.astype(np.int64) * 1000 // c.rate
        expires = ts + 1 + (w3 % _U(2 * self._horizon_ms)).astype(np.int64)
        item = ((w4 & m32) % _U(len(_TEXT) - ITEM_CHARS)).astype(np.int64)
        desc = ((w4 >> _U(32)) % _U(len(_TEXT) - DESC_CHARS)).astype(np.int64)
        want = max(c.avg_auction_bytes - AUCTION_BYTES, 0)
        delta = round(want * 0.2)
        length = want - delta + ((w5 & m16) % _U(2 * delta + 1)).astype(np.int64)
        extra = ((w5 >> _U(16)) % (_U(len(_TEXT)) - length.astype(np.uint64))).astype(np.int64)
        text = _TEXT
        return [("A", a, text[it:it + ITEM_CHARS], text[d:d + DESC_CHARS], ini, res, t, exp,
                 sel, cat, text[x:x + n])
                for a, it, d, ini, res, t, exp, sel, cat, x, n in zip(
                    (last_auction + FIRST_AUCTION_ID).tolist(), item.tolist(), desc.tolist(),
                    initial.tolist(), reserve.tolist(), ts.tolist(), expires.tolist(),
                    seller.tolist(), category.tolist(), extra.tolist(), length.tolist(),
                    strict=True)]

    def _people(self, i: np.ndarray) -> list[Event]:
        """The people ``i`` (their words drawn for all at once)."""
        c = self.config
        last_person, _ = self._last_ids(i)
        ts = c.base_time + i.astype(np.int64) * 1000 // c.rate
        make = self._person
        return [make(w0, w1, w2, w3, p + FIRST_PERSON_ID, t)
                for w0, w1, w2, w3, p, t in zip(
                    *(_words(i, k).tolist() for k in range(4)), last_person.tolist(),
                    ts.tolist(), strict=True)]

    def _person(self, w0: int, w1: int, w2: int, w3: int, person: int, ts: int) -> Event:
        """The person of id ``person`` at time ``ts`` from its four words."""
        c = self.config
        name = f"{FIRST_NAMES[(w0 & 0xFFFF) % len(FIRST_NAMES)]} " \
               f"{LAST_NAMES[(w0 >> 16 & 0xFFFF) % len(LAST_NAMES)]}"
        city = US_CITIES[(w0 >> 32 & 0xFFFF) % len(US_CITIES)]
        state = US_STATES[(w0 >> 48) % len(US_STATES)]
        email = f"{_slice(w1 & 0xFFFFFFFF, 7)}@{_slice(w1 >> 32, 5)}.com"
        card = " ".join(f"{(w2 >> s & 0xFFFF) % 10000:04d}" for s in (0, 16, 32, 48))
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        return ("P", person, name, email, card, city, state, ts,
                _extra(w3, size, c.avg_person_bytes))


PRICES_ARRAY = np.array(PRICES, dtype=np.int64)
ITEM_CHARS, DESC_CHARS = 20, 100
AUCTION_BYTES = 8 + ITEM_CHARS + DESC_CHARS + 8 * 5
"""An auction's size without its padding (``avg_auction_bytes`` on average with it)."""


def _slice(x: int, n: int) -> str:
    """``n`` characters of the random text, where ``x`` says."""
    start = x % (len(_TEXT) - n)
    return _TEXT[start:start + n]


def _extra(w: int, size: int, average: int) -> str:
    """Padding that brings the event to ``average`` bytes on average (± 20 %)."""
    if size >= average:
        return ""
    want = average - size
    delta = round(want * 0.2)
    return _slice(w >> 16, want - delta + (w & 0xFFFF) % (2 * delta + 1))


def _dirs(w: np.ndarray) -> list[str]:
    """Per word: 3 or 4 characters, each ``_`` with probability 1/13 and a
    letter else (Flink's ``nextString(5, '_')``), from 15-bit fields of it."""
    chars = np.empty((len(w), 4), dtype=np.uint8)
    for j in range(4):
        x = (w >> _U(1 + 15 * j)) & _U(0x7FFF)
        chars[:, j] = np.where(x % _U(13) == _U(0), ord("_"), ord("a") + x // _U(13) % _U(26))
    flat = chars.tobytes().decode("ascii")
    return [flat[4 * r:4 * r + n] for r, n in enumerate((3 + (w & _U(1))).tolist())]


def _urls(seeds: np.ndarray) -> list[str]:
    d1, d2, d3 = (_dirs(_words(seeds, k)) for k in range(3))
    return [f"https://www.nexmark.com/{a}/{b}/{c}/item.htm?query=1"
            for a, b, c in zip(d1, d2, d3, strict=True)]


def java_abs_reverse(n: int) -> int:
    """Java's ``Math.abs(Integer.reverse(n))`` (``Integer.MIN_VALUE`` stays negative)."""
    v = int(f"{n & 0xFFFFFFFF:032b}"[::-1], 2)
    if v >= 1 << 31:
        v -= 1 << 32
    return v if v == -(1 << 31) else abs(v)


_URL_SEED = 0x4E45584D41524B  # the URLs' own draws, apart from the events'
_CHANNELS: tuple[list[str], list[str]] | None = None


def _channels() -> tuple[list[str], list[str]]:
    """Names and URLs of the channels: the hot ones, then ``channel-0`` ...
    (Flink's channel cache), made on first use."""
    global _CHANNELS
    if _CHANNELS is None:
        seeds = np.arange(NUM_CHANNELS, dtype=np.uint64) + _U(_URL_SEED)
        with_id = (_words(seeds, 3) % _U(10) > _U(0)).tolist()
        urls = [url + f"&channel_id={java_abs_reverse(n)}" if has else url
                for n, (url, has) in enumerate(zip(_urls(seeds), with_id, strict=True))]
        hot = _urls(np.arange(len(HOT_CHANNELS), dtype=np.uint64) + _U(_URL_SEED - 16))
        _CHANNELS = ([*HOT_CHANNELS, *(f"channel-{n}" for n in range(NUM_CHANNELS))],
                     [*hot, *urls])
    return _CHANNELS
