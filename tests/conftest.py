"""Test-wide settings; the shared fixtures are in ``tests/fixtures.py``."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

pytest_plugins = ["tests.fixtures"]

# Jobs started by the tests register with the REST API's discovery folder:
# keep it away from the user's own (~/.local/state/lockgate), for every
# process the tests start too (they inherit the environment).
if "LOCKGATE_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="lockgate-tests-home-")
    os.environ["LOCKGATE_HOME"] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
