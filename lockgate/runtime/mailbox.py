"""The task's mailbox: bounded per-channel input queues plus control messages.

Reader threads (one per input channel) put decoded stream elements; the task
thread takes them, skipping channels that barrier alignment blocked. A full
channel queue blocks its reader thread, which stops reading the socket, which
fills the TCP buffers and so blocks the upstream sender: backpressure without
any unbounded buffer.

Unaligned checkpoints (``overtaking``): a checkpoint's barrier that a reader
puts goes ahead of the batches queued on its channel, as an
:class:`Overtaking` that counts them (they stay queued, and the task records
them as in-flight data); control messages still come first. A barrier
overtakes only batches, watermarks and idleness, never the end of a channel.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lockgate.protocol import Barrier, Batch, ControlMessage, Idle, StreamElement, Watermark

CONTROL = -1
"""The channel number :meth:`Mailbox.take` gives a control message."""

OVERTAKABLE = (Batch, Watermark, Idle)
"""What an unaligned barrier may overtake (in-flight data)."""


@dataclass(frozen=True, slots=True)
class Overtaking:
    """A barrier that went ahead of the first ``overtaken`` elements queued on
    its channel."""

    barrier: Barrier
    overtaken: int


class Mailbox:
    def __init__(self, num_channels: int, capacity: int = 4) -> None:
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._queues: list[deque[StreamElement]] = [deque() for _ in range(num_channels)]
        self._control: deque[ControlMessage] = deque()
        self._capacity = capacity
        self._next = 0
        self._closed = False
        self._woken = False
        self._blocked: set[int] = set()
        self._priority: deque[tuple[int, Overtaking]] = deque()
        self._overtaking: Callable[[Barrier], bool] | None = None
        """Unaligned checkpoints: which barriers overtake (None: none)."""

    def let_overtake(self, overtakes: Callable[[Barrier], bool]) -> None:
        """Unaligned checkpoints: from now on a barrier ``overtakes`` accepts
        goes ahead of the batches queued on its channel when it is put."""
        with self._lock:
            self._overtaking = overtakes

    def put(self, channel: int, element: StreamElement) -> None:
        """Called by a reader thread; blocks while the channel's queue is full."""
        with self._lock:
            q = self._queues[channel]
            if (type(element) is Barrier and self._overtaking is not None
                    and self._overtaking(element)
                    and all(type(e) in OVERTAKABLE for e in q)):
                self._priority.append((channel, Overtaking(element, len(q))))
                self._not_empty.notify()
                return
            while len(q) >= self._capacity and not self._closed:
                self._not_full.wait()
            q.append(element)
            self._not_empty.notify()

    def put_control(self, message: ControlMessage) -> None:
        with self._lock:
            self._control.append(message)
            self._not_empty.notify()

    def take(self, timeout: float | None
             ) -> tuple[int, StreamElement | ControlMessage | Overtaking] | None:
        """Next ``(channel, element)``; control messages first, with
        ``channel == CONTROL``, then overtaking barriers. ``None`` after
        ``timeout`` seconds."""
        with self._lock:
            while True:
                if self._control:
                    return CONTROL, self._control.popleft()
                if self._priority:
                    return self._priority.popleft()
                n = len(self._queues)
                for i in range(n):
                    ch = (self._next + i) % n
                    q = self._queues[ch]
                    if q and ch not in self._blocked:
                        element = q.popleft()
                        self._next = ch + 1
                        if len(q) == self._capacity - 1:
                            self._not_full.notify_all()
                        return ch, element
                if timeout != 0 and self._woken:
                    self._woken = False
                    return None
                if not self._not_empty.wait(timeout):
                    return None

    def fill(self) -> float:
        """How full the input queues are, 0..1 (read without the lock: a
        monitoring estimate from another thread)."""
        queues = self._queues
        if not queues:
            return 0.0
        return min(1.0, sum(len(q) for q in queues) / (self._capacity * len(queues)))

    def peek(self, channel: int, count: int) -> list[StreamElement]:
        """The first ``count`` elements queued on ``channel``, left in place."""
        with self._lock:
            q = self._queues[channel]
            return [q[i] for i in range(min(count, len(q)))]

    def promote(self, overtakes: Callable[[Barrier], bool]) -> None:
        """A checkpoint turned unaligned: its barriers already queued (those
        ``overtakes`` accepts) go ahead of what is queued before them."""
        with self._lock:
            for ch, q in enumerate(self._queues):
                for i, e in enumerate(q):
                    if type(e) is Barrier and overtakes(e):
                        if all(type(x) in OVERTAKABLE for x in list(q)[:i]):
                            del q[i]
                            self._priority.append((ch, Overtaking(e, i)))
                            self._not_empty.notify()
                            if len(q) == self._capacity - 1:
                                self._not_full.notify_all()
                        break
                    if type(e) not in OVERTAKABLE:
                        break

    def preload(self, channel: int, elements: list[StreamElement]) -> None:
        """Recovered in-flight data of ``channel``: queued before anything its
        reader puts (call before the reader starts)."""
        with self._lock:
            self._queues[channel].extend(elements)
            self._not_empty.notify()

    def wake(self) -> None:
        """End the current or next waiting ``take`` (any thread) with ``None``,
        as if its timeout had passed: the task looks at its timers again."""
        with self._lock:
            self._woken = True
            self._not_empty.notify()

    def take_control(self) -> ControlMessage | None:
        with self._lock:
            return self._control.popleft() if self._control else None

    def wait_control(self, timeout: float) -> ControlMessage | None:
        """The next control message, waiting up to ``timeout`` seconds for
        one; stream elements stay queued."""
        with self._lock:
            if not self._control and not self._closed:
                self._not_empty.wait(timeout)
            return self._control.popleft() if self._control else None

    def block(self, channel: int) -> None:
        """Barrier alignment: take nothing from ``channel`` until :meth:`unblock_all`."""
        with self._lock:
            self._blocked.add(channel)

    def unblock_all(self) -> None:
        with self._lock:
            self._blocked.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()
