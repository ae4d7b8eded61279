"""The barrier handler's controller for the alignment tests: it records what
the handler asks of it (``test_barriers.py``, ``test_barriers_unaligned.py``)."""

from __future__ import annotations

from lockgate.runtime.barriers import AbortReason


class Recorder:
    def __init__(self) -> None:
        self.blocked: set[int] = set()
        self.events: list[tuple] = []

    def block(self, channel: int) -> None:
        self.blocked.add(channel)

    def unblock_all(self) -> None:
        self.blocked.clear()
        self.events.append(("unblock",))

    def trigger_snapshot(self, checkpoint_id: int) -> None:
        self.events.append(("snapshot", checkpoint_id))

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.events.append(("abort", checkpoint_id, reason))

    def start_unaligned(self, checkpoint_id: int) -> None:
        self.events.append(("start", checkpoint_id))

    def record_overtaken(self, channel: int) -> None:
        self.events.append(("overtaken", channel))

    def finish_unaligned(self, checkpoint_id: int) -> None:
        self.events.append(("finish", checkpoint_id))
