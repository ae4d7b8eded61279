"""A synchronous handle on an asyncio NATS connection, for a task's thread.

``nats-py`` is asyncio-only; a task's reader or writer is called on the task
thread, synchronously. :class:`NatsConnection` runs one event loop in a
daemon thread per connection and hands it coroutines
(``asyncio.run_coroutine_threadsafe``), each awaited with a deadline, so no
call of the task thread waits unbounded. One loop per connection, not
``asyncio.run`` per call: a call then costs a thread hop (~50 µs) instead of
a new loop and a new connection (~5 ms), and the connection's own tasks (the
read loop, pings, a source's prefetching) keep running between calls.

``nats-py`` is imported here, on first use: ``import lockgate`` never needs it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

from lockgate.errors import ConfigurationError, LockgateError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

R = TypeVar("R")

__all__ = ["DEFAULT_URL", "NatsConnection", "require_nats", "redact_url"]

DEFAULT_URL = "nats://127.0.0.1:4222"
"""The server a connector reaches when it is given no ``url``."""

CONNECT_TIMEOUT = 5.0
"""Seconds a connection may take before it is a failure."""


def require_nats() -> None:
    """Import ``nats-py`` or say how to install it."""
    try:
        import nats  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "the NATS connectors need the nats-py client: pip install 'lockgate[nats]'"
        ) from None


def redact_url(url: str) -> str:
    """``url`` without a user or password (they may be in ``nats://user:pass@host``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    _, at, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if at else url


class NatsConnection:
    """One NATS connection with its own event loop thread.

    ``call(fn, timeout)`` runs ``fn()`` (a coroutine function) on the loop and
    returns its result, or raises :class:`LockgateError` after ``timeout``
    seconds (the coroutine is cancelled). ``spawn`` starts a background
    coroutine on the loop; ``close`` drains and closes the connection and
    stops the loop (idempotent, bounded in time)."""

    def __init__(self, url: str = DEFAULT_URL, *, name: str = "lockgate") -> None:
        require_nats()
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"nats-{name}")
        self._thread.start()
        self._closed = False
        self._spawned: set[asyncio.Task[Any]] = set()
        try:
            self.nc: Client = self.call(lambda: self._connect(name), CONNECT_TIMEOUT + 1)
        except Exception as e:
            self._stop_loop()
            raise ConfigurationError(
                f"cannot connect to NATS at {redact_url(url)}: {type(e).__name__}: {e}. "
                "Is the server running, and is the url right?") from None
        self.js: JetStreamContext = self.nc.jetstream()

    async def _connect(self, name: str) -> Client:
        import nats

        return await nats.connect(self.url, name=name, connect_timeout=CONNECT_TIMEOUT,
                                  max_reconnect_attempts=10, reconnect_time_wait=0.5,
                                  allow_reconnect=True)

    def call(self, fn: Callable[[], Awaitable[R]], timeout: float) -> R:
        """Run the coroutine ``fn()`` on the loop and return its result within
        ``timeout`` seconds."""
        if self._closed:
            raise LockgateError("the NATS connection is closed")

        async def run() -> R:
            return await fn()

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise LockgateError(
                f"NATS at {redact_url(self.url)} did not answer within {timeout:g} s") from None

    def spawn(self, fn: Callable[[], Awaitable[Any]]) -> Future[Any]:
        """Start ``fn()`` on the loop in the background; the returned future
        can be cancelled and tells how it ended."""
        async def run() -> Any:
            task = asyncio.current_task()
            assert task is not None
            self._spawned.add(task)
            try:
                return await fn()
            finally:
                self._spawned.discard(task)

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run the plain function ``fn`` on the loop thread, soon (thread-safe)."""
        if not self._closed:
            self._loop.call_soon_threadsafe(fn)

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection (pending publishes flushed) and stop the loop."""
        if self._closed:
            return
        async def shutdown() -> None:
            for task in list(self._spawned):  # background work first, then the connection
                task.cancel()
            await asyncio.gather(*self._spawned, return_exceptions=True)
            await self.nc.close()

        try:
            self.call(shutdown, timeout)
        except Exception:
            pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._closed = True

        def stop() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()
