"""The barrier handler in unaligned mode (FLIP-76), driven event by event:
snapshot at the first barrier, in-flight data recorded until the last, the
aligned timeout, savepoints aligned, aborts. Pure, like test_barriers.py."""

from __future__ import annotations

from lockgate.runtime.barriers import AbortReason, BarrierHandler
from tests.unit.barrier_recorder import Recorder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def handler(n: int, r: Recorder, clock: Clock | None = None, timeout: float | None = None
            ) -> BarrierHandler:
    clock = clock or Clock()
    return BarrierHandler(n, r, aligned=True, clock=clock, unaligned=True,
                          aligned_timeout=timeout, wall_clock=clock)


def test_first_barrier_snapshots_at_once_and_records_the_others_until_their_barrier():
    r = Recorder()
    h = handler(3, r)
    h.barrier_received(1, 1, priority=True, timestamp=1000.0)
    assert r.events == [("start", 1), ("overtaken", 1)]
    assert r.blocked == set()  # nothing blocks
    assert h.recording == {0, 2}
    h.barrier_received(0, 1, priority=True, timestamp=1000.0)
    assert r.events[-1] == ("overtaken", 0) and h.recording == {2}
    h.barrier_received(2, 1, timestamp=1000.0)  # in order: it overtook nothing
    assert r.events[-1] == ("finish", 1)
    assert h.recording == set() and h.pending is None
    assert ("snapshot", 1) not in r.events


def test_single_channel_takes_and_finishes_at_once():
    r = Recorder()
    h = handler(1, r)
    h.barrier_received(0, 4, priority=True)
    assert r.events == [("start", 4), ("overtaken", 0), ("finish", 4)]


def test_savepoint_barriers_stay_aligned():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, 2, may_overtake=False)
    assert r.blocked == {0} and r.events == []
    assert h.recording == set()
    h.barrier_received(1, 2, may_overtake=False)
    assert r.events == [("snapshot", 2), ("unblock",)]


def test_aligned_timeout_starts_aligned_and_turns_unaligned():
    clock = Clock()
    r = Recorder()
    h = handler(3, r, clock, timeout=0.5)
    h.barrier_received(0, 1, timestamp=clock.now)
    assert r.blocked == {0} and r.events == []
    clock.now += 0.3
    h.check_timeout()
    assert r.events == []  # not yet
    clock.now += 0.3
    h.check_timeout()
    # unaligned now: snapshot, channel 0 unblocked (its data is after the
    # barrier), channels 1 and 2 recorded until their barriers
    assert r.events == [("start", 1), ("unblock",)]
    assert r.blocked == set() and h.recording == {1, 2}
    h.barrier_received(2, 1, priority=True)  # promoted in the mailbox
    h.barrier_received(1, 1, priority=True)
    assert r.events[-3:] == [("overtaken", 2), ("overtaken", 1), ("finish", 1)]


def test_a_barrier_older_than_the_timeout_is_unaligned_from_the_start():
    clock = Clock()
    r = Recorder()
    h = handler(2, r, clock, timeout=0.5)
    h.barrier_received(1, 1, timestamp=clock.now - 2.0)
    assert r.events == [("start", 1)] and h.recording == {0}


def test_priority_barrier_turns_an_aligned_checkpoint_unaligned():
    clock = Clock()
    r = Recorder()
    h = handler(3, r, clock, timeout=5.0)
    h.barrier_received(0, 1, timestamp=clock.now)
    assert r.blocked == {0}
    h.barrier_received(1, 1, priority=True, timestamp=clock.now)  # the mailbox let it overtake
    assert r.events == [("start", 1), ("unblock",), ("overtaken", 1)]
    assert h.recording == {2}


def test_newer_barrier_aborts_the_unaligned_checkpoint_and_its_recording():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, 1, priority=True)
    assert h.recording == {1}
    h.barrier_received(0, 2, priority=True)
    assert ("abort", 1, AbortReason.SUBSUMED) in r.events
    assert r.events[-2:] == [("start", 2), ("overtaken", 0)]
    assert h.recording == {1}
    h.barrier_received(1, 1, priority=True)  # late: ignored, nothing recorded for it
    assert r.events[-1] == ("overtaken", 0)
    h.barrier_received(1, 2, priority=True)
    assert r.events[-2:] == [("overtaken", 1), ("finish", 2)]


def test_cancel_barrier_aborts_and_stops_recording():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, 3, priority=True)
    h.cancel_received(1, 3)
    assert r.events[-1] == ("abort", 3, AbortReason.CANCELLED)
    assert h.recording == set() and h.pending is None
    h.barrier_received(1, 3, priority=True)
    assert r.events[-1] == ("abort", 3, AbortReason.CANCELLED)  # nothing new


def test_end_of_partition_stops_recording_that_channel_and_completes():
    r = Recorder()
    h = handler(3, r)
    h.barrier_received(2, 5, priority=True)
    assert h.recording == {0, 1}
    h.end_of_partition(0)
    assert h.recording == {1} and r.events[-1] == ("overtaken", 2)
    h.end_of_partition(1)
    assert r.events[-1] == ("finish", 5)


def test_alignment_is_the_time_from_first_to_last_barrier():
    clock = Clock()
    r = Recorder()
    h = BarrierHandler(2, r, clock=clock, unaligned=True, wall_clock=clock)
    h.barrier_received(0, 1, priority=True)
    clock.now += 0.25
    h.barrier_received(1, 1, priority=True)
    assert abs(h.take_alignment() - 0.25) < 1e-9


def test_at_least_once_ignores_unaligned():
    r = Recorder()
    h = BarrierHandler(2, r, aligned=False, unaligned=True)
    assert not h.unaligned
    h.barrier_received(0, 1)
    h.barrier_received(1, 1)
    assert r.events == [("snapshot", 1)]
