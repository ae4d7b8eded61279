"""The barrier handler's controller and input gate for the alignment tests:
it records what the handler asks of them (``test_barriers.py``,
``test_barriers_unaligned.py``)."""

from __future__ import annotations

from collections.abc import Callable

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.protocol import Barrier, StreamElement, Watermark
from lockgate.runtime.barriers import AbortReason


def barrier(checkpoint_id: int, timestamp: float = 1000.0,
            kind: BarrierKind = BarrierKind.CHECKPOINT) -> Barrier:
    return Barrier(checkpoint_id, kind, timestamp)


class Recorder:
    def __init__(self) -> None:
        self.blocked: set[int] = set()
        self.events: list[tuple] = []
        self.barriers: list[Barrier] = []
        """The barriers handed over to snapshot (aligned or unaligned)."""
        self.alignments: list[float] = []
        """The alignment handed over with each finished snapshot."""
        self.promoted: list[Callable[[Barrier], bool]] = []
        self.peeked: list[tuple[int, int]] = []
        self.recorded: dict[int, list[StreamElement]] = {}

    # the controller
    def trigger_snapshot(self, barrier: Barrier, alignment: float) -> None:
        self.events.append(("snapshot", barrier.checkpoint_id))
        self.barriers.append(barrier)
        self.alignments.append(alignment)

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.events.append(("abort", checkpoint_id, reason))

    def start_unaligned(self, barrier: Barrier) -> None:
        self.events.append(("start", barrier.checkpoint_id))
        self.barriers.append(barrier)

    def record_input(self, channel: int, elements: list[StreamElement]) -> None:
        self.events.append(("overtaken", channel))
        self.recorded.setdefault(channel, []).extend(elements)

    def finish_unaligned(self, checkpoint_id: int, alignment: float) -> None:
        self.events.append(("finish", checkpoint_id))
        self.alignments.append(alignment)

    # the input gate
    def block(self, channel: int) -> None:
        self.blocked.add(channel)

    def unblock_all(self) -> None:
        self.blocked.clear()
        self.events.append(("unblock",))

    def promote(self, overtakes: Callable[[Barrier], bool]) -> None:
        self.promoted.append(overtakes)

    def peek(self, channel: int, count: int) -> list[StreamElement]:
        """``count`` elements said to be queued on ``channel``: watermarks 0, 1, ..."""
        self.peeked.append((channel, count))
        return [Watermark(float(i)) for i in range(count)]
