"""``NexmarkSource`` replays and rescales like the sequence source it is
built on: read partly at one parallelism, snapshot, restore at another, and
every event comes exactly once; each split's events are in event-time order."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.nexmark.generator import NexmarkGenerator
from benchmarks.nexmark.source import NexmarkSource, event_time
from lockgate.connectors.base import TaskInfo

N = 5_000


def readers(source: NexmarkSource, p: int, state: list | None):
    out = []
    for i in range(p):
        r = source.create_reader(TaskInfo("job", "events", i, p, 128, 0))
        r.restore(state)
        out.append(r)
    return out


@pytest.mark.parametrize("before,after", [(2, 3), (3, 1), (2, 2)])
def test_a_restore_at_any_parallelism_reads_every_event_once(before, after):
    source = NexmarkSource(N)
    got: list = []
    first = readers(source, before, None)
    for r in first:
        for _ in range(3):
            batch = r.poll(200)
            assert batch is not None
            times = [event_time(e) for e in batch]
            assert times == sorted(times)  # a stride of the event numbers: in time order
            got += batch
    state = [entry for r in first for entry in r.snapshot_state(1)]
    for r in readers(source, after, state):
        while (batch := r.poll(500)) is not None:
            got += batch
    expected = NexmarkGenerator().events(0, N)
    assert Counter(got) == Counter(expected)
