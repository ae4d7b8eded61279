"""A task's data channels: listening for its inputs, connecting its outputs.

Every channel is a TCP connection from an upstream task to a downstream task
that starts with the HMAC challenge (:mod:`lockgate.runtime.handshake`) and a
:class:`~lockgate.protocol.Hello` naming the job, the attempt and the
sending task: a connection of another job or attempt is refused (fencing).
The data port takes connections like every listener (a deadline per
handshake, a bound on pending ones): a peer that fails the challenge, stalls,
or is not an expected upstream task of this attempt is dropped and the task
goes on waiting for its real inputs. On the input side one thread per channel
reads frames (each checked by its MAC, :class:`~lockgate.runtime.wire.Link`),
decodes them into stream elements and puts them in the task's :class:`Mailbox`.
"""

from __future__ import annotations

import socket
import threading

from lockgate.api.plan import Partitioning
from lockgate.errors import LockgateError
from lockgate.protocol import END_OF_PARTITION, Address, ChannelLost, EndOfPartition, Hello
from lockgate.runtime import handshake, wire
from lockgate.runtime.mailbox import Mailbox
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.spec import TaskSpec

UNALIGNED_SOCKET_BUFFER = 8 << 10
"""Unaligned checkpoints: the kernel's send and receive buffer of a data
channel (bytes; Linux doubles it). A barrier overtakes what is queued in a
task, never what the kernel holds: these bound the bytes ahead of it there
(autotuned, they grow to megabytes under backpressure)."""
UNALIGNED_READ_BUFFER = 16 << 10
"""Unaligned checkpoints: bytes a reader thread buffers ahead of the frame it
decodes (1 MiB otherwise)."""

BACKLOG = 128
"""Connections the data port's kernel queue holds before they are accepted
(its real peers must get in while others flood it)."""


def listen(spec: TaskSpec, num_channels: int) -> socket.socket | None:
    """The listener of a task with inputs (None without)."""
    if not num_channels:
        return None
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if spec.unaligned:  # accepted connections inherit it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNALIGNED_SOCKET_BUFFER)
    s.bind((spec.bind_host, 0))
    s.listen(BACKLOG)
    return s


def connect_outputs(spec: TaskSpec, peers: dict[int, Address],
                    secret: bytes) -> list[OutputEdgeWriter]:
    """One writer per output edge, connected to every downstream task it
    sends to (a forward edge: only the task of the same index)."""
    hello = Hello("data", spec.job_id, spec.attempt, spec.task_id)
    writers = []
    for edge, targets in zip(spec.vertex.outputs, spec.outputs, strict=True):
        links: list[wire.Link | None] = []
        for index, target in enumerate(targets):
            if edge.partitioning == Partitioning.FORWARD and index != spec.task_index:
                links.append(None)
                continue
            link = handshake.open_link(peers[target], secret, hello,
                                       encrypt=spec.encrypt_traffic,
                                       max_frame=spec.max_data_frame)
            if spec.unaligned:
                link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                     UNALIGNED_SOCKET_BUFFER)
            links.append(link)
        writers.append(OutputEdgeWriter(edge, links, spec.task_index,
                                        spec.max_parallelism, spec.batch_size,
                                        spec.buffer_timeout))
    return writers


class InputChannels:
    """Accepts the connections of every upstream task of this attempt (in a
    thread of its own) and reads each into the mailbox."""

    def __init__(self, spec: TaskSpec, secret: bytes, channel_of: dict[int, int],
                 mailbox: Mailbox) -> None:
        self.spec = spec
        self.secret = secret
        self.channel_of = channel_of
        """Channel number of each upstream task."""
        self.mailbox = mailbox
        self.links: list[wire.Link] = []
        self.ready = threading.Event()
        """Set when every input is connected, or accepting failed (``error``)."""
        self.error: BaseException | None = None
        self._pending = set(channel_of)
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def accept(self, listener: socket.socket) -> None:
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="accept").start()

    def _accept(self, listener: socket.socket) -> None:
        try:
            handshake.serve_connections(
                listener, self.secret, "data", self._serve,
                buffering=UNALIGNED_READ_BUFFER if self.spec.unaligned else 1 << 20,
                encrypt=self.spec.encrypt_traffic, max_frame=self.spec.max_data_frame)
        except BaseException as e:
            self.error = e
        finally:
            with self._lock:
                missing = sorted(self._pending)
            if missing and self.error is None and not self.ready.is_set():
                self.error = LockgateError(
                    f"the data port closed before upstream tasks {missing} connected")
            self.ready.set()

    def _serve(self, link: wire.Link, hello: Hello) -> None:
        """An authenticated connection: one of this attempt's upstream tasks
        that has not connected yet becomes its channel; anything else (another
        job, an older attempt, a duplicate) is fenced off."""
        spec = self.spec
        with self._lock:
            ok = (hello.role == "data" and hello.job == spec.job_id
                  and hello.attempt == spec.attempt and hello.task in self._pending)
            if ok:
                self._pending.discard(hello.task)
                self.links.append(link)
                complete = not self._pending
        if not ok:
            link.close()
            return
        if complete:
            if self._listener is not None:
                handshake.close_listener(self._listener)  # ends the accept loop
            self.ready.set()
        self._read(self.channel_of[hello.task], link)

    def _read(self, ch: int, link: wire.Link) -> None:
        put = self.mailbox.put
        recv = link.recv
        decode = wire.decode_element
        try:
            while True:
                element = decode(*recv())
                put(ch, element)
                if element is END_OF_PARTITION or isinstance(element, EndOfPartition):
                    return
        except Exception as e:
            put(ch, ChannelLost(str(e) if isinstance(e, OSError | EOFError)
                                else f"undecodable input: {type(e).__name__}: {e}"))

    def close(self) -> None:
        if self._listener is not None:
            handshake.close_listener(self._listener)
        with self._lock:
            links = list(self.links)
        for link in links:
            link.close()
