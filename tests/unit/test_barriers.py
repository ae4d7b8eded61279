"""The barrier alignment state machine, driven event by event."""

from __future__ import annotations

import random

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.runtime.barriers import AbortReason, BarrierHandler
from tests.unit.barrier_recorder import Recorder, barrier


def test_aligned_blocks_until_every_channel_delivered():
    r = Recorder()
    h = BarrierHandler(3, r, r, aligned=True)
    h.barrier_received(0, barrier(1))
    assert r.blocked == {0} and r.events == []
    h.barrier_received(2, barrier(1))
    assert r.blocked == {0, 2} and r.events == []
    h.barrier_received(1, barrier(1))
    assert r.events == [("snapshot", 1), ("unblock",)]
    assert r.blocked == set()


def test_at_least_once_never_blocks():
    r = Recorder()
    h = BarrierHandler(2, r, r, aligned=False)
    h.barrier_received(1, barrier(5))
    assert r.blocked == set()
    h.barrier_received(0, barrier(5))
    assert r.events == [("snapshot", 5)]


def test_single_channel_snapshots_at_once():
    r = Recorder()
    h = BarrierHandler(1, r, r)
    h.barrier_received(0, barrier(1))
    h.barrier_received(0, barrier(2))
    assert [e for e in r.events if e[0] == "snapshot"] == [("snapshot", 1), ("snapshot", 2)]


def test_newer_barrier_subsumes_pending_alignment():
    r = Recorder()
    h = BarrierHandler(2, r, r)
    h.barrier_received(0, barrier(1))
    h.barrier_received(0, barrier(2))  # channel 0 already moved on: checkpoint 1 cannot align
    assert ("abort", 1, AbortReason.SUBSUMED) in r.events
    assert r.blocked == {0}
    h.barrier_received(1, barrier(1))  # late barrier of the aborted checkpoint: ignored
    assert r.blocked == {0}
    h.barrier_received(1, barrier(2))
    assert r.events[-2:] == [("snapshot", 2), ("unblock",)]


def test_end_of_partition_counts_as_delivered():
    r = Recorder()
    h = BarrierHandler(2, r, r)
    h.barrier_received(0, barrier(3))
    h.end_of_partition(1)
    assert r.events == [("snapshot", 3), ("unblock",)]
    h.barrier_received(0, barrier(4))
    assert r.events[-2] == ("snapshot", 4)


def test_cancel_barrier_aborts_and_unblocks():
    r = Recorder()
    h = BarrierHandler(2, r, r)
    h.barrier_received(0, barrier(7))
    h.cancel_received(1, 7)
    assert r.blocked == set()
    assert r.events[-1] == ("abort", 7, AbortReason.CANCELLED)
    h.barrier_received(1, barrier(7))  # stale
    assert r.blocked == set()
    h.cancel_received(0, 7)  # duplicate cancel: nothing more
    assert sum(1 for e in r.events if e[0] == "abort") == 1


def test_cancel_of_unseen_checkpoint_is_forwarded_once():
    r = Recorder()
    h = BarrierHandler(2, r, r)
    h.cancel_received(0, 4)
    h.cancel_received(1, 4)
    assert r.events == [("abort", 4, AbortReason.CANCELLED)]


def test_random_interleavings_snapshot_each_checkpoint_once_in_order():
    """Every channel delivers barriers 1..20 in order; any interleaving gives
    one snapshot per checkpoint, in increasing order, and never a block left over."""
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 5)
        r = Recorder()
        h = BarrierHandler(n, r, r)
        queues = {ch: list(range(1, 21)) for ch in range(n)}
        while any(queues.values()):
            ready = [ch for ch, q in queues.items() if q and ch not in r.blocked]
            assert ready, "deadlock: every channel with barriers left is blocked"
            ch = rng.choice(ready)
            h.barrier_received(ch, barrier(queues[ch].pop(0)))
        snaps = [e[1] for e in r.events if e[0] == "snapshot"]
        assert snaps == list(range(1, 21))
        assert r.blocked == set()


def test_alignment_time_is_first_to_last_barrier_and_zero_without_blocking():
    now = [10.0]
    r = Recorder()
    h = BarrierHandler(2, r, r, aligned=True, clock=lambda: now[0])
    h.barrier_received(0, barrier(1))
    now[0] = 10.25
    h.barrier_received(1, barrier(1))
    assert r.alignments == [0.25]  # handed over with the snapshot
    # at-least-once: nothing is blocked, so nothing is measured
    r = Recorder()
    loose = BarrierHandler(2, r, r, aligned=False, clock=lambda: now[0])
    loose.barrier_received(0, barrier(1))
    now[0] = 11.0
    loose.barrier_received(1, barrier(1))
    assert r.alignments == [0.0]
    # one input channel never waits
    r = Recorder()
    single = BarrierHandler(1, r, r, aligned=True, clock=lambda: now[0])
    single.barrier_received(0, barrier(1))
    assert r.alignments == [0.0]


def test_the_snapshot_gets_the_checkpoints_own_barrier_kind_and_trigger_time():
    """The barrier forwarded is the checkpoint's (a savepoint's kind, a stop's,
    its trigger time), never a late barrier of one given up."""
    r = Recorder()
    h = BarrierHandler(2, r, r)
    h.barrier_received(0, barrier(1, 50.0))
    h.barrier_received(0, barrier(2, 60.0, BarrierKind.STOP))  # subsumes 1
    h.barrier_received(1, barrier(1, 70.0))  # late: ignored
    assert h.barrier == barrier(2, 60.0, BarrierKind.STOP)
    h.barrier_received(1, barrier(2, 60.0, BarrierKind.STOP))
    assert r.barriers == [barrier(2, 60.0, BarrierKind.STOP)]
    assert h.barrier is None and h.pending is None
    h.barrier_received(0, barrier(3, 80.0, BarrierKind.SAVEPOINT))
    h.end_of_partition(1)
    assert r.barriers[-1] == barrier(3, 80.0, BarrierKind.SAVEPOINT)
