"""A task's figures for the dashboard and ``/metrics``: :class:`TaskMeter`.

Time is split as Flink splits it: *idle* is the task thread waiting on its
mailbox for input, *backpressured* is the thread blocked sending a batch
downstream (:attr:`OutputEdgeWriter.send_time`), *busy* is the rest. The task
thread only adds up two durations where it waits anyway (no per-record work);
a daemon thread reads the counters once a second and sends them to the
driver as one :class:`~lockgate.protocol.TaskMetrics` message on the control
connection (thread-safe sends), so the main loop pays nothing for it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from lockgate.protocol import ControlMessage, StreamElement, TaskMetrics

if TYPE_CHECKING:
    from lockgate.runtime.chain import OperatorChain
    from lockgate.runtime.mailbox import Mailbox, Overtaking
    from lockgate.runtime.operators import SourceOperator, StreamOperator
    from lockgate.runtime.output import OutputEdgeWriter
    from lockgate.runtime.valve import WatermarkValve

log = logging.getLogger("lockgate.task")

INTERVAL = 1.0
"""Seconds between two reports of a task."""

__all__ = ["INTERVAL", "MeteredTask", "TaskMeter"]


class MeteredTask(Protocol):
    """What the reporting thread reads of a task (``runtime.task.Task``)."""

    @property
    def outputs(self) -> list[OutputEdgeWriter]: ...

    @property
    def chain(self) -> OperatorChain: ...

    @property
    def ops(self) -> list[StreamOperator]: ...

    @property
    def valve(self) -> WatermarkValve: ...

    @property
    def source(self) -> SourceOperator | None: ...

    @property
    def reached_end(self) -> bool: ...

    @property
    def mailbox(self) -> Mailbox: ...


class TaskMeter:
    """Idle time of the task thread, and the thread that reports."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.idle = 0.0
        self.idle_since = 0.0
        """When the current wait began (0: not waiting)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wait(self, mailbox: Mailbox, timeout: float
             ) -> tuple[int, StreamElement | ControlMessage | Overtaking] | None:
        """``mailbox.take(timeout)``: the task thread waits for input, idle."""
        self.idle_since = waited = time.monotonic()
        item = mailbox.take(timeout)
        self.idle += time.monotonic() - waited
        self.idle_since = 0.0
        return item

    def start(self, task: MeteredTask, send: Callable[[ControlMessage], None],
              interval: float = INTERVAL) -> None:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._report, args=(task, send, interval),
                                        daemon=True, name="metrics")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def sample(self, task: MeteredTask) -> TaskMetrics:
        """The task's figures now (from the reporting thread: every read is of
        one attribute or one ``len``, each atomic under the GIL; a source
        reader's ``backlog()`` reads what its ``poll`` keeps up to date)."""
        now = time.monotonic()
        since = self.idle_since
        idle = self.idle + (now - since if since else 0.0)
        elapsed = now - self.started
        backpressured = sum(out.send_time for out in list(task.outputs))
        busy = max(0.0, elapsed - idle - backpressured)
        chain = task.chain
        records_in = chain.records_in
        records_out = chain.records_out + chain.written()
        keys = 0
        for op in task.ops:
            backend = op.backend
            if backend is not None:
                keys += backend.approximate_keys()
        watermark = task.valve.watermark
        source = task.source
        backlog = source.backlog() if source is not None and not task.reached_end else None
        return TaskMetrics(
            records_in, records_out, busy, backpressured, max(0.0, idle),
            task.mailbox.fill(), watermark if math.isfinite(watermark) else None, keys,
            backlog)

    def _report(self, task: MeteredTask, send: Callable[[ControlMessage], None],
                interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                send(self.sample(task))
            except OSError:
                return  # the control connection is gone: the task ends by it
            except Exception:
                log.debug("could not report the task's metrics", exc_info=True)
