"""The type checker is clean on the checked paths.

What is checked, and how strictly, is pyproject.toml's ``[tool.mypy]``: its
``files`` list is the one place that names the checked paths (add a package
there once it is clean). Modules those import are read for their types only.
The cache (``.mypy_cache`` at the repository's root) makes a re-run take a
few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean_on_the_checked_paths():
    pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"mypy is not clean:\n{run.stdout}{run.stderr}"
