"""The task's input mailbox and its output buffers, driven directly."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import Counter

from lockgate.api.plan import Partitioning
from lockgate.graph.jobgraph import OutputEdge
from lockgate.protocol import Barrier, Batch, EndOfData, TriggerCheckpoint
from lockgate.runtime import wire
from lockgate.runtime.mailbox import CONTROL, Mailbox
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.state.keygroups import KeyGroupAssigner

# ---------------------------------------------------------------- mailbox


def test_control_messages_come_first_then_channels_round_robin() -> None:
    box = Mailbox(2)
    box.put(0, Batch([1]))
    box.put(0, Batch([2]))
    box.put(1, Batch([3]))
    box.put_control(TriggerCheckpoint(1))
    assert box.take(0) == (CONTROL, TriggerCheckpoint(1))
    assert [box.take(0) for _ in range(3)] == [(0, Batch([1])), (1, Batch([3])),
                                               (0, Batch([2]))]
    assert box.take(0.01) is None


def test_a_blocked_channel_is_skipped_until_unblocked() -> None:
    box = Mailbox(2)
    box.put(0, Barrier(1))
    box.put(0, Batch([1]))
    box.put(1, Batch([2]))
    box.block(0)
    assert box.take(0) == (1, Batch([2]))
    assert box.take(0.01) is None  # channel 0 holds elements, but it is blocked
    box.unblock_all()
    assert box.take(0) == (0, Barrier(1))


def test_a_full_channel_blocks_its_reader_until_the_task_takes_one() -> None:
    box = Mailbox(1, capacity=2)
    box.put(0, Batch([1]))
    box.put(0, Batch([2]))
    put = threading.Thread(target=box.put, args=(0, Batch([3])), daemon=True)
    put.start()
    put.join(0.2)
    assert put.is_alive(), "a third element went into a queue of capacity 2"
    assert box.take(0) == (0, Batch([1]))
    put.join(5)
    assert not put.is_alive()
    assert [box.take(0), box.take(0)] == [(0, Batch([2])), (0, Batch([3]))]


def test_close_releases_a_blocked_reader() -> None:
    box = Mailbox(1, capacity=1)
    box.put(0, Batch([1]))
    put = threading.Thread(target=box.put, args=(0, Batch([2])), daemon=True)
    put.start()
    box.close()
    put.join(5)
    assert not put.is_alive()


def test_take_waits_for_an_element() -> None:
    box = Mailbox(1)
    threading.Timer(0.05, box.put, args=(0, EndOfData(False))).start()
    assert box.take(5) == (0, EndOfData(False))


# ----------------------------------------------------------- output buffers
KEY = b"k" * 32


class Channels:
    """``n`` real connections: the writer's links and the readers' ends."""

    def __init__(self, n: int, forward_only: int | None = None) -> None:
        self.ends: list[wire.Link | None] = []
        self.links: list[wire.Link | None] = []
        for i in range(n):
            if forward_only is not None and i != forward_only:
                self.links.append(None)
                self.ends.append(None)
                continue
            a, b = socket.socketpair()
            self.links.append(wire.Link(a, wire.reader_of(a, 0), (KEY, KEY), encrypt=False,
                                        max_frame=1 << 24))
            self.ends.append(wire.Link(b, wire.reader_of(b, 1 << 16), (KEY, KEY),
                                       encrypt=False, max_frame=1 << 24))

    def received(self, i: int) -> list[object]:
        """Every element channel ``i`` received so far (it must end with a barrier)."""
        end = self.ends[i]
        assert end is not None
        out: list[object] = []
        while True:
            element = wire.decode_element(*end.recv())
            out.append(element)
            if isinstance(element, Barrier):
                return out


def writer(partitioning: Partitioning, channels: Channels, batch_size: int = 4,
           task_index: int = 0, buffer_timeout: float = 0.05) -> OutputEdgeWriter:
    edge = OutputEdge(1, len(channels.links), partitioning,
                      key_selector=(lambda r: r[0]) if partitioning == Partitioning.HASH
                      else None)
    return OutputEdgeWriter(edge, channels.links, task_index, 128, batch_size, buffer_timeout)


def records_of(elements: list[object]) -> list[object]:
    return [r for e in elements if isinstance(e, Batch) for r in e.records]


def test_hash_routes_every_key_to_its_key_groups_task_in_order_in_batches() -> None:
    ch = Channels(3)
    out = writer(Partitioning.HASH, ch, batch_size=4)
    records = [(i % 40, i) for i in range(200)]
    out.add(records[:60])
    out.add(records[60:])
    out.broadcast(Barrier(1))
    assigner = KeyGroupAssigner(128)
    for i in range(3):
        got = ch.received(i)
        assert got[-1] == Barrier(1)  # after every record: it never overtakes one
        batches = [e for e in got if isinstance(e, Batch)]
        assert len(batches) >= 2  # sent whenever a buffer reached the batch size
        want = [r for r in records if assigner.route([r[0]], 3)[0] == i]
        assert records_of(got) == want


def test_forward_sends_only_to_the_task_of_the_same_index() -> None:
    ch = Channels(3, forward_only=1)
    out = writer(Partitioning.FORWARD, ch, task_index=1)
    out.add(list(range(10)))
    out.broadcast(Barrier(2))
    assert records_of(ch.received(1)) == list(range(10))


def test_rebalance_deals_whole_batches_round_robin() -> None:
    ch = Channels(2)
    out = writer(Partitioning.REBALANCE, ch, batch_size=100)
    for b in range(4):
        out.add([b] * 3)
    out.broadcast(Barrier(3))
    got = [records_of(ch.received(i)) for i in range(2)]
    assert Counter(got[0]) + Counter(got[1]) == Counter({0: 3, 1: 3, 2: 3, 3: 3})
    assert {frozenset(g) for g in got} == {frozenset({0, 2}), frozenset({1, 3})}


def test_a_buffer_older_than_its_age_limit_is_sent_with_the_next_add() -> None:
    ch = Channels(1)
    out = writer(Partitioning.REBALANCE, ch, batch_size=1000, buffer_timeout=0.2)
    out.add([1])
    end = ch.ends[0]
    assert end is not None
    assert select.select([end.sock], [], [], 0.02)[0] == []  # not full: nothing sent yet
    time.sleep(0.22)
    out.add([2])
    assert wire.decode_element(*end.recv()) == Batch([1, 2])


def test_a_zero_buffer_timeout_sends_every_add_at_once() -> None:
    ch = Channels(1)
    out = writer(Partitioning.REBALANCE, ch, batch_size=1000, buffer_timeout=0.0)
    end = ch.ends[0]
    assert end is not None
    for n in range(3):
        out.add([n])
        assert wire.decode_element(*end.recv()) == Batch([n])


def test_wake_ends_a_waiting_take_and_is_not_lost_between_takes() -> None:
    box = Mailbox(1)
    # a wake before the wait: the next waiting take returns at once ...
    box.wake()
    assert box.take(0) is None  # ... a non-waiting take leaves it for the wait
    started = time.monotonic()
    assert box.take(5.0) is None
    assert time.monotonic() - started < 1.0
    # a wake during the wait (another thread: an async result) ends it
    timer = threading.Timer(0.05, box.wake)
    timer.start()
    started = time.monotonic()
    assert box.take(5.0) is None
    assert time.monotonic() - started < 2.0
    timer.join()
    # consumed: the next wait lasts its timeout
    started = time.monotonic()
    assert box.take(0.2) is None
    assert time.monotonic() - started >= 0.19
