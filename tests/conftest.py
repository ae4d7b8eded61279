"""Test-wide settings; the shared fixtures are in ``tests/fixtures.py``."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.fixtures"]

# Jobs started by the tests register with the REST API's discovery folder:
# keep it away from the user's own (~/.local/state/lockgate), for every
# process the tests start too (they inherit the environment).
if "LOCKGATE_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="lockgate-tests-home-")
    os.environ["LOCKGATE_HOME"] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)


# ------------------------------------------------------------------ markers

_AREAS = ("unit", "integration", "fault", "connectors", "security", "docs")
# The fast loop (`pytest -m "not slow"`, CONTRIBUTING.md) leaves out the
# kill suites, the real servers, every Spark run and the long files below.
_SLOW_AREAS = {"fault", "connectors"}
# `pytest -n 2` (pyproject.toml): the tests of the shared servers
# (PostgreSQL, MariaDB, Redis, NATS, RabbitMQ: tables, slots and streams by
# name), the kill suites and the docs' blocks run in one worker, one after
# another; the rest spreads over both (pytest_xdist_make_scheduler below)
_SERIAL = ("tests/connectors/", "tests/fault/", "tests/docs/")
_SLOW_FILES = {
    "docs/test_docs.py", "security/test_load.py", "security/test_rest_fuzz.py",
    "security/test_wire_fuzz.py", "integration/test_nexmark.py", "integration/test_examples.py",
    "integration/test_rocksdb_s3.py", "integration/test_s3_storage.py",
    "integration/test_dashboard.py", "integration/test_progress.py", "integration/test_rest.py",
    "integration/test_source_rescale.py", "integration/test_arrow.py",
    "integration/test_lakehouse.py", "integration/test_lakehouse_readers.py",
    "integration/test_run_again.py", "integration/test_stop.py",
    "integration/test_rescale_cli.py", "security/test_crafted_files.py",
}


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        parts = item.path.parts
        area = next((a for a in _AREAS if a in parts[-3:-1]), None)
        if area is not None:
            item.add_marker(getattr(pytest.mark, area))
        if (area in _SLOW_AREAS or "/".join(parts[-2:]) in _SLOW_FILES
                or "spark" in item.path.name or "[spark" in item.name or "-spark" in item.name):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: object, log: object) -> object:
    """With pytest-xdist: every test of ``_SERIAL`` in one scope (one worker,
    in order), every other test a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class SerialServers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "serial" if nodeid.startswith(_SERIAL) else nodeid

    return SerialServers(config, log)
