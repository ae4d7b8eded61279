"""Framing of every Lockgate TCP connection after its handshake
(:mod:`lockgate.runtime.handshake`).

A frame is ``length:u32 | type:u8 | payload | tag:16``. The tag is a
truncated HMAC-SHA256 over ``sequence:u64 | type | payload`` under the
connection's key for that direction (or, with encryption on, the payload is
sealed with AES-256-GCM, the sequence number as nonce). A :class:`Link`
checks the length against its limit before it reads the payload, and the tag
before it returns the payload: nothing a peer sends is decoded -- msgpack or
pickle -- before its tag verified, and a frame that was altered, dropped,
replayed or reordered fails the connection. docs/security.md says why and
what it costs.

Control frames carry a :mod:`lockgate.protocol` message as msgpack (the
driver never unpickles what a task sends); on a data channel each stream
element is a frame of its own type (:func:`element_frame`,
:func:`decode_element`), a batch of records pickled.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct
import threading
from enum import IntEnum
from typing import Any, BinaryIO, cast

import msgpack

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.errors import ConfigurationError
from lockgate.protocol import (
    END_OF_PARTITION,
    IDLE,
    Barrier,
    Batch,
    CancelBarrier,
    ControlMessage,
    EndOfData,
    EndOfPartition,
    Idle,
    ProtocolError,
    StreamElement,
    Watermark,
    decode_control,
    encode_control,
)
from lockgate.state import script_classes

log = logging.getLogger("lockgate.wire")

HEADER = struct.Struct(">IB")
SEQUENCE = struct.Struct(">11sB")
"""A frame's GMAC nonce: its sequence number (11 bytes) and type; the tag
covers the payload under it (a nonce is never reused under one key: each
connection and direction has its own)."""
TAG_BYTES = 16
MAX_CONTROL_FRAME = 64 << 20
"""Largest payload of a control frame (control port, leases): a message of
the protocol, far smaller."""
MAX_DATA_FRAME = 256 << 20
"""Default largest payload of a data frame (a pickled batch); the driver's
``LOCKGATE_MAX_DATA_FRAME`` (bytes) sets it for a job (:func:`max_data_frame`)."""


class Frame(IntEnum):
    """Frame types. Data-plane elements and control messages share the framing."""

    BATCH = 1
    BARRIER = 2
    END_OF_DATA = 3
    END_OF_PARTITION = 4
    CANCEL_BARRIER = 5
    WATERMARK = 6
    IDLE = 7
    ARROW_BATCH = 8
    """Record batches as one Arrow IPC stream (:mod:`lockgate.runtime.arrow_wire`)."""
    CONTROL = 10
    HELLO = 11


class ConnectionClosed(EOFError):
    """The peer closed the connection (cleanly or not)."""


class TamperedFrame(ProtocolError):
    """A frame whose tag did not verify: altered, dropped, replayed or
    reordered on the way, or sent by a peer without this connection's key."""


def max_data_frame() -> int:
    """The data-frame limit of a job the driver starts now: ``LOCKGATE_MAX_DATA_FRAME``
    (bytes), else :data:`MAX_DATA_FRAME`."""
    text = os.environ.get("LOCKGATE_MAX_DATA_FRAME")
    if not text:
        return MAX_DATA_FRAME
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 << 16 <= limit < 1 << 32:
        raise ValueError(f"LOCKGATE_MAX_DATA_FRAME must be a number of bytes in "
                         f"[65536, 2**32), got {text!r}")
    return limit


def check_encryption() -> None:
    """:class:`ConfigurationError` unless AES-GCM (the ``cryptography``
    package) is there: the driver checks before any task starts."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
    except ImportError as e:
        raise ConfigurationError(
            f"encrypt_traffic needs the cryptography package on the driver and every "
            f"worker (pip install 'cryptography>=42'): {e}") from None


# ------------------------------------------------------------------ links
class Link:
    """One authenticated connection: frames out and in, each with its tag.

    ``send`` is thread-safe; one thread reads (``recv``)."""

    def __init__(self, sock: socket.socket, reader: BinaryIO, keys: tuple[bytes, bytes],
                 *, encrypt: bool, max_frame: int) -> None:
        self.sock = sock
        self.reader = reader
        self.encrypt = encrypt
        self.max_frame = max_frame
        """Largest payload this end sends or accepts."""
        send_key, recv_key = keys
        self._send_seq = 0
        self._recv_seq = 0
        self._lock = threading.Lock()
        # AES-GCM either way: sealing the payload (encrypt), or as GMAC, the
        # payload only authenticated (the default) - with AES-NI and PCLMUL a
        # few times faster than HMAC-SHA256 on a batch
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        self._seal = AESGCM(send_key).encrypt
        self._open = AESGCM(recv_key).decrypt
        self._invalid = InvalidTag

    def send(self, kind: int, payload: bytes = b"") -> None:
        n = len(payload)
        if n > self.max_frame:
            raise ProtocolError(_too_large(n, self.max_frame))
        header = HEADER.pack(n, kind)
        with self._lock:
            seq = self._send_seq
            self._send_seq = seq + 1
            if self.encrypt:
                self.sock.sendall(header + self._seal(_nonce(seq), payload, header[4:]))
                return
            tag = self._seal(_mac_nonce(seq, kind), b"", payload)
            if n < 65536:
                self.sock.sendall(header + payload + tag)
            else:
                self.sock.sendall(header)
                self.sock.sendall(payload)
                self.sock.sendall(tag)

    def recv(self) -> tuple[int, bytes]:
        """The next frame's type and payload, its tag verified; :class:`ConnectionClosed`
        at the end of the stream, :class:`ProtocolError` for a frame over the
        limit (before reading it), :class:`TamperedFrame` for a bad tag."""
        header = self.reader.read(HEADER.size)
        if not header or len(header) < HEADER.size:
            raise ConnectionClosed("connection closed")
        n, kind = HEADER.unpack(header)
        if n > self.max_frame:
            raise ProtocolError(_too_large(n, self.max_frame))
        seq = self._recv_seq
        self._recv_seq = seq + 1
        if self.encrypt:
            sealed = recv_exact(self.reader, n + TAG_BYTES)
            try:
                return kind, self._open(_nonce(seq), sealed, header[4:])
            except self._invalid:
                raise TamperedFrame(f"frame {seq} (type {kind}, {n} bytes) failed "
                                    "authentication") from None
        payload = recv_exact(self.reader, n) if n else b""
        tag = recv_exact(self.reader, TAG_BYTES)
        try:
            self._open(_mac_nonce(seq, kind), tag, payload)
        except self._invalid:
            raise TamperedFrame(f"frame {seq} (type {kind}, {n} bytes) failed its MAC") from None
        return kind, payload

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _nonce(seq: int) -> bytes:
    return seq.to_bytes(12, "big")


def _mac_nonce(seq: int, kind: int) -> bytes:
    return SEQUENCE.pack(seq.to_bytes(11, "big"), kind)


def _too_large(n: int, limit: int) -> str:
    return (f"a frame of {n} bytes exceeds this connection's limit of {limit} bytes "
            "(a data channel: send fewer records per batch, Pipeline(batch_size=...), "
            "or raise LOCKGATE_MAX_DATA_FRAME on the driver)")


def recv_exact(reader: BinaryIO, n: int) -> bytes:
    data = reader.read(n)
    if data is None or len(data) != n:
        raise ConnectionClosed(f"connection closed after {0 if not data else len(data)}/{n} bytes")
    return data


def encode_batch(records: list[Any]) -> bytes:
    # (records of the job script's classes: see lockgate.state.script_classes)
    return script_classes.dumps(records)


def decode_batch(payload: bytes) -> list[Any]:
    """The records of a batch frame (whose tag verified: its sender holds the
    job secret); :class:`ProtocolError` for one that does not unpickle."""
    try:
        records = pickle.loads(payload)
    except Exception as e:
        raise ProtocolError(f"undecodable batch: {type(e).__name__}: {e}") from None
    if not isinstance(records, list):
        raise ProtocolError(f"a batch frame carried a {type(records).__name__}, not a list")
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


_BARRIER_KINDS = frozenset(k.value for k in BarrierKind)


def decode_element(kind: int, payload: bytes) -> StreamElement:
    """The stream element in a data channel's frame; :class:`ProtocolError`
    for a frame type or payload that a data channel never carries."""
    if kind == Frame.BATCH:
        return Batch(decode_batch(payload))
    if kind == Frame.ARROW_BATCH:
        from lockgate.runtime.arrow_wire import decode_arrow

        return Batch(decode_arrow(payload))
    try:
        value = msgpack.unpackb(payload) if payload else None
    except Exception as e:
        raise ProtocolError(f"undecodable frame of type {kind}: {e}") from None
    if kind == Frame.BARRIER and isinstance(value, list) and len(value) == 3 \
            and _is_int(value[0]) and isinstance(value[1], str) and value[1] in _BARRIER_KINDS \
            and isinstance(value[2], int | float):
        return Barrier(value[0], BarrierKind(value[1]), value[2])
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
    """A channel of :mod:`lockgate.protocol` control messages over a
    :class:`Link`; sends are thread-safe."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def send(self, message: ControlMessage) -> None:
        self.link.send(Frame.CONTROL, encode_control(message))

    def recv(self) -> ControlMessage:
        """The next message; :class:`ProtocolError` (a ``ValueError``) for
        one that breaks the protocol or fails its MAC."""
        kind, payload = self.link.recv()
        if kind != Frame.CONTROL:
            raise ConnectionClosed(f"unexpected frame {kind} on a control channel")
        return decode_control(payload)

    def close(self) -> None:
        self.link.close()
