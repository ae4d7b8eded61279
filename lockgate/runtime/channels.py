"""A task's data channels: listening for its inputs, connecting its outputs.

Every channel is a TCP connection from an upstream task to a downstream task
that starts with the HMAC challenge (:mod:`lockgate.runtime.wire`) and a
:class:`~lockgate.protocol.Hello` naming the job, the attempt and the
sending task: a connection of another job or attempt is refused (fencing).
On the input side one reader thread per channel decodes frames into stream
elements and puts them in the task's :class:`Mailbox`.
"""

from __future__ import annotations

import socket
import threading
from typing import BinaryIO

from lockgate.graph.types import Partitioning
from lockgate.protocol import END_OF_PARTITION, Address, ChannelLost, EndOfPartition, Hello
from lockgate.runtime import wire
from lockgate.runtime.mailbox import Mailbox
from lockgate.runtime.output import OutputEdgeWriter
from lockgate.runtime.spec import TaskSpec


def listen(spec: TaskSpec, num_channels: int) -> socket.socket | None:
    """The listener of a task with inputs (None without)."""
    if not num_channels:
        return None
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((spec.bind_host, 0))
    s.listen(num_channels + 8)
    return s


def connect_outputs(spec: TaskSpec, peers: dict[int, Address],
                    secret: bytes) -> list[OutputEdgeWriter]:
    """One writer per output edge, connected to every downstream task it
    sends to (a forward edge: only the task of the same index)."""
    hello = Hello("data", spec.job_id, spec.attempt, spec.task_id)
    writers = []
    for edge, targets in zip(spec.vertex.outputs, spec.outputs, strict=True):
        socks: list[socket.socket | None] = []
        for index, target in enumerate(targets):
            if edge.partitioning == Partitioning.FORWARD and index != spec.task_index:
                socks.append(None)
                continue
            sock = wire.connect(peers[target])
            reader = wire.reader_of(sock, 0)
            wire.authenticate_client(sock, reader, secret, hello)
            socks.append(sock)
        writers.append(OutputEdgeWriter(edge, socks, spec.task_index,
                                        spec.max_parallelism, spec.batch_size))
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
        self.sockets: list[socket.socket] = []
        self.ready = threading.Event()
        """Set when every input is connected, or accepting failed (``error``)."""
        self.error: BaseException | None = None

    def accept(self, listener: socket.socket) -> None:
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="accept").start()

    def _accept(self, listener: socket.socket) -> None:
        spec = self.spec
        pending = set(self.channel_of)
        try:
            while pending:
                sock, _ = listener.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = wire.reader_of(sock, 1 << 20)
                hello = wire.authenticate_server(sock, reader, self.secret)
                if (hello.role != "data" or hello.job != spec.job_id
                        or hello.attempt != spec.attempt or hello.task not in pending):
                    sock.close()  # another job, an older attempt, a duplicate: fenced off
                    continue
                pending.discard(hello.task)
                self.sockets.append(sock)
                ch = self.channel_of[hello.task]
                threading.Thread(target=self._read, args=(ch, reader),
                                 daemon=True, name=f"in-{ch}").start()
        except BaseException as e:
            self.error = e
        finally:
            listener.close()
            self.ready.set()

    def _read(self, ch: int, reader: BinaryIO) -> None:
        put = self.mailbox.put
        read_frame = wire.read_frame
        decode = wire.decode_element
        try:
            while True:
                element = decode(*read_frame(reader))
                put(ch, element)
                if element is END_OF_PARTITION or isinstance(element, EndOfPartition):
                    return
        except Exception as e:  # noqa: BLE001 - any end of the channel fails the task
            put(ch, ChannelLost(str(e) if isinstance(e, OSError | EOFError)
                                else f"undecodable input: {type(e).__name__}: {e}"))

    def close(self) -> None:
        for s in self.sockets:
            s.close()
