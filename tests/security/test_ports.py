"""The control and data ports against unauthenticated and hostile peers
over real sockets on 127.0.0.1.

- A running job (local launcher) while 50 garbage and 50 silent connections
  hit its control port and each task's data port: it completes with exact
  output and no restart, and every silent connection is dropped once its
  handshake deadline passed.
- Each of what broke before, alone: a garbage connection to a data port
  failed the task; a silent one stalled the handshake (and, on a data port,
  kept the real upstream out) forever; a length field beyond the limit was
  read; a frame altered after the handshake was accepted.
- The accept loop outlives EMFILE; pending handshakes are bounded and a
  client refused for that tries again; AES-GCM hides the records.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockgate.cluster.events import TaskDisconnected, TaskMessage
from lockgate.cluster.server import ControlServer
from lockgate.errors import AuthenticationError
from lockgate.protocol import Batch, Hello, ProtocolError, Running, encode_control
from lockgate.runtime import channels, handshake, wire
from lockgate.runtime.mailbox import Mailbox
from tests.fixtures import check_exact_sums
from tests.security.ports import (
    NONCE_BYTES,
    closed_by_peer,
    data_ports,
    garbage,
    silent,
    sums_job,
)

SECRET = b"k" * 32
GARBAGE = SILENT = 50
DEADLINE = handshake.HANDSHAKE_TIMEOUT + 5  # seconds a test waits for a drop


def task_hello(task: int = 0) -> Hello:
    return Hello("task", "job", 1, task)


def next_event(events: queue.Queue, timeout: float = 10.0):
    return events.get(timeout=timeout)


@pytest.fixture
def control_server():
    events: queue.Queue = queue.Queue()
    server = ControlServer(SECRET, "job", events)
    try:
        yield server, events
    finally:
        server.close()


# ------------------------------------------------------------ a real job

@pytest.mark.timeout(180)
def test_a_job_completes_exactly_while_garbage_and_silent_peers_hit_every_port(
        tmp_path: Path) -> None:
    n, keys = 20_000, 7
    client = sums_job(tmp_path, n=n, keys=keys, delay=3.0).start(launcher="local", rest=False)
    try:
        ports = list(data_ports(os.getpid(), want=2).values())
        ports.append(client.master.server.address[1])
        rng = random.Random(11)
        with contextlib.ExitStack() as stack:
            held = []
            for port in ports:
                held += stack.enter_context(silent(port, SILENT))
                challenged = sum(garbage(port, rng) for _ in range(GARBAGE))
                assert challenged, f"port {port} took no connection: the test came too late"
            dropped = [closed_by_peer(s, DEADLINE) for s in held]
            assert all(dropped), f"{dropped.count(False)} silent connections were kept"
        result = client.result(timeout=120)
    finally:
        with contextlib.suppress(Exception):
            client.cancel(timeout=30)
    assert result.restarts == 0, result.failures
    check_exact_sums(tmp_path / "out", n, keys)


@pytest.mark.timeout(120)
def test_an_encrypted_job_completes_exactly(tmp_path: Path) -> None:
    n, keys = 20_000, 5
    result = sums_job(tmp_path, n=n, keys=keys, delay=0.0, encrypt=True).run(
        launcher="local", rest=False)
    assert result.restarts == 0
    check_exact_sums(tmp_path / "out", n, keys)


# --------------------------------------------------- a task's data port

def data_spec(**fields) -> types.SimpleNamespace:
    return types.SimpleNamespace(job_id="job", attempt=3, bind_host="127.0.0.1",
                                 encrypt_traffic=False, max_data_frame=1 << 20,
                                 unaligned=False, **fields)


def test_garbage_silent_and_fenced_peers_neither_fail_a_data_port_nor_keep_its_upstream_out(
        ) -> None:
    spec = data_spec()
    mailbox = Mailbox(1)
    inputs = channels.InputChannels(spec, SECRET, {5: 0}, mailbox)  # type: ignore[arg-type]
    listener = channels.listen(spec, 1)  # type: ignore[arg-type]
    assert listener is not None
    port = listener.getsockname()[1]
    inputs.accept(listener)
    with silent(port, 3) as quiet:
        for _ in range(5):
            garbage(port, random.Random(3))
        # authenticated, but of an older attempt: fenced off
        old = handshake.open_link(("127.0.0.1", port), SECRET, Hello("data", "job", 2, 5))
        upstream = handshake.open_link(("127.0.0.1", port), SECRET, Hello("data", "job", 3, 5),
                                       max_frame=1 << 20)
        upstream.send(wire.Frame.BATCH, wire.encode_batch([1, 2, 3]))
        assert inputs.ready.wait(10), "the real upstream task was kept out"
        assert inputs.error is None
        assert mailbox.take(10) == (0, Batch([1, 2, 3]))
        assert closed_by_peer(old.sock, 5)
        assert all(closed_by_peer(s, DEADLINE) for s in quiet)
    upstream.close()
    inputs.close()


# ------------------------------------------------- handshakes, limits, MACs

def test_a_silent_connection_is_dropped_at_the_handshake_deadline(control_server) -> None:
    server, events = control_server
    with silent(server.address[1], 1) as (quiet,):
        assert len(quiet.recv(NONCE_BYTES)) == NONCE_BYTES  # the challenge
        started = time.monotonic()
        # a real task connects meanwhile
        link = handshake.open_link(server.address, SECRET, task_hello())
        wire.ControlChannel(link).send(Running())
        assert next_event(events) == TaskMessage(1, 0, Running())
        assert closed_by_peer(quiet, DEADLINE)
        assert time.monotonic() - started < handshake.HANDSHAKE_TIMEOUT + 2
    link.close()


def test_a_peer_dripping_bytes_is_dropped_at_the_deadline_too() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=handshake.serve_connections, daemon=True, args=(
        listener, SECRET, "test", lambda link, hello: None), kwargs={"timeout": 1.0}).start()
    with socket.create_connection(listener.getsockname(), timeout=5) as s:
        s.recv(NONCE_BYTES)
        started = time.monotonic()
        with contextlib.suppress(OSError):
            for _ in range(40):  # a byte every 0.1 s: each read within its timeout
                s.sendall(b"x")
                time.sleep(0.1)
        assert closed_by_peer(s, 5)
        assert time.monotonic() - started < 3.5
    handshake.close_listener(listener)


def test_a_length_beyond_the_control_limit_is_refused_before_it_is_read(
        control_server) -> None:
    server, events = control_server
    link = handshake.open_link(server.address, SECRET, task_hello())
    link.sock.sendall(wire.HEADER.pack(wire.MAX_CONTROL_FRAME + 1, wire.Frame.CONTROL))
    assert next_event(events, 5) == TaskDisconnected(1, 0)
    assert closed_by_peer(link.sock, 5)


def test_a_data_frame_beyond_its_limit_is_neither_sent_nor_read() -> None:
    tap = wiretap(max_frame=1 << 16)
    with pytest.raises(ProtocolError, match="exceeds this connection's limit"):
        tap.sender.send(wire.Frame.BATCH, b"x" * ((1 << 16) + 1))
    tap.deliver.sendall(wire.HEADER.pack((1 << 16) + 1, wire.Frame.BATCH))
    with pytest.raises(ProtocolError, match="exceeds"):
        tap.receiver.recv()


def test_a_frame_with_a_wrong_mac_on_the_control_port_is_refused(control_server) -> None:
    server, events = control_server
    link = handshake.open_link(server.address, SECRET, task_hello())
    payload = encode_control(Running())
    link.sock.sendall(wire.HEADER.pack(len(payload), wire.Frame.CONTROL) + payload
                      + bytes(wire.TAG_BYTES))
    assert next_event(events, 5) == TaskDisconnected(1, 0)  # and no Running before it
    assert closed_by_peer(link.sock, 5)


@pytest.mark.parametrize("encrypt", [False, True], ids=["mac", "aes-gcm"])
@pytest.mark.parametrize("attack", ["flip", "replay", "reorder", "drop", "tag"])
def test_a_frame_altered_on_the_way_is_refused_before_it_is_unpickled(
        attack: str, encrypt: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    unpickled = []
    real_loads = wire.pickle.loads
    monkeypatch.setattr(wire.pickle, "loads", lambda b: unpickled.append(b) or real_loads(b))
    tap = wiretap(encrypt=encrypt)
    frames = [tap.capture(wire.encode_batch([i, "record"])) for i in range(3)]
    if attack == "flip":
        f = bytearray(frames[0])
        f[wire.HEADER.size + 3] ^= 0x01
        frames[0] = bytes(f)
    elif attack == "replay":
        frames[1] = frames[0]
    elif attack == "reorder":
        frames[0], frames[1] = frames[1], frames[0]
    elif attack == "drop":
        del frames[0]
    else:
        frames[0] = frames[0][:-1] + bytes([frames[0][-1] ^ 0x80])
    tap.deliver.sendall(b"".join(frames))
    passed = []
    with pytest.raises(wire.TamperedFrame):
        for _ in frames:
            passed.append(wire.decode_element(*tap.receiver.recv()))
    # only the frames before the attack, as sent; nothing unpickled before its tag verified
    assert passed == [Batch([0, "record"])] if attack == "replay" else passed == []
    assert len(unpickled) == len(passed)


@pytest.mark.parametrize("encrypt", [False, True], ids=["mac", "aes-gcm"])
def test_frames_as_sent_read_back(encrypt: bool) -> None:
    tap = wiretap(encrypt=encrypt)
    frames = [tap.capture(wire.encode_batch([i, "record"])) for i in range(3)]
    tap.deliver.sendall(b"".join(frames))
    assert [wire.decode_element(*tap.receiver.recv()) for _ in frames] == [
        Batch([i, "record"]) for i in range(3)]


def test_encrypted_frames_do_not_show_their_records() -> None:
    payload = wire.encode_batch(["card 4111-1111-1111-1111"])
    assert b"4111" not in wiretap(encrypt=True).capture(payload)
    assert b"4111" in wiretap(encrypt=False).capture(payload)


def test_ends_that_disagree_about_encryption_fail_the_handshake() -> None:
    a, b = socket.socketpair()
    got: list[BaseException] = []

    def serve() -> None:
        try:
            handshake.authenticate_server(a, wire.reader_of(a, 0), SECRET, encrypt=True)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=serve)
    t.start()
    handshake.authenticate_client(b, wire.reader_of(b, 0), SECRET, task_hello())
    t.join(10)
    assert isinstance(got[0], AuthenticationError) and "encrypt_traffic" in str(got[0])
    a.close(), b.close()


# ------------------------------------------------------- the accept loop

def test_pending_handshakes_are_bounded_and_a_refused_client_retries() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    links: queue.Queue = queue.Queue()
    threading.Thread(target=handshake.serve_connections, daemon=True, args=(
        listener, SECRET, "test", lambda link, hello: links.put(hello)),
        kwargs={"timeout": 1.5, "max_pending": 4}).start()
    port = listener.getsockname()[1]
    with silent(port, 4) as quiet:
        for s in quiet:
            assert len(s.recv(NONCE_BYTES)) == NONCE_BYTES
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            extra.settimeout(5)
            assert extra.recv(NONCE_BYTES) == b""  # closed at once, unread
        started = time.monotonic()
        handshake.open_link(("127.0.0.1", port), SECRET, task_hello(), retry_for=10)
        assert links.get(timeout=5) == task_hello()
        assert 0.5 < time.monotonic() - started < 6
    handshake.close_listener(listener)


def test_the_accept_loop_outlives_running_out_of_file_descriptors(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        import resource, socket, sys, threading, time
        from lockgate.protocol import Hello
        from lockgate.runtime import handshake
        resource.setrlimit(resource.RLIMIT_NOFILE, (60, 60))
        listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        got = []
        threading.Thread(target=handshake.serve_connections, daemon=True, args=(
            listener, b"k" * 32, "test", lambda link, hello: got.append(hello)),
            kwargs={"timeout": 1.0}).start()
        hold = []
        try:
            while len(hold) < 200:  # until this process is out of descriptors
                hold.append(socket.create_connection(listener.getsockname(), timeout=2))
        except OSError:
            pass
        time.sleep(0.5)
        for s in hold:
            s.close()
        time.sleep(1.5)
        handshake.open_link(listener.getsockname(), b"k" * 32, Hello("task", "j", 1, 0))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        print("served" if got else "not served")
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "served", out.stderr[-2000:]
    assert "cannot accept" in out.stderr  # logged once, then waited out


# ------------------------------------------------------------- helpers

@dataclass
class Wiretap:
    """Two ends of an authenticated connection with the wire between them in
    the test's hands: what ``sender`` sends comes out of ``sent``; what is
    written to ``deliver`` is what ``receiver`` reads."""

    sender: wire.Link
    receiver: wire.Link
    sent: socket.socket
    deliver: socket.socket

    def capture(self, payload: bytes, kind: int = wire.Frame.BATCH) -> bytes:
        """The bytes of one frame the sender sends, taken off the wire."""
        self.sender.send(kind, payload)
        want = wire.HEADER.size + len(payload) + wire.TAG_BYTES
        data = b""
        while len(data) < want:
            chunk = self.sent.recv(want - len(data))
            assert chunk
            data += chunk
        return data


def wiretap(*, encrypt: bool = False, max_frame: int = wire.MAX_CONTROL_FRAME) -> Wiretap:
    a, sent = socket.socketpair()
    deliver, d = socket.socketpair()
    for s in (a, sent, deliver, d):
        s.settimeout(5)
    keys = (os.urandom(32), os.urandom(32))
    return Wiretap(
        wire.Link(a, wire.reader_of(a, 0), keys, encrypt=encrypt, max_frame=max_frame),
        wire.Link(d, wire.reader_of(d, 0), keys[::-1], encrypt=encrypt, max_frame=max_frame),
        sent, deliver)
