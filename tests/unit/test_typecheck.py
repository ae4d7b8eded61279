"""The type checker is clean on the whole package, in strict mode.

What is checked, and how strictly, is pyproject.toml's ``[tool.mypy]``:
``strict = true`` over ``files = ["lockgate"]``; the only per-module
overrides are for third-party libraries without types (their imports are
Any), never for Lockgate's own modules. Modules those import are read for
their types only. The cache (``.mypy_cache`` at the repository's root) makes
a re-run take a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_configured_strict_on_the_whole_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config.get("strict") is True, "[tool.mypy] strict = true"
    assert config.get("files") == ["lockgate"], "[tool.mypy] files = ['lockgate']"
    for override in config.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) \
            else [override["module"]]
        own = [m for m in modules if m.split(".")[0] == "lockgate"]
        assert not own, f"a [[tool.mypy.overrides]] loosens Lockgate's own {own}: fix the types"
        assert set(override) - {"module"} <= {"ignore_missing_imports", "follow_imports"}, (
            f"{modules}: overrides may only say how a third-party library is read")


def test_mypy_is_clean_on_the_checked_paths():
    pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"mypy is not clean:\n{run.stdout}{run.stderr}"
