"""The Redis server of the connector tests, as a session fixture any test
module may import (``from tests.connectors.redis_server import redis_url``):
``LOCKGATE_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``). A server that
cannot be reached skips the tests locally and fails them in CI (``CI`` set).
"""

from __future__ import annotations

import os

import pytest

from tests.connectors.postgres_server import missing

DEFAULT = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis server's URL."""
    url = os.environ.get("LOCKGATE_TEST_REDIS", DEFAULT)
    try:
        import redis
    except ImportError as e:
        missing(f"redis-py is not installed ({e}): pip install -e '.[dev]'")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        client.ping()
        client.close()
    except redis.RedisError as e:
        missing(f"cannot reach Redis at {url}: {e} (set LOCKGATE_TEST_REDIS)")
    return url


def fill_streams(url: str, streams: list[str], n: int) -> None:
    """Stream ``i`` of ``streams`` gets the numbers ``x`` of ``1..n`` with
    ``x % len(streams) == i``, ascending, as entries ``{"x": x}``."""
    import redis

    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for x in range(1, n + 1):
        pipe.xadd(streams[x % len(streams)], {"x": x})
        if x % 5000 == 0:
            pipe.execute()
    pipe.execute()
    client.close()


def delete_keys(url: str, pattern: str) -> None:
    """Delete every key matching ``pattern`` (a test's own prefix)."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=pattern, count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i:i + 1000])
    client.close()
