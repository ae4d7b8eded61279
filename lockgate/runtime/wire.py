"""Framing and authentication of every Lockgate TCP connection.

A frame is ``length:u32 | type:u8 | payload``. Every connection opens with a
mutual HMAC-SHA256 challenge on the job secret; nothing a peer sends is decoded
before it passed. Control frames carry msgpack only (the driver never unpickles
what a task sends); data frames between authenticated tasks carry pickled
batches of records.
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
from typing import Any, BinaryIO

import msgpack

from lockgate.errors import AuthenticationError
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


def authenticate_server(sock: socket.socket, reader: BinaryIO, secret: bytes) -> dict[str, Any]:
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
    hello = msgpack.unpackb(payload)
    if not isinstance(hello, dict):
        raise AuthenticationError("malformed hello")
    return hello


def serve_connections(
    listener: socket.socket, secret: bytes, what: str,
    handle: Callable[[socket.socket, BinaryIO, dict[str, Any]], None],
    buffering: int = 0,
) -> None:
    """Accept connections on ``listener`` until it is closed; authenticate each
    in its own thread and hand it, with its hello message, to ``handle``. A
    peer that fails authentication is logged (as a refused ``what``
    connection) and dropped."""

    def serve(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb", buffering=buffering)
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


def authenticate_client(
    sock: socket.socket, reader: BinaryIO, secret: bytes, hello: dict[str, Any]
) -> None:
    """Answer the server's challenge, check its proof, then send ``hello``."""
    nonce = _recv_exact(reader, NONCE_BYTES)
    mine = os.urandom(NONCE_BYTES)
    sock.sendall(_mac(secret, nonce, b"client") + mine)
    proof = _recv_exact(reader, 32)
    if not hmac.compare_digest(proof, _mac(secret, mine, b"server")):
        raise AuthenticationError(
            "server failed the HMAC challenge: it does not hold the job secret"
        )
    send_frame(sock, Frame.HELLO, msgpack.packb(hello))


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
    return pickle.loads(payload)


def connect(address: tuple[str, int], timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ControlChannel:
    """A msgpack message channel over an authenticated socket; sends are thread-safe."""

    def __init__(self, sock: socket.socket, reader: BinaryIO) -> None:
        self.sock = sock
        self.reader = reader
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        payload = msgpack.packb(message, use_bin_type=True)
        with self._lock:
            send_frame(self.sock, Frame.CONTROL, payload)

    def recv(self) -> dict[str, Any]:
        kind, payload = read_frame(self.reader)
        if kind != Frame.CONTROL:
            raise ConnectionClosed(f"unexpected frame {kind} on a control channel")
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
