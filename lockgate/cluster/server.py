"""The driver's control-plane server: one authenticated connection per task.

Reader threads turn what tasks send into events on one queue; the job master
handles them one at a time, so protocol decisions never race.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from typing import get_args

from lockgate.cluster.events import TaskDisconnected, TaskEvent, TaskMessage
from lockgate.protocol import ControlMessage, Hello, ProtocolError, ToDriver
from lockgate.runtime import handshake, wire

log = logging.getLogger("lockgate.driver")

TO_DRIVER = get_args(ToDriver)


class ControlServer:
    """The control port: every connection passes the job secret's challenge
    within a deadline (:func:`~lockgate.runtime.handshake.serve_connections`)
    and names a task of this job, or is dropped without affecting the job.
    With ``encrypt``, every frame is sealed with AES-GCM (docs/security.md)."""

    def __init__(self, secret: bytes, job_id: str, events: queue.Queue[TaskEvent],
                 host: str = "127.0.0.1", encrypt: bool = False) -> None:
        if encrypt:
            wire.check_encryption()
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
        threading.Thread(target=handshake.serve_connections,
                         args=(self._sock, secret, "control", self._serve),
                         kwargs={"buffering": 65536, "encrypt": encrypt},
                         daemon=True, name="control-accept").start()

    def _serve(self, link: wire.Link, hello: Hello) -> None:
        if hello.job != self.job_id or hello.role != "task":
            link.close()
            return
        attempt, task = hello.attempt, hello.task
        channel = wire.ControlChannel(link)
        with self._lock:
            self._channels[(attempt, task)] = channel
        try:
            while True:
                message = channel.recv()
                if not isinstance(message, TO_DRIVER):
                    raise ProtocolError(f"a task sent {message.tag!r}, which only the driver "
                                        "sends")
                self.events.put(TaskMessage(attempt, task, message))
        except (OSError, EOFError, ValueError) as e:
            if isinstance(e, ProtocolError):
                log.warning("task %d of attempt %d broke the protocol: %s", task, attempt, e)
            self.events.put(TaskDisconnected(attempt, task))
        finally:
            with self._lock:
                if self._channels.get((attempt, task)) is channel:
                    del self._channels[(attempt, task)]
            channel.close()

    def send(self, attempt: int, task: int, message: ControlMessage) -> bool:
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
        handshake.close_listener(self._sock)
        with self._lock:
            channels = list(self._channels.values())
        for c in channels:
            c.close()
