"""The RocksDB backend's early flush: the memtable flushed in the background
shortly before the next checkpoint is expected, so that the flush inside the
checkpoint's synchronous part covers only the last writes.

A RocksDB checkpoint (hard links) first flushes the memtable, on the task's
thread, records stopped: with a checkpoint every 2 s and uniformly random
keys, that flush wrote an SST file of ~100,000 entries at every barrier and
was nearly all of the synchronous part. Here the task asks its backends
between records (:meth:`RocksDBKeyedStateBackend.prepare_snapshot`) whether a
checkpoint is near: when it is, the value cache is written back and
``flush(wait=False)`` turns the memtable immutable — a background thread
writes it into an SST file while records keep flowing into a new memtable.
At the barrier, the checkpoint flushes only what came since (and waits for
the background flush if it has not finished).

When a checkpoint is near is learned from the task's own snapshots: the
next one is expected one period after the last, the period being the
median of the last few gaps between snapshots (a checkpoint interval, or
longer when checkpoints take longer) — the job's checkpoint interval until
two snapshots were taken. The early flush starts a lead before it
(:meth:`EarlyFlush.lead`): 15% of the period (the barriers' arrival
varies by a few hundred milliseconds), or one and a half times what the last
early flushes took if that is longer (the task watches each one finish
between records): on a loaded machine, where flushes take longer, the lead
grows with them, so that the barrier rarely waits for an unfinished early
flush. A wrong guess only costs time, never state: an early
flush moves no entry in or out of the database (every write before the
barrier is in the checkpoint, none after it), it only cuts the memtable into
two SST files. Those extra level-0 files are why the level-0 compaction
trigger is doubled with early flushes on
(:func:`~lockgate.state.rocksdb.io.options`): compactions, whose output the
next checkpoint uploads, stay as frequent per checkpoint as before.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

LEAD_FRACTION = 0.15
"""The early flush starts at least this fraction of the period before the
expected checkpoint: barriers reach a task a few hundred milliseconds
earlier or later from one checkpoint to the next (they travel behind the
records in socket buffers), and one that comes before the early flush finds
the whole memtable to flush."""
MIN_LEAD = 0.1
MAX_LEAD = 1.0
FLUSH_MARGIN = 1.5
"""The lead is this many times the median of the last early flushes' times."""
MIN_MEMTABLE = 256 << 10
"""A memtable smaller than this is left for the checkpoint (its flush takes
a millisecond; a tiny SST file would only add to level 0)."""
PERIODS = 5
"""How many gaps between snapshots the period is the median of (and early
flushes the lead is measured on)."""
POLL = 0.01
"""Seconds between two looks at a running early flush when the task is idle."""


class EarlyFlush:
    """When the next early flush is due (``time.monotonic()`` seconds), from
    the times of the snapshots taken so far, and how long early flushes take."""

    def __init__(self, interval: float | None = None) -> None:
        self.due = math.inf
        self.interval = interval
        """The job's checkpoint interval (None: no periodic checkpoints)."""
        self.running: float | None = None
        """When the early flush that has not finished yet started."""
        self._last: float | None = None
        self._gaps: deque[float] = deque(maxlen=PERIODS)
        self._took: deque[float] = deque(maxlen=PERIODS)

    def expect(self, interval: float | None, now: float) -> None:
        """Checkpoints come every ``interval`` seconds, the first about one
        interval after ``now`` (a task starting: the first checkpoint of
        an attempt flushes what the task wrote since it started)."""
        self.interval = interval
        if interval and self._last is None:
            self.due = now + interval - self.lead(interval)

    def lead(self, period: float) -> float:
        """Seconds before the expected checkpoint that the early flush starts:
        long enough for the background flush to finish, short enough that
        little is written after it."""
        want = period * LEAD_FRACTION
        if self._took:
            want = max(want, FLUSH_MARGIN * statistics.median(self._took))
        return min(max(want, MIN_LEAD), MAX_LEAD, period / 2)

    def snapshot_taken(self, now: float) -> None:
        """A snapshot was taken at ``now``: the next early flush is due a lead
        before the next snapshot is expected (after the first snapshot: one
        interval later; none without an interval)."""
        if self._last is not None:
            self._gaps.append(now - self._last)
        self._last = now
        period = statistics.median(self._gaps) if self._gaps else self.interval
        self.due = now + period - self.lead(period) if period else math.inf

    def started(self, now: float | None) -> None:
        """The early flush of this period started at ``now`` (None: it was
        skipped): none other before the next snapshot."""
        self.due = math.inf
        self.running = now

    def finished(self, now: float) -> None:
        """The running early flush was seen finished at ``now``."""
        if self.running is not None:
            self._took.append(now - self.running)
            self.running = None


def flush_running(db: Any) -> bool:
    """Whether ``db`` still has an immutable memtable to flush."""
    try:
        return bool(db.property_int_value("rocksdb.num-immutable-mem-table"))
    except Exception:
        return False
def start_flush(db: Any) -> bool:
    """Make ``db``'s memtable immutable and have a background thread flush it,
    without waiting; not when the memtable is small or an earlier flush is
    still pending (RocksDB would block the caller until that one is done).
    Returns whether a flush was started."""
    try:
        pending = int(db.property_int_value("rocksdb.num-immutable-mem-table") or 0)
        size = int(db.property_int_value("rocksdb.cur-size-active-mem-table") or 0)
    except Exception:
        return False
    if pending or size < MIN_MEMTABLE:
        return False
    db.flush(False)
    return True
