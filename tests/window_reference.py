"""Windows computed in plain Python over a whole input: the reference the
window tests compare Lockgate's output with.

Written apart from ``lockgate/runtime/windows.py``, from the rules as
documented (Flink's): windows ``[start, end)``; a window is late once the
watermark reached ``end - 1 + lateness``; a record goes to each of its
windows that is not late, and one whose end the watermark passed fires again
at once; a record none of whose windows took it, itself at or before
``watermark - lateness``, is a late record; sessions merge with every window
of the key they intersect, touching included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Window = tuple[int, int]
MIN = float("-inf")


def tumbling(size: int) -> Callable[[int], list[Window]]:
    return lambda ts: [(ts - ts % size, ts - ts % size + size)]


def sliding(size: int, slide: int) -> Callable[[int], list[Window]]:
    def assign(ts: int) -> list[Window]:
        last = ts - ts % slide
        return [(s, s + size) for s in range(last, ts - size, -slide)]
    return assign


def session(gap: int) -> Callable[[int], list[Window]]:
    return lambda ts: [(ts, ts + gap)]


def simulate(records: Iterable[Any], watermarks: Iterable[float], *,
             key_of: Callable[[Any], Any], ts_of: Callable[[Any], int],
             value_of: Callable[[Any], Any], assign: Callable[[int], list[Window]],
             merging: bool = False, lateness: int = 0,
             result: Callable[[list[Any]], Any] = sum) -> tuple[list[tuple], list[Any]]:
    """Every firing as ``(key, start, end, result(values of the window))``
    and the late records, for ``records`` each seen under the watermark of
    ``watermarks`` at the same position (non-decreasing); the end of input
    fires everything."""
    contents: dict[Any, dict[Window, list[Any]]] = {}
    pending: set[tuple[Any, Window]] = set()  # windows whose firing timer waits
    fired: list[tuple] = []
    late: list[Any] = []
    wm = MIN

    def advance(to: float) -> None:
        nonlocal wm
        wm = max(wm, to)
        due = sorted((w[1] - 1, k, w) for k, w in pending if w[1] - 1 <= wm)
        for _, k, w in due:
            pending.discard((k, w))
            fired.append((k, w[0], w[1], result(list(contents[k][w]))))
        for k in list(contents):
            for w in [w for w in contents[k] if w[1] - 1 + lateness <= wm]:
                del contents[k][w]
            if not contents[k]:
                del contents[k]

    for r, w_before in zip(records, watermarks, strict=True):
        advance(w_before)
        k, ts = key_of(r), ts_of(r)
        took = False
        for w in assign(ts):
            table = contents.setdefault(k, {})
            if merging:
                touching = [v for v in table if v[0] <= w[1] and w[0] <= v[1]]
                if touching:
                    merged = (min([w[0]] + [v[0] for v in touching]),
                              max([w[1]] + [v[1] for v in touching]))
                    if touching != [merged]:
                        values = []
                        for v in sorted(touching):
                            values += table.pop(v)
                            pending.discard((k, v))
                        table[merged] = values
                        if merged[1] - 1 > wm:
                            pending.add((k, merged))
                    w = merged
            if w[1] - 1 + lateness <= wm:
                if not table:
                    del contents[k]
                continue
            took = True
            if w not in table:
                table[w] = []
                if w[1] - 1 > wm:
                    pending.add((k, w))
            table[w].append(value_of(r))
            if w[1] - 1 <= wm:
                fired.append((k, w[0], w[1], result(list(table[w]))))
        if not took and ts + lateness <= wm:
            late.append(r)
    advance(float("inf"))
    return fired, late


def count_windows(records: Iterable[Any], size: int, *, key_of: Callable[[Any], Any],
                  value_of: Callable[[Any], Any],
                  result: Callable[[list[Any]], Any] = sum) -> list[tuple]:
    """``count_window(size)``: ``(key, result)`` per complete window."""
    open_: dict[Any, list[Any]] = {}
    out = []
    for r in records:
        k = key_of(r)
        open_.setdefault(k, []).append(value_of(r))
        if len(open_[k]) == size:
            out.append((k, result(open_.pop(k))))
    return out


def stream_watermarks(timestamps: list[int], out_of_orderness: int, behind: int) -> list[float]:
    """The watermark before each record of a single source task that emits
    one after every batch, with batches of at most ``behind`` records: at
    least the one of every record ``behind`` or more places earlier
    (``behind = 1``: the exact watermark after every record)."""
    out: list[float] = []
    top = MIN
    for i in range(len(timestamps)):
        j = i - behind
        if j >= 0:
            top = max(top, timestamps[j])
        out.append(top - out_of_orderness - 1)
    return out


# ------------------------------------------- an input for jobs, late by design

SIZE = 1_000
"""The tumbling windows of the jobs' tests."""
LATENESS = 5_000
OUT_OF_ORDER = 50
BATCH = 50
"""The jobs' source batches (``Pipeline(batch_size=BATCH)``)."""


def timestamp(x: int) -> int:
    """The event time of record ``x`` (``SequenceSource``, one source task,
    a watermark after every batch): 10 per record, up to ``OUT_OF_ORDER``
    out of order; every 97th (after 1,000) late within ``LATENESS`` and
    every 89th too late for it. The margins are wider than two batches, so
    whichever batches the records come in (they differ after a restore: the
    window operator restores its watermark) the same records are late:
    :func:`job_reference` checks that."""
    if x > 1_000 and x % 97 == 0:
        return 10 * x - 4_000
    if x > 1_000 and x % 89 == 0:
        return 10 * x - 9_000
    return 10 * x - (x * 7) % OUT_OF_ORDER


def timestamp_near_late(x: int) -> int:
    """:func:`timestamp`, and every 5th record after 1,000 (not one of
    those) too late for every window and for the allowed lateness by about
    one batch: late whichever batches the records come in, but on time
    under a watermark a few batches behind (a window task restored with
    another task's older watermark)."""
    if x > 1_000 and x % 97 and x % 89 and x % 5 == 0:
        return 10 * x - 7_000
    return timestamp(x)


STAMPS: dict[str, Callable[[int], int]] = {"default": timestamp, "near-late": timestamp_near_late}
"""The event times a job may use, by name."""


def job_reference(n: int, keys: int, assign: Callable[[int], list[Window]], *,
                  merging: bool = False, lateness: int = LATENESS,
                  result: Callable[[list[Any]], Any] = sum,
                  stamp: Callable[[int], int] = timestamp) -> tuple[list[tuple], list[int]]:
    """The firings and late records of ``1..n`` keyed by ``x % keys`` (value
    ``x``, event time ``stamp(x)``), the same under the exact watermark
    after every record as under the one of batches of ``BATCH``."""
    xs = list(range(1, n + 1))
    stamps = [stamp(x) for x in xs]
    runs = [simulate(xs, stream_watermarks(stamps, OUT_OF_ORDER, behind),
                     key_of=lambda x: x % keys, ts_of=stamp, value_of=lambda x: x,
                     assign=assign, merging=merging, lateness=lateness, result=result)
            for behind in (1, BATCH)]
    (fired, late), (fired_b, late_b) = runs
    assert sorted(fired) == sorted(fired_b) and late == late_b, "the input is not late by design"
    return fired, late


def join_reference(n: int, keys: int, bound: int,
                   stamp: Callable[[int], int]) -> tuple[list[tuple[int, int]], list[int]]:
    """An interval join of ``1..n`` (left) with their negatives (right),
    both keyed by ``x % keys``, ``between(-bound, bound)``: the pairs
    ``(x, -y)`` and the late records (``x`` and ``-x``), the same under the
    exact watermark after every record as under the one of batches of
    ``BATCH``. A record on time pairs with every record of its key on time
    within ``bound``: the one that came first is kept until the watermark
    reaches its time plus ``bound``, which is beyond the watermark when the
    second comes (it is on time)."""
    xs = list(range(1, n + 1))
    stamps = [stamp(x) for x in xs]
    lates = []
    for behind in (1, BATCH):
        marks = stream_watermarks(stamps, OUT_OF_ORDER, behind)
        lates.append({x for x, ts, wm in zip(xs, stamps, marks, strict=True)
                      if wm != MIN and ts < wm})
    assert lates[0] == lates[1], "the input is not late by design"
    by_key: dict[int, list[tuple[int, int]]] = {}
    for x, ts in zip(xs, stamps, strict=True):
        if x not in lates[0]:
            by_key.setdefault(x % keys, []).append((ts, x))
    pairs = []
    for records in by_key.values():
        records.sort()
        lo = 0
        for ts, x in records:
            while records[lo][0] < ts - bound:
                lo += 1
            i = lo
            while i < len(records) and records[i][0] <= ts + bound:
                pairs.append((x, -records[i][1]))
                i += 1
    late = sorted(lates[0])
    return pairs, late + [-x for x in late]
