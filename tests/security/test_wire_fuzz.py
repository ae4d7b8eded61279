"""Fuzz of the wire: the frame reader (:meth:`Link.recv`, with
MACs and with AES-GCM), both sides of the handshake, ``decode_control`` and
``decode_element``, fed random bytes and mutations of valid frames. Each may
raise only the documented exceptions -- ``ProtocolError``,
``AuthenticationError``, ``ConnectionClosed`` and ``OSError`` -- and never
hangs (every socket has a timeout; the writer closes after its bytes).

Brief in CI (100 examples per test); a longer run::

    LOCKGATE_FUZZ_EXAMPLES=20000 python3 -m pytest -q tests/security/test_wire_fuzz.py
"""

from __future__ import annotations

import os
import socket
import threading

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate.errors import AuthenticationError
from lockgate.protocol import (
    END_OF_PARTITION,
    Barrier,
    EndOfData,
    Hello,
    ProtocolError,
    Register,
    TriggerCheckpoint,
    Watermark,
    decode_control,
    encode_control,
)
from lockgate.runtime import handshake, wire

EXAMPLES = int(os.environ.get("LOCKGATE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DOCUMENTED = (ProtocolError, AuthenticationError, wire.ConnectionClosed, OSError)
SECRET = b"f" * 32
KEYS = (b"a" * 32, b"b" * 32)
HELLO = Hello("data", "job", 1, 2)


def frames_of(encrypt: bool) -> bytes:
    """A valid stream: a batch, a barrier, a watermark, a control message, end of data."""
    a, b = socket.socketpair()
    link = wire.Link(a, wire.reader_of(a, 0), KEYS, encrypt=encrypt, max_frame=1 << 16)
    link.send(wire.Frame.BATCH, wire.encode_batch([1, "two", (3.0, None)]))
    for element in (Barrier(4, "checkpoint", 17), Watermark(99), EndOfData(False),
                    END_OF_PARTITION):
        link.send(*wire.element_frame(element))
    link.send(wire.Frame.CONTROL, encode_control(TriggerCheckpoint(5)))
    link.close()
    data = b""
    while chunk := b.recv(65536):
        data += chunk
    b.close()
    return data


VALID = {False: frames_of(False), True: frames_of(True)}


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with a few bytes flipped, inserted or deleted, or cut short."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        match draw(st.sampled_from(["flip", "insert", "delete", "cut", "length"])):
            case "flip":
                data[i] ^= 1 << draw(st.integers(0, 7))
            case "insert":
                data[i:i] = draw(st.binary(min_size=1, max_size=8))
            case "delete":
                del data[i:i + draw(st.integers(1, 8))]
            case "cut":
                del data[i:]
            case "length":  # a frame header's length field
                data[i:i + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    return bytes(data)


def feed(data: bytes) -> tuple[socket.socket, socket.socket]:
    """A socket to read ``data`` from (then end of stream), with a timeout;
    and its peer, which a handshake may write to."""
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    threading.Thread(target=_write_and_close, args=(b, data), daemon=True).start()
    return a, b


def _write_and_close(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def read_all(link: wire.Link, limit: int) -> None:
    """Read and decode frames until the stream fails; at most ``limit`` frames."""
    for _ in range(limit):
        kind, payload = link.recv()
        if kind == wire.Frame.CONTROL:
            decode_control(payload)
        else:
            wire.decode_element(kind, payload)
    raise AssertionError("more frames than bytes")


@pytest.mark.parametrize("encrypt", [False, True], ids=["mac", "aes-gcm"])
@FUZZ
@given(data=st.data())
def test_the_frame_reader_raises_only_documented_errors(encrypt: bool, data) -> None:
    raw = data.draw(st.one_of(st.binary(max_size=4096), mutated(VALID[encrypt])))
    sock, peer = feed(raw)
    link = wire.Link(sock, wire.reader_of(sock, 0), KEYS[::-1], encrypt=encrypt,
                     max_frame=1 << 16)
    with pytest.raises(DOCUMENTED):
        read_all(link, len(raw) + 1)
    sock.close()


def test_the_valid_stream_reads_back() -> None:
    for encrypt, raw in VALID.items():
        sock, _ = feed(raw)
        link = wire.Link(sock, wire.reader_of(sock, 0), KEYS[::-1], encrypt=encrypt,
                         max_frame=1 << 16)
        with pytest.raises(wire.ConnectionClosed):
            read_all(link, 7)
        sock.close()


@FUZZ
@given(raw=st.binary(max_size=512))
def test_the_server_handshake_raises_only_documented_errors(raw: bytes) -> None:
    sock, _ = feed(raw)
    with pytest.raises(DOCUMENTED):
        handshake.authenticate_server(sock, wire.reader_of(sock, 0), SECRET, timeout=2)
    sock.close()


@pytest.mark.parametrize("encrypt", [False, True], ids=["mac", "aes-gcm"])
@FUZZ
@given(data=st.data())
def test_a_mutated_hello_after_a_valid_challenge_raises_only_documented_errors(
        encrypt: bool, data) -> None:
    """A client that knows the secret answers the challenge, then sends a
    mutated hello frame (or random bytes)."""
    server, client = socket.socketpair()
    server.settimeout(5)
    client.settimeout(5)
    result: list[BaseException | object] = []

    def serve() -> None:
        try:
            result.append(handshake.authenticate_server(server, wire.reader_of(server, 0),
                                                        SECRET, encrypt=encrypt, timeout=3))
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    nonce = client.recv(handshake.NONCE_BYTES)
    mine = os.urandom(handshake.NONCE_BYTES)
    client.sendall(handshake._mac(SECRET, nonce, b"client") + mine)
    client.recv(32)
    keys = handshake._keys(SECRET, nonce, mine, encrypt)
    a, b = socket.socketpair()
    hello_link = wire.Link(a, wire.reader_of(a, 0), keys, encrypt=encrypt, max_frame=1 << 16)
    hello_link.send(wire.Frame.HELLO, encode_control(HELLO))
    valid_hello = b.recv(65536)
    hello_link.close(), b.close()
    client.sendall(data.draw(st.one_of(st.binary(max_size=256), mutated(valid_hello))))
    client.shutdown(socket.SHUT_WR)
    t.join(10)
    assert not t.is_alive(), "the handshake hung"
    outcome = result[0]
    if isinstance(outcome, tuple):  # the mutation left the hello valid
        assert outcome[1] == HELLO
    else:
        assert isinstance(outcome, DOCUMENTED), repr(outcome)
    server.close(), client.close()


@FUZZ
@given(raw=st.binary(max_size=512))
def test_the_client_handshake_raises_only_documented_errors(raw: bytes) -> None:
    sock, _ = feed(raw)
    with pytest.raises(DOCUMENTED):
        handshake.authenticate_client(sock, wire.reader_of(sock, 0), SECRET, HELLO,
                                      timeout=2)
    sock.close()


CONTROL_PAYLOADS = [encode_control(m) for m in (
    TriggerCheckpoint(3), Register("127.0.0.1", 4000, 12), HELLO)]


INTS = st.integers(-2**63, 2**64 - 1)  # what msgpack encodes
VALUES = st.recursive(
    st.none() | st.booleans() | INTS | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | INTS, inner, max_size=4),
    max_leaves=12)
TAGS = st.sampled_from(["trigger", "register", "ack", "start", "hello", "failed", "x"])
MESSAGES = st.one_of(VALUES, st.tuples(TAGS, st.lists(VALUES, max_size=7)).map(
    lambda t: [t[0], *t[1]])).map(msgpack.packb)
"""Well-formed msgpack: a message's tag and fields of any type, or any value."""


@FUZZ
@given(data=st.data())
def test_decode_control_raises_only_protocol_errors(data) -> None:
    payload = data.draw(st.one_of(
        st.binary(max_size=512), MESSAGES,
        mutated(data.draw(st.sampled_from(CONTROL_PAYLOADS)))))
    try:
        decode_control(payload)
    except ProtocolError:
        pass


ELEMENT_FRAMES = [wire.element_frame(e) for e in (
    Barrier(4, "checkpoint", 17), Watermark(99), EndOfData(True), END_OF_PARTITION)] + [
    (wire.Frame.BATCH, wire.encode_batch([1, "two", 3.5]))]


@FUZZ
@given(data=st.data())
def test_decode_element_raises_only_protocol_errors(data) -> None:
    kind, valid = data.draw(st.sampled_from(ELEMENT_FRAMES))
    kind = data.draw(st.sampled_from([kind, data.draw(st.integers(0, 255))]))
    payload = data.draw(st.one_of(st.binary(max_size=512), mutated(valid)))
    try:
        wire.decode_element(kind, payload)
    except ProtocolError:
        pass
