"""The benchmarks' CPU accounting of a job's processes (``JobUsage``): a
process that ends keeps the CPU it used, whoever reaps it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from benchmarks.nexmark.measure import JobUsage

# A parent that ignores SIGCHLD, as Spark's Python daemon does, and its
# child, which burns CPU, then ends when told: the kernel reaps it, and its
# CPU never reaches the parent's figure of reaped children.
SCRIPT = """
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if os.fork() == 0:
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass
    (folder / "pid").write_text(str(os.getpid()))
    os.rename(folder / "pid", folder / "burned")  # whole when it appears
    while not (folder / "go").exists():
        time.sleep(0.01)
    os._exit(0)
while not (folder / "end").exists():
    time.sleep(0.01)
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.01)


def test_a_child_reaped_by_a_parent_that_ignores_sigchld_keeps_its_cpu(tmp_path: Path) -> None:
    """The child's 0.4 CPU s, used before the measure began, are in its first
    figure; it ends during the measure: the job's CPU does not drop by them."""
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)])
    try:
        _wait_for(tmp_path / "burned")
        child = Path(f"/proc/{(tmp_path / 'burned').read_text()}")
        usage = JobUsage()
        usage.start()
        time.sleep(0.2)
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 60
        while child.exists():  # the child ends and is reaped; its parent lives on
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        cpu = usage.finish(settle=0.0)["cpu_s"]
    finally:
        (tmp_path / "end").touch()
        parent.wait(30)
    assert cpu > -0.1, f"the job's CPU came out at {cpu:.2f} s"
