"""A real TCP service for the async I/O tests, and the async functions that call it.

``LookupService`` is an asyncio server on 127.0.0.1 in a thread of the test
process. Its protocol is one line per request and one per answer::

    request:  <value> <delay in ms>\\n
    answer:   <answer>\\n          answer = value * value + 1

It counts the requests it received per value and the most it had in flight at
once, so a test can check the operator's capacity and that every record was
asked (at least) once. The job functions below open a connection per request
(``asyncio.open_connection``) to ``LOCKGATE_TEST_SERVICE`` or the address given.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any


def answer(value: int) -> int:
    """What the service answers for ``value`` (the reference of the tests)."""
    return value * value + 1


class LookupService:
    def __init__(self) -> None:
        self.requests: Counter[int] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lookup-service")
        self.port = 0

    def __enter__(self) -> LookupService:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the lookup service did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.max_in_flight = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                value_text, _, delay_text = line.decode().partition(" ")
                value = int(value_text)
                with self._lock:
                    self.requests[value] += 1
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    await asyncio.sleep(int(delay_text or 0) / 1000)
                finally:
                    with self._lock:
                        self.in_flight -= 1
                writer.write(f"{answer(value)}\n".encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def ask(address: str, value: int, delay_ms: int = 0) -> int:
    """One request to the service at ``address`` on a connection of its own."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{value} {delay_ms}\n".encode())
        await writer.drain()
        line = await reader.readline()
        if not line:
            raise ConnectionError("the service closed the connection without an answer")
        return int(line)
    finally:
        writer.close()
