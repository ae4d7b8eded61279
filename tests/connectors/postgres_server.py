"""PostgreSQL servers for the connector tests, as session fixtures any test
module may import (``from tests.connectors.postgres_server import postgres_2pc``).

- ``postgres_dsn``: the shared server, ``LOCKGATE_TEST_POSTGRES`` (default
  ``postgresql://postgres@127.0.0.1:5432/test``). It may have
  ``max_prepared_transactions = 0``.
- ``postgres_2pc``: a server that prepares transactions:
  ``LOCKGATE_TEST_POSTGRES_2PC`` if set, else a throwaway cluster this module
  starts (``initdb`` as the ``postgres`` user when run as root, into a
  temporary folder, on a free port, ``max_prepared_transactions=20``, fsync
  off) and stops after the session.

A server that cannot be reached skips the tests locally with the reason and
fails them in CI (``CI`` set): a missing server is never a silent skip there.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def missing(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _reachable(dsn: str) -> str | None:
    """None if a connection to ``dsn`` works, else why not."""
    try:
        import psycopg
    except ImportError as e:
        return f"psycopg is not installed ({e}): pip install -e '.[dev]'"
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.Error as e:
        return f"cannot connect to PostgreSQL at {dsn}: {str(e).strip()}"
    return None


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """The shared PostgreSQL server's DSN."""
    dsn = os.environ.get("LOCKGATE_TEST_POSTGRES", SHARED_DEFAULT)
    why = _reachable(dsn)
    if why:
        missing(why + " (set LOCKGATE_TEST_POSTGRES)")
    return dsn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str | None:
    for d in PG_BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    return shutil.which(name)


@contextlib.contextmanager
def throwaway_cluster(max_prepared: int = 20, settings: str = "") -> Iterator[str]:
    """Start a PostgreSQL cluster of its own and yield its DSN; stop and
    remove it afterwards. ``settings``: more ``-c name=value`` options."""
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    if initdb is None or pg_ctl is None:
        missing("initdb/pg_ctl not found (install PostgreSQL's server binaries) and "
                "LOCKGATE_TEST_POSTGRES_2PC is not set")
    assert initdb is not None and pg_ctl is not None
    root = Path(tempfile.mkdtemp(prefix="lockgate-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to postgres
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            missing("running as root and there is no 'postgres' user to own a cluster")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = root / "data", root / "log"
    port = _free_port()
    options = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
               f"-c max_prepared_transactions={max_prepared} -c fsync=off "
               "-c synchronous_commit=off -c full_page_writes=off " + settings)
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(log), "-o", options,
                        "-w", "-t", "60", "start"], check=True, capture_output=True, timeout=90)
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or b"").decode(errors="replace")[-2000:]
        if log.exists():
            detail += log.read_text(errors="replace")[-2000:]
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"cannot start a throwaway PostgreSQL cluster: {detail}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_2pc() -> Iterator[str]:
    """The DSN of a server with ``max_prepared_transactions`` > 0."""
    dsn = os.environ.get("LOCKGATE_TEST_POSTGRES_2PC")
    if dsn:
        why = _reachable(dsn)
        if why:
            missing(why + " (LOCKGATE_TEST_POSTGRES_2PC)")
        yield dsn
        return
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        missing(f"psycopg is not installed ({e}): pip install -e '.[dev]'")
    with throwaway_cluster() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def postgres_logical() -> Iterator[str]:
    """The DSN of a server with ``wal_level=logical`` (change data capture):
    ``LOCKGATE_TEST_POSTGRES_LOGICAL`` if set, else a throwaway cluster."""
    dsn = os.environ.get("LOCKGATE_TEST_POSTGRES_LOGICAL")
    if dsn:
        why = _reachable(dsn)
        if why:
            missing(why + " (LOCKGATE_TEST_POSTGRES_LOGICAL)")
        yield dsn
        return
    try:
        import psycopg  # noqa: F401
    except ImportError as e:
        missing(f"psycopg is not installed ({e}): pip install -e '.[dev]'")
    with throwaway_cluster(settings="-c wal_level=logical -c max_replication_slots=40 "
                                    "-c max_wal_senders=40") as dsn:
        yield dsn


def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` in autocommit mode (DDL of a test's own tables)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        for s in statements:
            conn.execute(s)


def query(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    """The rows of one query, in autocommit mode."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(statement, params).fetchall())


def prepared(dsn: str, uid: str | None = None) -> list[str]:
    """The gids of Lockgate's prepared transactions (of sink ``uid``) on ``dsn``."""
    import psycopg

    from lockgate.connectors.postgres import prepared_of

    with psycopg.connect(dsn, autocommit=True) as conn:
        return prepared_of(conn, uid)
