"""The protocol's messages and the wire codec: every message round-trips, and
anything else is a ProtocolError naming what is wrong (never a KeyError or a
crash deeper in a receiver)."""

from __future__ import annotations

import socket
import threading

import msgpack
import pytest

from lockgate.checkpoint.kinds import BarrierKind
from lockgate.checkpoint.metadata import StateHandle
from lockgate.protocol import (
    END_OF_PARTITION,
    IDLE,
    Ack,
    Barrier,
    Batch,
    Cancel,
    CancelBarrier,
    Decline,
    Drain,
    EndOfData,
    Exited,
    Failed,
    Finish,
    Finished,
    Finishing,
    FinishingSeen,
    Hello,
    InputEnded,
    LeaseGranted,
    LeaseRefused,
    NotifyAborted,
    NotifyComplete,
    ProtocolError,
    Register,
    Running,
    Start,
    TriggerCheckpoint,
    Watermark,
    decode_control,
    encode_control,
)
from lockgate.runtime import handshake, wire

CONTROL = [
    Start({0: ("127.0.0.1", 4000), 3: ("10.0.0.2", 5)}), TriggerCheckpoint(7),
    NotifyComplete(7), NotifyAborted(8), Finish(), Drain(), Cancel(),
    Register("127.0.0.1", 0, 1234), Running(), Running({"entry": 1.5}, [["op", 3, False, "r"]]),
    Ack(7, {"sums": StateHandle("sums-0.state", 10, 3, 0, {0: (0, 4), 5: (4, 6)},
                                {"reduce": "value"}, (10, 2)), "out": None}, 10, 4, False, 0.25),
    Decline(7, "writing the snapshot failed", "OSError"), Decline(9, "subsumed"),
    InputEnded(10, 4), Finished(10, 4), Failed("ValueError: x", "ValueError", None, "tb"),
    Failed("E: y", "E", "a batch of 3 records", ""),
    Hello("data", "job-1", 2, 5), Hello("lease", "job-1", 2, 5, 99, "h"),
    LeaseGranted(), LeaseRefused(), Finishing(), FinishingSeen(), Exited(0),
]


@pytest.mark.parametrize("message", CONTROL, ids=lambda m: type(m).__name__)
def test_control_messages_round_trip(message) -> None:
    assert decode_control(encode_control(message)) == message


@pytest.mark.parametrize("payload, complaint", [
    (b"\xc1", "undecodable"),
    (msgpack.packb({"t": "trigger", "cp": 1}), "must be a list"),
    (msgpack.packb([]), "must be a list"),
    (msgpack.packb(["no-such-message"]), "unknown control message type"),
    (msgpack.packb(["trigger"]), "0 fields, expected 2"),
    (msgpack.packb(["trigger", 1, "checkpoint", 2]), "3 fields, expected 2"),
    (msgpack.packb(["trigger", "1", "checkpoint"]), "field checkpoint_id has type str"),
    (msgpack.packb(["trigger", True, "checkpoint"]), "field checkpoint_id has type bool"),
    (msgpack.packb(["trigger", 1, "checkpiont"]), "field kind is 'checkpiont', not one of "
                                                   "checkpoint, savepoint, stop, final"),
    (msgpack.packb(["trigger", 1, 7]), "field kind has type int"),
    (msgpack.packb(["ack", 1, [], 0, 0, False, 0.0, 0.0, 0.0]), "field handles has type list"),
    (msgpack.packb(["ack", 1, {"u": {"file": "../x", "size": 1, "crc32": 0}}, 0, 0, False, 0.0,
                   0.0, 0.0]),
     "ack: "),
    (msgpack.packb(["ack", 1, {"u": {"file": "x", "size": -1, "crc32": 0}}, 0, 0, False, 0.0,
                   0.0, 0.0]),
     "ack: "),
    (msgpack.packb(["start", {"0": ["h", 1]}]), "peers must map"),
    (msgpack.packb(["start", {0: ["h"]}]), "peers must map"),
])
def test_malformed_control_messages_are_protocol_errors(payload: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        decode_control(payload)


ELEMENTS = [*(Barrier(3, kind, 1.5) for kind in BarrierKind), CancelBarrier(3), Watermark(1000),
            Watermark(12.5), IDLE, EndOfData(True), EndOfData(False), END_OF_PARTITION]


@pytest.mark.parametrize("element", ELEMENTS, ids=repr)
def test_stream_elements_round_trip(element) -> None:
    decoded = wire.decode_element(*wire.element_frame(element))
    assert decoded == element
    if isinstance(element, Barrier):
        assert type(decoded.kind) is BarrierKind  # a closed set, not a string


def test_a_trigger_decodes_its_kind_as_the_enum() -> None:
    for kind in BarrierKind:
        decoded = decode_control(encode_control(TriggerCheckpoint(4, kind)))
        assert decoded == TriggerCheckpoint(4, kind) and type(decoded.kind) is BarrierKind


def test_batches_round_trip_through_the_batch_frame() -> None:
    records = [1, "a", (2, 3.5), {"k": [1]}, None]
    assert wire.decode_element(wire.Frame.BATCH, wire.encode_batch(records)) == Batch(records)


@pytest.mark.parametrize("kind, payload", [
    (wire.Frame.BARRIER, msgpack.packb([1, "checkpoint"])),
    (wire.Frame.BARRIER, msgpack.packb(["1", "checkpoint", 0])),
    (wire.Frame.BARRIER, msgpack.packb([1, "savepoints", 0])),
    (wire.Frame.BARRIER, msgpack.packb([1, ["checkpoint"], 0])),
    (wire.Frame.CANCEL_BARRIER, msgpack.packb(True)),
    (wire.Frame.WATERMARK, msgpack.packb(None)),
    (wire.Frame.WATERMARK, msgpack.packb("late")),
    (wire.Frame.END_OF_DATA, msgpack.packb(1)),
    (wire.Frame.END_OF_PARTITION, msgpack.packb(0)),
    (wire.Frame.CONTROL, msgpack.packb(["finish"])),
    (wire.Frame.HELLO, b""),
    (99, b""),
    (wire.Frame.BARRIER, b"\xc1"),
])
def test_frames_a_data_channel_never_carries_are_protocol_errors(kind: int,
                                                                 payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode_element(kind, payload)


def test_a_batch_is_not_an_element_frame() -> None:
    with pytest.raises(TypeError):
        wire.element_frame(Batch([1]))


def test_the_handshake_carries_a_typed_hello_and_refuses_a_wrong_secret() -> None:
    a, b = socket.socketpair()
    ra, rb = a.makefile("rb", buffering=0), b.makefile("rb", buffering=0)
    got = {}
    server = threading.Thread(target=lambda: got.setdefault(
        "hello", handshake.authenticate_server(a, ra, b"s" * 32)[1]))
    server.start()
    handshake.authenticate_client(b, rb, b"s" * 32, Hello("task", "j", 1, 4))
    server.join(5)
    assert got["hello"] == Hello("task", "j", 1, 4)
    a.close(), b.close()

    a, b = socket.socketpair()
    ra, rb = a.makefile("rb", buffering=0), b.makefile("rb", buffering=0)
    errors = []

    def serve() -> None:
        try:
            handshake.authenticate_server(a, ra, b"s" * 32)
        except Exception as e:
            errors.append(e)
        a.shutdown(socket.SHUT_RDWR)  # (close() leaves the fd open for the reader)

    server = threading.Thread(target=serve)
    server.start()
    with pytest.raises((wire.ConnectionClosed, OSError)):
        handshake.authenticate_client(b, rb, b"x" * 32, Hello("task", "j", 1, 4))
    server.join(5)
    assert "does not hold the job secret" in str(errors[0])
    b.close()


def test_a_control_channel_sends_and_receives_typed_messages() -> None:
    a, b = socket.socketpair()
    ra, rb = a.makefile("rb", buffering=0), b.makefile("rb", buffering=0)
    got: dict[str, wire.Link] = {}
    server = threading.Thread(target=lambda: got.setdefault(
        "link", handshake.authenticate_server(b, rb, b"s" * 32)[0]))
    server.start()
    left = wire.ControlChannel(handshake.authenticate_client(a, ra, b"s" * 32,
                                                             Hello("task", "j", 1, 4)))
    server.join(5)
    right = wire.ControlChannel(got["link"])
    for message in CONTROL:
        left.send(message)
        assert right.recv() == message
    left.link.send(wire.Frame.CONTROL, msgpack.packb(["nope"]))
    with pytest.raises(ProtocolError):
        right.recv()
    left.close()
    with pytest.raises(wire.ConnectionClosed):
        right.recv()
    right.close()
