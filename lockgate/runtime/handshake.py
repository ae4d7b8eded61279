"""How a Lockgate connection starts, and how listeners take connections.

Every connection, control or data, opens with a mutual HMAC-SHA256
challenge on the 32-byte job secret: the server sends a nonce, the client
answers with its MAC and a nonce of its own, the server proves itself with
the MAC of that one. Both ends then derive one key per direction from the
secret and both nonces (:func:`_keys`, HKDF-SHA256), and the client's first
frame on the :class:`~lockgate.runtime.wire.Link` is its
:class:`~lockgate.protocol.Hello`. The server side runs against a deadline
(:data:`HANDSHAKE_TIMEOUT`); nothing is decoded before the challenge passed.

:func:`serve_connections` is the accept loop of every listener (the
driver's control port, the Spark launcher's leases, a task's data port):
one thread per handshake, at most :data:`MAX_PENDING_HANDSHAKES` at once,
a peer that fails or stalls dropped without affecting anything else, and
``accept`` errors such as EMFILE waited out.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from lockgate.errors import AuthenticationError
from lockgate.protocol import Hello, ProtocolError, decode_control, encode_control
from lockgate.runtime import wire

log = logging.getLogger("lockgate.wire")

NONCE_BYTES = 32
MAX_HELLO_FRAME = 4096
HANDSHAKE_TIMEOUT = 5.0
"""Seconds a listener gives a connection to pass the challenge and say hello."""
MAX_PENDING_HANDSHAKES = 128
"""Connections a listener authenticates at once; beyond, new ones are closed
unread (a client retries: :func:`open_link`)."""
REFUSED_RETRY = 20.0
"""Seconds a client keeps retrying a listener that closes before its
challenge (too many pending handshakes there)."""
ACCEPT_BACKOFF = 0.1
"""Seconds an accept loop out of file descriptors waits before it tries again."""
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_TRANSIENT_ACCEPT = _OUT_OF_RESOURCES | {errno.ECONNABORTED, errno.EPROTO, errno.EPERM,
                                         errno.EINTR}


class RefusedBeforeChallenge(wire.ConnectionClosed):
    """The listener closed the connection before it sent its challenge: it had
    too many pending handshakes (or was closing)."""


def _mac(secret: bytes, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(secret, nonce + role, hashlib.sha256).digest()


def _keys(secret: bytes, server_nonce: bytes, client_nonce: bytes,
          encrypt: bool) -> tuple[bytes, bytes]:
    """(client-to-server, server-to-client) keys of one connection: HKDF-SHA256
    (RFC 5869) with both nonces as salt and the job secret as input key
    material; the mode is part of the info, so two ends that disagree about
    encryption fail at the first frame."""
    prk = hmac.new(server_nonce + client_nonce, secret, hashlib.sha256).digest()
    mode = b"aes-256-gcm" if encrypt else b"gmac-aes-256"
    return (hmac.new(prk, b"lockgate link v1 client to server " + mode + b"\x01",
                     hashlib.sha256).digest(),
            hmac.new(prk, b"lockgate link v1 server to client " + mode + b"\x01",
                     hashlib.sha256).digest())


def authenticate_server(sock: socket.socket, reader: BinaryIO, secret: bytes, *,
                        encrypt: bool = False, max_frame: int = wire.MAX_CONTROL_FRAME,
                        timeout: float = HANDSHAKE_TIMEOUT) -> tuple[wire.Link, Hello]:
    """Challenge a connecting peer, prove ourselves, and return the link and
    the peer's hello, all within ``timeout`` seconds (``socket.timeout``, an
    ``OSError``, beyond). :class:`AuthenticationError` for a peer without the
    secret or a bad hello."""
    deadline = time.monotonic() + timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no hello within {timeout:g} s")
        return left

    sock.settimeout(remaining())
    nonce = os.urandom(NONCE_BYTES)
    sock.sendall(nonce)
    sock.settimeout(remaining())
    answer = wire.recv_exact(reader, 32 + NONCE_BYTES)
    if not hmac.compare_digest(answer[:32], _mac(secret, nonce, b"client")):
        raise AuthenticationError("peer failed the HMAC challenge: it does not hold the job secret")
    sock.settimeout(remaining())
    sock.sendall(_mac(secret, answer[32:], b"server"))
    link = wire.Link(sock, reader, _keys(secret, nonce, answer[32:], encrypt)[::-1],
                     encrypt=encrypt, max_frame=MAX_HELLO_FRAME)
    sock.settimeout(remaining())
    try:
        kind, payload = link.recv()
    except wire.TamperedFrame:
        raise AuthenticationError("the hello failed its MAC (does the peer agree about "
                                  "encrypt_traffic?)") from None
    except ProtocolError as e:
        raise AuthenticationError(f"malformed hello: {e}") from None
    if kind != wire.Frame.HELLO:
        raise AuthenticationError(f"expected a hello frame, got {kind}")
    try:
        hello = decode_control(payload)
    except ProtocolError as e:
        raise AuthenticationError(f"malformed hello: {e}") from None
    if not isinstance(hello, Hello):
        raise AuthenticationError(f"expected a hello, got {hello.tag}")
    sock.settimeout(None)
    link.max_frame = max_frame
    return link, hello


def authenticate_client(sock: socket.socket, reader: BinaryIO, secret: bytes, hello: Hello,
                        *, encrypt: bool = False, max_frame: int = wire.MAX_CONTROL_FRAME,
                        timeout: float = HANDSHAKE_TIMEOUT) -> wire.Link:
    """Answer the server's challenge, check its proof, then send ``hello``.
    The challenge may come late (the server accepts when it is ready); from
    then on the exchange has ``timeout`` seconds."""
    try:
        first = reader.read(NONCE_BYTES)
    except ConnectionResetError as e:
        raise RefusedBeforeChallenge(f"the server reset the connection: {e}") from None
    if not first:
        raise RefusedBeforeChallenge("the server closed the connection before its challenge")
    sock.settimeout(timeout)
    nonce = first + (wire.recv_exact(reader, NONCE_BYTES - len(first))
                     if len(first) < NONCE_BYTES else b"")
    mine = os.urandom(NONCE_BYTES)
    sock.sendall(_mac(secret, nonce, b"client") + mine)
    proof = wire.recv_exact(reader, 32)
    if not hmac.compare_digest(proof, _mac(secret, mine, b"server")):
        raise AuthenticationError(
            "server failed the HMAC challenge: it does not hold the job secret"
        )
    link = wire.Link(sock, reader, _keys(secret, nonce, mine, encrypt),
                     encrypt=encrypt, max_frame=max_frame)
    link.send(wire.Frame.HELLO, encode_control(hello))
    sock.settimeout(None)
    return link


def open_link(address: tuple[str, int], secret: bytes, hello: Hello, *,
              encrypt: bool = False, max_frame: int = wire.MAX_CONTROL_FRAME,
              buffering: int = 0, retry_for: float = REFUSED_RETRY) -> wire.Link:
    """Connect to ``address`` and authenticate; a listener that closes before
    its challenge (too many pending handshakes: someone floods it) is tried
    again, backing off, for ``retry_for`` seconds."""
    deadline = time.monotonic() + retry_for
    delay = 0.05
    while True:
        sock = wire.connect(address)
        try:
            return authenticate_client(sock, wire.reader_of(sock, buffering), secret, hello,
                                       encrypt=encrypt, max_frame=max_frame)
        except RefusedBeforeChallenge:
            sock.close()
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 1.0)
        except BaseException:
            sock.close()
            raise


# -------------------------------------------------------------- listeners
class _Refusals:
    """Logs refused connections without flooding the log: the first at
    WARNING, then a count at most every ``every`` seconds."""

    def __init__(self, what: str, every: float = 10.0) -> None:
        self.what = what
        self.every = every
        self.count = 0
        self.logged_at: float | None = None
        self.lock = threading.Lock()

    def note(self, reason: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.count += 1
            if self.logged_at is not None and now - self.logged_at < self.every:
                return
            count, self.count, self.logged_at = self.count, 0, now
        log.warning("refused %d %s connection(s); the last: %s", count, self.what, reason)


class _Deadlines:
    """Shuts down every socket whose handshake outlived its deadline: the
    socket timeout bounds each read, not a peer that drips a byte at a time."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()
        self.pending: dict[socket.socket, float] = {}
        self.stopped = False
        threading.Thread(target=self._run, daemon=True, name=name).start()

    def add(self, sock: socket.socket, deadline: float) -> None:
        with self.lock:
            self.pending[sock] = deadline

    def discard(self, sock: socket.socket) -> None:
        with self.lock:
            self.pending.pop(sock, None)

    def _run(self) -> None:
        while not self.stopped:
            time.sleep(0.25)
            now = time.monotonic()
            with self.lock:
                late = [s for s, d in self.pending.items() if d <= now]
                for s in late:
                    del self.pending[s]
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def serve_connections(
    listener: socket.socket, secret: bytes, what: str,
    handle: Callable[[wire.Link, Hello], None], *,
    buffering: int = 0, encrypt: bool = False, max_frame: int = wire.MAX_CONTROL_FRAME,
    timeout: float = HANDSHAKE_TIMEOUT, max_pending: int = MAX_PENDING_HANDSHAKES,
) -> None:
    """Accept connections on ``listener`` until it is closed (:func:`close_listener`);
    authenticate each in its own thread, within ``timeout``, and hand the link
    and its hello to ``handle`` (in that thread). A peer that fails, stalls or
    breaks the handshake is dropped and counted in the log as a refused
    ``what`` connection. At most ``max_pending`` handshakes run at once; a
    connection beyond is closed at once, unread. Errors of ``accept`` such as
    EMFILE (out of file descriptors) are logged and waited out."""
    slots = threading.BoundedSemaphore(max_pending)
    refusals = _Refusals(what)
    deadlines = _Deadlines(f"{what}-deadlines")

    def serve(sock: socket.socket) -> None:
        deadlines.add(sock, time.monotonic() + timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = wire.reader_of(sock, buffering)
            link, hello = authenticate_server(sock, reader, secret, encrypt=encrypt,
                                              max_frame=max_frame, timeout=timeout)
        except (AuthenticationError, ProtocolError, OSError, EOFError) as e:
            refusals.note(f"{type(e).__name__}: {e}")
            _drop(sock)
            return
        finally:
            deadlines.discard(sock)
            slots.release()
        handle(link, hello)

    try:
        _accept_loop(listener, what, serve, slots, refusals, max_pending)
    finally:
        deadlines.stopped = True


def _accept_loop(listener: socket.socket, what: str, serve: Callable[[socket.socket], None],
                 slots: threading.BoundedSemaphore, refusals: _Refusals,
                 max_pending: int) -> None:
    out_of_resources = False
    while True:
        try:
            sock, _ = listener.accept()
        except OSError as e:
            if listener.fileno() == -1 or e.errno not in _TRANSIENT_ACCEPT:
                return  # closed
            if e.errno in _OUT_OF_RESOURCES:
                if not out_of_resources:
                    log.warning("the %s listener cannot accept: %s; retrying", what, e)
                out_of_resources = True
                time.sleep(ACCEPT_BACKOFF)
            continue
        out_of_resources = False
        if not slots.acquire(blocking=False):
            refusals.note(f"{max_pending} handshakes pending")
            sock.close()
            continue
        try:
            threading.Thread(target=serve, args=(sock,), daemon=True,
                             name=f"{what}-conn").start()
        except RuntimeError as e:  # can't start a new thread
            slots.release()
            refusals.note(str(e))
            sock.close()


def _drop(sock: socket.socket) -> None:
    """Close ``sock`` now, though a file made by ``makefile`` still refers to it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def close_listener(listener: socket.socket) -> None:
    """Close a listening socket and wake the thread blocked in its ``accept``."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
