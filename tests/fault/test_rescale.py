"""Restore a checkpoint at another parallelism, after the driver itself was
SIGKILLed: keyed state moves by key group, source splits are dealt out again,
and the committed output of both runs together is exact."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys

import pytest

from tests.fault.checks import HERE, task_pids
from tests.fixtures import check_exact_sums

N = 60_000


def wait_for_exit(pids: set[int], timeout: float = 30.0) -> None:
    """Await the exit of processes that are not our children (pidfd: an event)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"task process {pid} did not exit"
        finally:
            os.close(fd)


def start(tmp_path, name: str, parallelism: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(HERE / "sums_job.py"), "--n", str(N), "--parallelism",
           str(parallelism), "--keys", "5", "--out", str(tmp_path / "out"), "--storage",
           str(tmp_path / name), "--interval", "0.1", "--progress", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("before,after", [(2, 3), (3, 1), (2, 4)])
def test_kill_driver_then_resume_at_other_parallelism(tmp_path, before, after):
    # Run A until it completed 3 checkpoints, then SIGKILL the driver itself.
    a = start(tmp_path, "chk-a", before, "--rate", "20000")
    latest = None
    assert a.stdout is not None
    for line in a.stdout:
        msg = json.loads(line)
        if "progress" in msg and msg["progress"]["checkpoints_completed"] >= 3:
            latest = msg["progress"]["last_checkpoint_id"]
            break
    assert latest is not None, a.stderr.read() if a.stderr else ""
    tasks = task_pids(a.pid)
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    wait_for_exit(tasks)  # orphaned tasks notice the lost driver and exit
    job_dir = next((tmp_path / "chk-a").iterdir())
    chk = sorted(job_dir.glob("chk-*/_metadata"), key=lambda p: int(p.parent.name[4:]))[-1]
    # B resumes from A's latest completed checkpoint, at another parallelism.
    b = start(tmp_path, "chk-b", after, "--from-checkpoint", str(chk.parent))
    out, err = b.communicate(timeout=120)
    assert b.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["restarts"] == 0
    check_exact_sums(tmp_path / "out", N, 5)
