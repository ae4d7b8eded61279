"""The driver's control-plane server: one authenticated connection per task.

Reader threads turn what tasks send into events on one queue; the job master
handles them one at a time, so protocol decisions never race.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any

from lockgate.runtime import wire

log = logging.getLogger("lockgate.driver")


@dataclass
class Event:
    kind: str
    """message | disconnected | exited | error"""
    attempt: int
    task: int
    message: dict[str, Any] | None = None
    exit_code: int | None = None


class ControlServer:
    def __init__(self, secret: bytes, job_id: str, events: queue.Queue[Event],
                 host: str = "127.0.0.1") -> None:
        self.secret = secret
        self.job_id = job_id
        self.events = events
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self.address: tuple[str, int] = self._sock.getsockname()
        self._channels: dict[tuple[int, int], wire.ControlChannel] = {}
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=wire.serve_connections,
                         args=(self._sock, secret, "control", self._serve, 65536),
                         daemon=True, name="control-accept").start()

    def _serve(self, sock: socket.socket, reader: Any, hello: dict[str, Any]) -> None:
        if hello.get("job") != self.job_id or hello.get("role") != "task":
            sock.close()
            return
        attempt, task = int(hello["attempt"]), int(hello["task"])
        channel = wire.ControlChannel(sock, reader)
        with self._lock:
            self._channels[(attempt, task)] = channel
        try:
            while True:
                self.events.put(Event("message", attempt, task, channel.recv()))
        except (OSError, EOFError, ValueError):
            self.events.put(Event("disconnected", attempt, task))
        finally:
            with self._lock:
                if self._channels.get((attempt, task)) is channel:
                    del self._channels[(attempt, task)]
            channel.close()

    def send(self, attempt: int, task: int, message: dict[str, Any]) -> bool:
        with self._lock:
            channel = self._channels.get((attempt, task))
        if channel is None:
            return False
        try:
            channel.send(message)
            return True
        except OSError:
            return False

    def drop_attempt(self, attempt: int) -> None:
        """Close every connection of ``attempt``: its tasks lose the coordinator."""
        with self._lock:
            doomed = [c for (a, _), c in self._channels.items() if a == attempt]
        for c in doomed:
            c.close()

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        with self._lock:
            channels = list(self._channels.values())
        for c in channels:
            c.close()
