"""The barrier handler in unaligned mode (FLIP-76), driven event by event:
snapshot at the first barrier, in-flight data recorded until the last, the
aligned timeout, savepoints aligned, aborts. Pure, like test_barriers.py."""

from __future__ import annotations

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.protocol import Watermark
from lockgate.runtime.barriers import TICK, AbortReason, BarrierHandler
from tests.unit.barrier_recorder import Recorder, barrier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def handler(n: int, r: Recorder, clock: Clock | None = None, timeout: float | None = None
            ) -> BarrierHandler:
    clock = clock or Clock()
    return BarrierHandler(n, r, r, aligned=True, clock=clock, unaligned=True,
                          aligned_timeout=timeout, wall_clock=clock)


def test_first_barrier_snapshots_at_once_and_records_the_others_until_their_barrier():
    r = Recorder()
    h = handler(3, r)
    h.barrier_received(1, barrier(1, 1000.0), 0)
    assert r.events == [("start", 1), ("overtaken", 1)]
    assert r.blocked == set()  # nothing blocks
    assert h.recording == {0, 2}
    h.barrier_received(0, barrier(1, 1000.0), 0)
    assert r.events[-1] == ("overtaken", 0) and h.recording == {2}
    h.barrier_received(2, barrier(1, 1000.0))  # in order: it overtook nothing
    assert r.events[-1] == ("finish", 1)
    assert h.recording == set() and h.pending is None
    assert ("snapshot", 1) not in r.events


def test_single_channel_takes_and_finishes_at_once():
    r = Recorder()
    h = handler(1, r)
    h.barrier_received(0, barrier(4), 0)
    assert r.events == [("start", 4), ("overtaken", 0), ("finish", 4)]


def test_savepoint_barriers_stay_aligned():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, barrier(2, kind=BarrierKind.SAVEPOINT))
    assert r.blocked == {0} and r.events == []
    assert h.recording == set()
    h.barrier_received(1, barrier(2, kind=BarrierKind.SAVEPOINT))
    assert r.events == [("snapshot", 2), ("unblock",)]


def test_aligned_timeout_starts_aligned_and_turns_unaligned():
    clock = Clock()
    r = Recorder()
    h = handler(3, r, clock, timeout=0.5)
    h.barrier_received(0, barrier(1, clock.now))
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
    h.barrier_received(2, barrier(1), 0)  # promoted in the mailbox
    h.barrier_received(1, barrier(1), 0)
    assert r.events[-3:] == [("overtaken", 2), ("overtaken", 1), ("finish", 1)]


def test_a_barrier_older_than_the_timeout_is_unaligned_from_the_start():
    clock = Clock()
    r = Recorder()
    h = handler(2, r, clock, timeout=0.5)
    h.barrier_received(1, barrier(1, clock.now - 2.0))
    assert r.events == [("start", 1)] and h.recording == {0}


def test_priority_barrier_turns_an_aligned_checkpoint_unaligned():
    clock = Clock()
    r = Recorder()
    h = handler(3, r, clock, timeout=5.0)
    h.barrier_received(0, barrier(1, clock.now))
    assert r.blocked == {0}
    h.barrier_received(1, barrier(1, clock.now), 0)  # the mailbox let it overtake
    assert r.events == [("start", 1), ("unblock",), ("overtaken", 1)]
    assert h.recording == {2}


def test_newer_barrier_aborts_the_unaligned_checkpoint_and_its_recording():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, barrier(1), 0)
    assert h.recording == {1}
    h.barrier_received(0, barrier(2), 0)
    assert ("abort", 1, AbortReason.SUBSUMED) in r.events
    assert r.events[-2:] == [("start", 2), ("overtaken", 0)]
    assert h.recording == {1}
    h.barrier_received(1, barrier(1), 0)  # late: ignored, nothing recorded for it
    assert r.events[-1] == ("overtaken", 0)
    h.barrier_received(1, barrier(2), 0)
    assert r.events[-2:] == [("overtaken", 1), ("finish", 2)]


def test_cancel_barrier_aborts_and_stops_recording():
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, barrier(3), 0)
    h.cancel_received(1, 3)
    assert r.events[-1] == ("abort", 3, AbortReason.CANCELLED)
    assert h.recording == set() and h.pending is None
    h.barrier_received(1, barrier(3), 0)
    assert r.events[-1] == ("abort", 3, AbortReason.CANCELLED)  # nothing new


def test_end_of_partition_stops_recording_that_channel_and_completes():
    r = Recorder()
    h = handler(3, r)
    h.barrier_received(2, barrier(5), 0)
    assert h.recording == {0, 1}
    h.end_of_partition(0)
    assert h.recording == {1} and r.events[-1] == ("overtaken", 2)
    h.end_of_partition(1)
    assert r.events[-1] == ("finish", 5)


def test_alignment_is_the_time_from_first_to_last_barrier():
    clock = Clock()
    r = Recorder()
    h = BarrierHandler(2, r, r, clock=clock, unaligned=True, wall_clock=clock)
    h.barrier_received(0, barrier(1), 0)
    clock.now += 0.25
    h.barrier_received(1, barrier(1), 0)
    assert r.events[-1] == ("finish", 1)
    assert abs(r.alignments[-1] - 0.25) < 1e-9


def test_at_least_once_ignores_unaligned():
    r = Recorder()
    h = BarrierHandler(2, r, r, aligned=False, unaligned=True)
    assert not h.unaligned
    h.barrier_received(0, barrier(1))
    h.barrier_received(1, barrier(1))
    assert r.events == [("snapshot", 1)]


def test_overtaken_elements_are_peeked_after_the_snapshot_and_recorded():
    """The elements a barrier overtook are read from the queue after the
    snapshot started, and queued barriers of the checkpoint then overtake too."""
    r = Recorder()
    h = handler(2, r)
    h.barrier_received(0, barrier(4), 2)
    assert r.events == [("start", 4), ("overtaken", 0)]
    assert r.peeked == [(0, 2)] and r.recorded[0] == [Watermark(0.0), Watermark(1.0)]
    [promote] = r.promoted
    assert promote(barrier(4)) and not promote(barrier(5))
    h.barrier_received(1, barrier(4))  # in order: nothing overtaken
    assert r.peeked == [(0, 2)] and r.events[-1] == ("finish", 4)


def test_which_barriers_overtake():
    clock = Clock()
    r = Recorder()
    at_once = handler(2, r, clock)
    assert at_once.overtakes(barrier(1, clock.now))
    assert not at_once.overtakes(barrier(1, clock.now, BarrierKind.SAVEPOINT))
    assert not at_once.overtakes(barrier(1, clock.now, BarrierKind.STOP))
    assert not at_once.overtakes(barrier(1, clock.now, BarrierKind.FINAL))
    timed = handler(2, r, clock, timeout=0.5)
    assert not timed.overtakes(barrier(1, clock.now - 0.4))
    assert timed.overtakes(barrier(1, clock.now - 0.6))
    assert not timed.overtakes(barrier(1, clock.now - 0.6, BarrierKind.SAVEPOINT))


def test_tick_promotes_old_barriers_and_times_out_every_tick():
    clock = Clock()
    r = Recorder()
    h = handler(2, r, clock, timeout=0.5)
    assert h.tick(1.0) == 1.0  # nothing pending: the loop may wait as long as it likes
    assert len(r.promoted) == 1 and r.promoted[0] == h.overtakes
    assert h.tick(1.0) == 1.0 and len(r.promoted) == 1  # not a tick later yet
    h.barrier_received(0, barrier(1, clock.now))
    assert r.blocked == {0}
    clock.now += TICK
    assert h.tick(1.0) == TICK  # pending: look again a tick later
    assert r.events == [] and len(r.promoted) == 2
    clock.now += 0.6
    h.tick(1.0)  # older than the timeout: unaligned now
    assert r.events == [("start", 1), ("unblock",)] and h.recording == {1}
