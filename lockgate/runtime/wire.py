"""Framing and authentication of every Lockgate TCP connection.

A frame is ``length:u32 | type:u8 | payload``. Every connection opens with a
mutual HMAC-SHA256 challenge on the job secret; nothing a peer sends is decoded
before it passed. Control frames carry a :mod:`lockgate.protocol` message as
msgpack (the driver never unpickles what a task sends); on a data channel
each stream element is a frame of its own type (:func:`element_frame`,
:func:`decode_element`), a batch of records pickled.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from enum import IntEnum
from typing import Any, BinaryIO, cast

import msgpack

from lockgate.errors import AuthenticationError
from lockgate.protocol import (
    END_OF_PARTITION,
    IDLE,
    Barrier,
    Batch,
    CancelBarrier,
    ControlMessage,
    EndOfData,
    EndOfPartition,
    Hello,
    Idle,
    ProtocolError,
    StreamElement,
    Watermark,
    decode_control,
    encode_control,
)
from lockgate.runtime import script_classes

log = logging.getLogger("lockgate.wire")

HEADER = struct.Struct(">IB")
NONCE_BYTES = 32
MAX_FRAME = 1 << 31


class Frame(IntEnum):
    """Frame types. Data-plane elements and control messages share the framing."""

    BATCH = 1
    BARRIER = 2
    END_OF_DATA = 3
    END_OF_PARTITION = 4
    CANCEL_BARRIER = 5
    WATERMARK = 6
    IDLE = 7
    CONTROL = 10
    HELLO = 11


class ConnectionClosed(EOFError):
    """The peer closed the connection (cleanly or not)."""


def _mac(secret: bytes, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(secret, nonce + role, hashlib.sha256).digest()


def _recv_exact(reader: BinaryIO, n: int) -> bytes:
    data = reader.read(n)
    if data is None or len(data) != n:
        raise ConnectionClosed(f"connection closed after {0 if not data else len(data)}/{n} bytes")
    return data


def authenticate_server(sock: socket.socket, reader: BinaryIO, secret: bytes) -> Hello:
    """Challenge a connecting peer, prove ourselves, and return its hello message."""
    nonce = os.urandom(NONCE_BYTES)
    sock.sendall(nonce)
    answer = _recv_exact(reader, 32 + NONCE_BYTES)
    if not hmac.compare_digest(answer[:32], _mac(secret, nonce, b"client")):
        raise AuthenticationError("peer failed the HMAC challenge: it does not hold the job secret")
    sock.sendall(_mac(secret, answer[32:], b"server"))
    kind, payload = read_frame(reader)
    if kind != Frame.HELLO:
        raise AuthenticationError(f"expected a hello frame, got {kind}")
    try:
        hello = decode_control(payload)
    except ProtocolError as e:
        raise AuthenticationError(f"malformed hello: {e}") from None
    if not isinstance(hello, Hello):
        raise AuthenticationError(f"expected a hello, got {hello.tag}")
    return hello


def serve_connections(
    listener: socket.socket, secret: bytes, what: str,
    handle: Callable[[socket.socket, BinaryIO, Hello], None],
    buffering: int = 0,
) -> None:
    """Accept connections on ``listener`` until it is closed; authenticate each
    in its own thread and hand it, with its hello message, to ``handle``. A
    peer that fails authentication is logged (as a refused ``what``
    connection) and dropped."""

    def serve(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = reader_of(sock, buffering)
        try:
            hello = authenticate_server(sock, reader, secret)
        except (AuthenticationError, OSError, EOFError, ValueError) as e:
            log.warning("refused a %s connection: %s", what, e)
            sock.close()
            return
        handle(sock, reader, hello)

    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(sock,), daemon=True, name=f"{what}-conn").start()


def authenticate_client(sock: socket.socket, reader: BinaryIO, secret: bytes,
                        hello: Hello) -> None:
    """Answer the server's challenge, check its proof, then send ``hello``."""
    nonce = _recv_exact(reader, NONCE_BYTES)
    mine = os.urandom(NONCE_BYTES)
    sock.sendall(_mac(secret, nonce, b"client") + mine)
    proof = _recv_exact(reader, 32)
    if not hmac.compare_digest(proof, _mac(secret, mine, b"server")):
        raise AuthenticationError(
            "server failed the HMAC challenge: it does not hold the job secret"
        )
    send_frame(sock, Frame.HELLO, encode_control(hello))


def read_frame(reader: BinaryIO) -> tuple[int, bytes]:
    """Read one frame; raise ConnectionClosed at end of stream."""
    header = reader.read(HEADER.size)
    if not header or len(header) < HEADER.size:
        raise ConnectionClosed("connection closed")
    length, kind = HEADER.unpack(header)
    return kind, _recv_exact(reader, length) if length else b""


def send_frame(sock: socket.socket, kind: int, payload: bytes = b"") -> None:
    """Send one frame (header and payload in one system call where possible)."""
    if len(payload) >= MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes is too large")
    sock.sendall(HEADER.pack(len(payload), kind) + payload if len(payload) < 65536
                 else HEADER.pack(len(payload), kind))
    if len(payload) >= 65536:
        sock.sendall(payload)


def encode_batch(records: list[Any]) -> bytes:
    # (records of the job script's classes: see lockgate.runtime.script_classes)
    return script_classes.dumps(records)


def decode_batch(payload: bytes) -> list[Any]:
    records: list[Any] = pickle.loads(payload)
    return records


def element_frame(element: StreamElement) -> tuple[Frame, bytes]:
    """The frame of an in-band element other than a batch (batches are sent
    by the output buffers, :func:`encode_batch`)."""
    match element:
        case Barrier(checkpoint_id, kind, timestamp):
            return Frame.BARRIER, msgpack.packb([checkpoint_id, kind, timestamp])
        case CancelBarrier(checkpoint_id):
            return Frame.CANCEL_BARRIER, msgpack.packb(checkpoint_id)
        case Watermark(timestamp):
            return Frame.WATERMARK, msgpack.packb(timestamp)
        case Idle():
            return Frame.IDLE, b""
        case EndOfData(drained):
            return Frame.END_OF_DATA, msgpack.packb(drained)
        case EndOfPartition():
            return Frame.END_OF_PARTITION, b""
    raise TypeError(f"{element!r} is not sent as an element frame")


def decode_element(kind: int, payload: bytes) -> StreamElement:
    """The stream element in a data channel's frame; :class:`ProtocolError`
    for a frame type or payload that a data channel never carries."""
    if kind == Frame.BATCH:
        return Batch(decode_batch(payload))
    try:
        value = msgpack.unpackb(payload) if payload else None
    except Exception as e:  # noqa: BLE001 - msgpack raises several kinds
        raise ProtocolError(f"undecodable frame of type {kind}: {e}") from None
    if kind == Frame.BARRIER and isinstance(value, list) and len(value) == 3 \
            and _is_int(value[0]) and isinstance(value[1], str) \
            and isinstance(value[2], int | float):
        return Barrier(value[0], value[1], value[2])
    if kind == Frame.CANCEL_BARRIER and isinstance(value, int) and not isinstance(value, bool):
        return CancelBarrier(value)
    if kind == Frame.WATERMARK and isinstance(value, int | float) \
            and not isinstance(value, bool):
        return Watermark(value)
    if kind == Frame.IDLE and value is None:
        return IDLE
    if kind == Frame.END_OF_DATA and isinstance(value, bool):
        return EndOfData(value)
    if kind == Frame.END_OF_PARTITION and value is None:
        return END_OF_PARTITION
    raise ProtocolError(f"a data channel carried a frame of type {kind} with {value!r:.80}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def reader_of(sock: socket.socket, buffering: int) -> BinaryIO:
    """A file to read ``sock`` with (``buffering`` 0: unbuffered)."""
    return cast(BinaryIO, sock.makefile("rb", buffering=buffering))


def connect(address: tuple[str, int], timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ControlChannel:
    """A channel of :mod:`lockgate.protocol` control messages over an
    authenticated socket; sends are thread-safe."""

    def __init__(self, sock: socket.socket, reader: BinaryIO) -> None:
        self.sock = sock
        self.reader = reader
        self._lock = threading.Lock()

    def send(self, message: ControlMessage) -> None:
        payload = encode_control(message)
        with self._lock:
            send_frame(self.sock, Frame.CONTROL, payload)

    def recv(self) -> ControlMessage:
        """The next message; :class:`ProtocolError` (a ``ValueError``) for
        one that breaks the protocol."""
        kind, payload = read_frame(self.reader)
        if kind != Frame.CONTROL:
            raise ConnectionClosed(f"unexpected frame {kind} on a control channel")
        return decode_control(payload)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
