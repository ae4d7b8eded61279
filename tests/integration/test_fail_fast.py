"""Errors a restart cannot fix end the job at once, with one clear message:
what the driver can check is checked before any task starts (a missing
input folder, a parallelism above max_parallelism), and a task's import
error fails the job without restarts. Each runs `lockgate run` in a
subprocess, on both launchers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_rest import _env

HEADER = """
from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, FileSource, SequenceSource

p = Pipeline("fail-fast", parallelism=2,
             checkpoint=CheckpointConfig(interval=0.2, storage={chk!r}))
"""
APPS = {
    "missing-folder": """
p.source(FileSource({missing!r}), uid="lines").sink(FileSink({out!r}), uid="out")
""",
    "parallelism": """
p.source(SequenceSource(1, 1000), uid="numbers").sink(FileSink({out!r}), uid="out")
""",
    "import-error": """
def triple(x):
    import lockgate_no_such_module  # noqa: F401
    return 3 * x


p.source(SequenceSource(1, 1000), uid="numbers").map(triple, uid="triples").sink(
    FileSink({out!r}), uid="out")
""",
}
EXPECTED = {
    "missing-folder": "file source folder '{missing}' does not exist; create it or fix the path",
    "parallelism": "parallelism 200 of numbers->out must be in 1..max_parallelism (128)",
    "import-error": "No module named 'lockgate_no_such_module'. Restarting cannot help",
}


@pytest.mark.parametrize("case", list(APPS))
def test_an_error_no_restart_can_fix_ends_the_job_at_once(tmp_path: Path, launcher: str,
                                                          case: str) -> None:
    names = {"chk": str(tmp_path / "chk"), "out": str(tmp_path / "out"),
             "missing": str(tmp_path / "typo")}
    app = tmp_path / "app.py"
    app.write_text(HEADER.format(**names) + APPS[case].format(**names))
    extra = ["--parallelism", "200"] if case == "parallelism" else []
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "lockgate.cli", "run", str(app),
                          "--launcher", launcher, *extra],
                         cwd=tmp_path, env=_env(tmp_path / "home"), capture_output=True,
                         text=True, timeout=300)
    took = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    expected = EXPECTED[case].format(**names)
    assert output.count(expected) == 1, output
    assert "restarting" not in output and "failed the same way" not in output, output
    assert "ConnectionRefusedError" not in output and "ConnectionResetError" not in output
    if case == "import-error":  # the task's own traceback, once
        assert output.count("Traceback") == 1, output
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    else:  # refused in the driver: no task, no Spark job, no checkpoint folder
        assert "Traceback" not in output and "job " not in output.split("error:")[0], output
        assert not (tmp_path / "chk").exists()
    # a few seconds (a Spark session's cold start for the task's error), on a loaded machine
    assert took < (60 if case == "import-error" and launcher == "spark" else 30), took
