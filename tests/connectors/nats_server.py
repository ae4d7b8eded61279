"""The NATS server of the connector tests, and small synchronous helpers.

- ``nats_url``: ``LOCKGATE_TEST_NATS`` (default ``nats://127.0.0.1:4222``), a
  server with JetStream. One that cannot be reached skips the tests locally
  with the reason and fails them in CI (``CI`` set).
- ``unique(prefix)``: a stream or subject name no other test uses.
- ``make_stream`` (deleted at the end of the session), ``publish``,
  ``stream_payloads``: set up and read back streams through nats-py, one
  ``asyncio.run`` per call.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterable, Iterator

import pytest

DEFAULT_URL = "nats://127.0.0.1:4222"


def missing(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


CREATED: list[tuple[str, str]] = []
"""(url, stream) of every stream ``make_stream`` created in this session."""


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The NATS server (with JetStream) of the tests; the streams the tests
    made are deleted at the end of the session."""
    url = os.environ.get("LOCKGATE_TEST_NATS", DEFAULT_URL)
    try:
        import nats
    except ImportError as e:
        missing(f"nats-py is not installed ({e}): pip install -e '.[dev]'")

    async def probe() -> None:
        nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=0)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(probe(), 10))
    except Exception as e:
        missing(f"no NATS server with JetStream at {url} (LOCKGATE_TEST_NATS): "
                f"{type(e).__name__}: {e}")
    yield url
    for where, name in CREATED:
        try:
            delete_stream(where, name)
        except Exception:
            pass


def unique(prefix: str) -> str:
    """A name for a stream (and its subjects) that no other test uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def make_stream(url: str, name: str, subjects: list[str], *,
                duplicate_window: float = 120.0) -> None:
    """Create the stream ``name`` (file storage) taking ``subjects``."""
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(name=name, subjects=subjects,
                                            duplicate_window=duplicate_window)
        finally:
            await nc.close()

    asyncio.run(run())
    CREATED.append((url, name))


def delete_stream(url: str, name: str) -> None:
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().delete_stream(name)
        finally:
            await nc.close()

    asyncio.run(run())


def publish(url: str, messages: Iterable[tuple[str, bytes]]) -> None:
    """Publish ``(subject, payload)`` pairs to JetStream, in order, each acknowledged."""
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            batch = []
            for subject, payload in messages:
                batch.append((subject, payload))
                if len(batch) == 500:
                    await asyncio.gather(*(js.publish(s, p) for s, p in batch))
                    batch = []
            await asyncio.gather(*(js.publish(s, p) for s, p in batch))
        finally:
            await nc.close()

    asyncio.run(run())


def stream_payloads(url: str, name: str) -> list[bytes]:
    """Every message of the stream ``name``, in sequence order."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def run() -> list[bytes]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            total = (await js.stream_info(name)).state.messages
            if not total:
                return []
            sub = await js.pull_subscribe(
                "", stream=name, config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                    inactive_threshold=10.0))
            out: list[bytes] = []
            while len(out) < total:
                out += [m.data for m in await sub.fetch(min(1000, total - len(out)), timeout=5)]
            return out
        finally:
            await nc.close()

    return asyncio.run(run())
