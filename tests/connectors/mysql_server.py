"""MariaDB / MySQL servers for the connector tests, as session fixtures any
test module may import (``from tests.connectors.mysql_server import mysql_binlog``).

- ``mysql_dsn``: the shared server, ``LOCKGATE_TEST_MYSQL`` (default
  ``mysql://root@127.0.0.1:3306``). Its binlog may be off.
- ``mysql_binlog``: a server with the binlog on in row format
  (``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``):
  ``LOCKGATE_TEST_MYSQL_BINLOG`` if set, else a throwaway MariaDB server
  this module starts (``mariadb-install-db`` into a temporary folder, its
  own port and socket, durability off) and stops after the session.

A server that cannot be reached skips the tests locally with the reason and
fails them in CI (``CI`` set): a missing server is never a silent skip there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.connectors.postgres_server import _free_port, missing

SHARED_DEFAULT = "mysql://root@127.0.0.1:3306"


def _connect(dsn: str, **extra: Any) -> Any:
    import pymysql

    url = urlsplit(dsn)
    return pymysql.connect(host=url.hostname or "127.0.0.1", port=url.port or 3306,
                           user=url.username or "root", password=url.password or "",
                           charset="utf8mb4", autocommit=True, connect_timeout=5, **extra)


def _reachable(dsn: str) -> str | None:
    """None if a connection to ``dsn`` works, else why not."""
    try:
        import pymysql
    except ImportError as e:
        return f"PyMySQL is not installed ({e}): pip install -e '.[dev]'"
    try:
        _connect(dsn).close()
    except pymysql.Error as e:
        return f"cannot connect to MariaDB/MySQL at {dsn}: {e}"
    return None


@pytest.fixture(scope="session")
def mysql_dsn() -> str:
    """The shared MariaDB/MySQL server's DSN."""
    dsn = os.environ.get("LOCKGATE_TEST_MYSQL", SHARED_DEFAULT)
    why = _reachable(dsn)
    if why:
        missing(why + " (set LOCKGATE_TEST_MYSQL)")
    return dsn


@contextlib.contextmanager
def throwaway_mariadb(settings: tuple[str, ...] = ()) -> Iterator[str]:
    """Start a MariaDB server of its own with the binlog on in row format
    and yield its DSN; stop and remove it afterwards."""
    install, server = shutil.which("mariadb-install-db"), None
    for name in ("mariadbd", "mysqld"):
        server = server or shutil.which(name) or (
            f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if install is None or server is None:
        missing("mariadb-install-db/mariadbd not found (install MariaDB's server binaries) "
                "and LOCKGATE_TEST_MYSQL_BINLOG is not set")
    assert install is not None and server is not None
    root = Path(tempfile.mkdtemp(prefix="lg-my-"))
    data, log = root / "data", root / "error.log"
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    try:
        subprocess.run([install, "--no-defaults", f"--datadir={data}", *as_root,
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail("cannot install a throwaway MariaDB data folder: "
                    + (e.stdout + e.stderr).decode(errors="replace")[-2000:])
    port = _free_port()
    proc = subprocess.Popen(
        [server, "--no-defaults", f"--datadir={data}", *as_root, f"--port={port}",
         "--bind-address=127.0.0.1", f"--socket={root}/sock", f"--pid-file={root}/pid",
         f"--log-error={log}", f"--log-bin={data}/binlog", "--server-id=1",
         "--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
         "--character-set-server=utf8mb4", "--skip-name-resolve",
         "--innodb-flush-log-at-trx-commit=0", "--sync-binlog=0",
         "--innodb-buffer-pool-size=64M", "--max-connections=300", *settings],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dsn = f"mysql://root@127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while _reachable(dsn) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                pytest.fail(f"cannot start a throwaway MariaDB server: {detail}")
            time.sleep(0.2)
        yield dsn
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def mysql_binlog() -> Iterator[str]:
    """The DSN of a server with the binlog on in row format."""
    dsn = os.environ.get("LOCKGATE_TEST_MYSQL_BINLOG")
    if dsn:
        why = _reachable(dsn)
        if why:
            missing(why + " (LOCKGATE_TEST_MYSQL_BINLOG)")
        yield dsn
        return
    try:
        import pymysql  # noqa: F401
    except ImportError as e:
        missing(f"PyMySQL is not installed ({e}): pip install -e '.[dev]'")
    with throwaway_mariadb() as dsn:
        yield dsn


def execute(dsn: str, *statements: str, args: tuple = ()) -> None:
    """Run ``statements`` in autocommit mode (DDL of a test's own tables)."""
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            for s in statements:
                cur.execute(s, args or None)
    finally:
        conn.close()


def query(dsn: str, statement: str, args: tuple = ()) -> list[tuple]:
    """The rows of one query, in autocommit mode."""
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args or None)
            return list(cur.fetchall())
    finally:
        conn.close()


def connect(dsn: str) -> Any:
    """A PyMySQL connection (autocommit, utf8mb4)."""
    return _connect(dsn)
