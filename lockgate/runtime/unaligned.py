"""The task's part in unaligned checkpoints (FLIP-76), as a mixin of
:class:`~lockgate.runtime.task.Task`: the unaligned steps of the barrier
handler's :class:`~lockgate.runtime.barriers.Controller`.

* :meth:`start_unaligned` (the first barrier): operator state is captured,
  the records the outputs buffered become output channel state, and the
  barrier is sent ahead of them.
* :meth:`record_input`: the elements a barrier overtook, and what the task
  takes from a channel in ``barriers.recording``, are input channel state.
* :meth:`finish_unaligned` (every barrier arrived): the snapshot writer
  stores operator state and in-flight data and acknowledges.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lockgate.protocol import Barrier, ControlMessage, StreamElement
from lockgate.runtime.channel_state import InFlight, InFlightCapture
from lockgate.runtime.faults import FaultInjector
from lockgate.runtime.operators import StreamOperator
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.snapshots import SnapshotWriter


class UnalignedCheckpoints:
    ops: list[StreamOperator]
    outputs: list[OutputEdgeWriter]
    faults: FaultInjector
    snapshots: SnapshotWriter
    in_flight: InFlightCapture
    replaying: dict[int, int]
    reached_end: bool
    drained: bool
    _counts: Callable[[], tuple[int, int]]
    _send: Callable[[ControlMessage], None]

    def start_unaligned(self, barrier: Barrier) -> None:
        """The first barrier of an unaligned checkpoint: snapshot now, the
        outputs' unsent records become output channel state, the barrier goes
        out ahead of them."""
        started = time.monotonic()
        checkpoint_id = barrier.checkpoint_id
        snaps = [(op, op.snapshot(checkpoint_id)) for op in self.ops]
        read, written = self._counts()
        self.in_flight.begin(InFlight(
            checkpoint_id, snaps, read, written, self.reached_end and not self.drained,
            self.reached_end, time.monotonic() - started), self.outputs)
        for out in self.outputs:
            out.send_ahead(barrier)
        self.faults.hit("unaligned_barrier")

    def record_input(self, channel: int, elements: list[StreamElement]) -> None:
        self.in_flight.add_input(channel, elements)

    def finish_unaligned(self, checkpoint_id: int, alignment: float) -> None:
        snap = self.in_flight.take()
        assert snap is not None and snap.checkpoint_id == checkpoint_id
        self.snapshots.submit(checkpoint_id, snap.snaps, read=snap.read, written=snap.written,
                              finished=snap.finished, alignment=alignment,
                              final=snap.final, sync_duration=snap.sync_duration,
                              in_flight=snap)

    def _replayed(self, ch: int) -> None:
        """A recovered in-flight element of ``ch`` is taken."""
        self.faults.hit("replay")
        left = self.replaying[ch] - 1
        if left:
            self.replaying[ch] = left
        else:
            del self.replaying[ch]
