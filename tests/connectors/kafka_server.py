"""A Kafka broker for the Kafka tests, as a session fixture any test module
may import (``from tests.connectors.kafka_server import kafka_broker_fixture``: the
fixture ``kafka_broker``).

``LOCKGATE_TEST_KAFKA=host:port`` names a broker to use. Unset, the fixture
starts its own: ``noida-db`` (the PyPI package, pinned in the ``dev`` extra:
one local binary that speaks Kafka's protocol, with transactions,
``read_committed`` and producer fencing) with only its Kafka service, on a
free port, its data in a temporary folder, stopped after the session. The
benchmark and the example's test start one the same way
(:func:`noida_broker`).

A broker that cannot be had skips the tests locally, with the reason, and
fails them in CI (``CI`` set).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest

START_TIMEOUT = 30.0


def missing(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def noida_binary() -> str:
    """The ``noida-db`` executable the package ships (not its Python wrapper,
    whose subprocess a signal to the wrapper would not stop)."""
    try:
        path = Path(str(files("noida_db").joinpath("noida-db")))
    except ModuleNotFoundError as e:
        raise FileNotFoundError(
            "noida-db is not installed: pip install -e '.[dev]' (or noida-db==0.2.3)") from e
    if not path.is_file():
        raise FileNotFoundError(f"noida-db's binary is not at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return str(path)


def wait_ready(bootstrap: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Return once a broker answers a metadata request at ``bootstrap``."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    host, _, port = bootstrap.rpartition(":")
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"noida-db exited with {proc.returncode}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            time.sleep(0.05)  # the process is starting: nothing to await but its port
            continue
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
        return
    raise TimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout} s")


@contextlib.contextmanager
def noida_broker(parent: str | None = None) -> Iterator[str]:
    """Start a noida-db Kafka broker of its own, its data in a new folder in
    ``parent`` (default: the temporary folder); yield ``host:port``; stop it."""
    folder = tempfile.mkdtemp(prefix="lockgate-kafka-", dir=parent)
    port = _free_port()
    log = open(Path(folder) / "noida.log", "wb")
    proc = subprocess.Popen(
        [noida_binary(), "start", "--only", "kafka", "--kafka-port", str(port),
         "--host", "127.0.0.1", "--data-dir", str(Path(folder) / "data")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    bootstrap = f"127.0.0.1:{port}"
    try:
        try:
            wait_ready(bootstrap, START_TIMEOUT, proc)
        except (RuntimeError, TimeoutError) as e:
            output = (Path(folder) / "noida.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{e}; its output:\n{output}") from e
        yield bootstrap
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", name="kafka_broker")
def kafka_broker_fixture() -> Iterator[str]:
    """``host:port`` of a Kafka broker for the session."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as e:
        missing(f"confluent-kafka is not installed ({e}): pip install -e '.[dev]'")
    named = os.environ.get("LOCKGATE_TEST_KAFKA")
    if named:
        try:
            wait_ready(named, 10.0)
        except Exception as e:
            missing(f"no Kafka broker at LOCKGATE_TEST_KAFKA={named}: {e}")
        yield named
        return
    try:
        broker = noida_broker()
        bootstrap = broker.__enter__()
    except (OSError, RuntimeError) as e:
        missing(f"could not start a noida-db Kafka broker ({e}); pip install -e '.[dev]' "
                "or set LOCKGATE_TEST_KAFKA=host:port")
        return
    try:
        yield bootstrap
    finally:
        broker.__exit__(None, None, None)
