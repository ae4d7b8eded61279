"""The connector tests' server fixtures, each defined in its connector's
``<name>_server.py`` and registered here, so test modules ask for them by
name without importing them."""

from tests.connectors.mysql_server import mysql_binlog, mysql_dsn  # noqa: F401
from tests.connectors.nats_server import nats_url  # noqa: F401
from tests.connectors.postgres_server import (  # noqa: F401
    postgres_2pc,
    postgres_dsn,
    postgres_logical,
)
from tests.connectors.redis_server import redis_url  # noqa: F401
