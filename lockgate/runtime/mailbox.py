"""The task's mailbox: bounded per-channel input queues plus control messages.

Reader threads (one per input channel) put decoded stream elements; the task
thread takes them, skipping channels that barrier alignment blocked. A full
channel queue blocks its reader thread, which stops reading the socket, which
fills the TCP buffers and so blocks the upstream sender: backpressure without
any unbounded buffer.
"""

from __future__ import annotations

import threading
from collections import deque

from lockgate.protocol import ControlMessage, StreamElement

CONTROL = -1
"""The channel number :meth:`Mailbox.take` gives a control message."""


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
        self.blocked: set[int] = set()

    def put(self, channel: int, element: StreamElement) -> None:
        """Called by a reader thread; blocks while the channel's queue is full."""
        with self._lock:
            q = self._queues[channel]
            while len(q) >= self._capacity and not self._closed:
                self._not_full.wait()
            q.append(element)
            self._not_empty.notify()

    def put_control(self, message: ControlMessage) -> None:
        with self._lock:
            self._control.append(message)
            self._not_empty.notify()

    def take(self, timeout: float | None) -> tuple[int, StreamElement | ControlMessage] | None:
        """Next ``(channel, element)``; control messages first, with
        ``channel == CONTROL``. ``None`` after ``timeout`` seconds."""
        with self._lock:
            while True:
                if self._control:
                    return CONTROL, self._control.popleft()
                n = len(self._queues)
                for i in range(n):
                    ch = (self._next + i) % n
                    q = self._queues[ch]
                    if q and ch not in self.blocked:
                        element = q.popleft()
                        self._next = ch + 1
                        if len(q) == self._capacity - 1:
                            self._not_full.notify_all()
                        return ch, element
                if not self._not_empty.wait(timeout):
                    return None

    def fill(self) -> float:
        """How full the input queues are, 0..1 (read without the lock: a
        monitoring estimate from another thread)."""
        queues = self._queues
        if not queues:
            return 0.0
        return min(1.0, sum(len(q) for q in queues) / (self._capacity * len(queues)))

    def take_control(self) -> ControlMessage | None:
        with self._lock:
            return self._control.popleft() if self._control else None

    def unblock_all(self) -> None:
        with self._lock:
            self.blocked.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()
