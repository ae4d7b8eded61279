"""Every third-party module the package and its examples import is a
declared dependency of ``pyproject.toml`` (or of one of its extras), so a
fresh virtualenv that installs the project has it.

deptry reads the imports and the declared dependencies; its settings are
``[tool.deptry]`` in pyproject.toml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_import_is_a_declared_dependency():
    pytest.importorskip("deptry", reason="deptry is in the dev extra: pip install -e '.[dev]'")
    deptry = shutil.which("deptry", path=str(Path(sys.executable).parent)) or "deptry"
    run = subprocess.run([deptry, "lockgate", "examples"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={"NO_COLOR": "1", "PATH": ""})
    report = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    assert run.returncode == 0, f"undeclared or unused dependencies:\n{report}"


def test_ruff_is_clean():
    pytest.importorskip("ruff", reason="ruff is in the dev extra: pip install -e '.[dev]'")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "lockgate", "tests",
                          "benchmarks", "examples"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"ruff check is not clean:\n{run.stdout}{run.stderr}"
