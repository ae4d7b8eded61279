"""Local recovery on both launchers (``RocksDBStateBackend(local_recovery=True)``,
the default): after SIGKILLs at protocol points, every keyed task restores
from its local copy and says so; with the copies damaged while the job is
frozen (a truncated SST file, a deleted one, one swapped for a symbolic link
to the same bytes), every keyed task refuses its copy with the reason and
reads the checkpoint storage; a job run again after its driver was
SIGKILLed resumes from the copies its killed run left; the output is exact
every time, and the job's copies are gone once it ended.

The job is the suite's sums job (``sums_job.py``) on RocksDB
(``LOCKGATE_STATE_BACKEND``), its local folders under the test's ``TMPDIR``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fault.checks import HERE, run_job, task_processes, wait_stopped
from tests.fixtures import check_exact_sums

pytest.importorskip("rocksdict")

N = 60_000
KEYS = 500


@pytest.fixture
def rocksdb(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "rocksdb")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local"))  # the databases and the copies
    (tmp_path / "local").mkdir()


def copy_folders(tmp: Path) -> list[Path]:
    """Every operator folder of local copies (one per keyed task) under the
    test's local folder."""
    return sorted((tmp / "local").glob("lockgate-recovery-*/*/*-kg*"))


def test_kills_restore_from_local_copies(tmp_path, launcher, rocksdb):
    """Four restarts (a keyed task killed after a checkpoint's completion
    notice, a source task after its ack, a keyed task before its ack, a keyed
    task halfway through a changelog upload): each keyed task of each next
    attempt restores from its local copy."""
    p = 2
    faults = [{"point": "commit", "task": p, "attempt": 0, "count": 3},
              {"point": "acked", "task": 0, "attempt": 1, "count": 2},
              {"point": "snapshot", "task": p + 1, "attempt": 2, "count": 2},
              {"point": "changelog", "task": p, "attempt": 3, "count": 2}]
    # a source task's rate counts from its process's start, before the attempt's
    # set-up: a slow set-up (seconds, on Spark under load) is caught up at once,
    # so the job is long enough for each attempt to reach its fault point
    n = 8 * N
    result, _ = run_job(tmp_path, n=n, parallelism=p, keys=KEYS, faults=faults,
                        interval=0.1, extra=["--rate", "30000"], launcher=launcher)
    check_exact_sums(tmp_path / "out", n, KEYS)
    restarts = result["restarts"]
    assert result["status"] == "finished" and restarts >= 4, result["failures"]
    restores = result["local_restores"]
    assert all(r["local"] and r["operator"] == "sums" for r in restores), json.dumps(restores)
    assert {(r["attempt"], r["task"]) for r in restores} == {
        (a, p + i) for a in range(1, restarts + 1) for i in range(p)}, restores
    assert not copy_folders(tmp_path)  # the job ended: its copies went


def _damage(copy: Path, how: str) -> str:
    """Damage the largest SST file of the local copy ``copy``; the reason the
    task is expected to give."""
    largest = max((f for kind in ("db", "log") for f in (copy / kind).iterdir()),
                  key=lambda f: f.stat().st_size)
    if how == "truncate":
        os.truncate(largest, largest.stat().st_size // 2)
        return f"{largest.name} has {largest.stat().st_size} bytes"
    if how == "delete":
        largest.unlink()
        return f"{largest.name} is missing"
    same_bytes = copy.parent / f"{copy.name}-{largest.name}.elsewhere"
    os.link(largest, same_bytes)
    largest.unlink()
    largest.symlink_to(same_bytes)
    return f"{largest.name} is a symbolic link"


def test_damaged_copies_are_refused_and_the_output_stays_exact(tmp_path, launcher, rocksdb):
    """Once 3 checkpoints completed, every task is frozen (SIGSTOP), every
    local copy damaged (each keyed task's another way), one task SIGKILLed:
    the next attempt's keyed tasks each refuse their copy, naming the damage,
    and restore from the checkpoint storage; the output is exact."""
    p, n = 3, 4 * N
    cmd = [sys.executable, str(HERE / "sums_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(KEYS), "--out", str(tmp_path / "out"), "--storage",
           str(tmp_path / "chk"), "--interval", "0.1", "--rate", "30000", "--progress",
           "--launcher", launcher]
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    enough = threading.Event()

    def read() -> None:
        assert driver.stdout is not None
        for line in driver.stdout:
            lines.append(line)
            msg = json.loads(line)
            if "progress" in msg and msg["progress"]["checkpoints_completed"] >= 3:
                enough.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    expected: dict[int, str] = {}
    try:
        assert enough.wait(240), "no 3 checkpoints completed"
        tasks = task_processes(driver.pid)
        attempt = max(a for a, _ in tasks.values())
        running = {pid: t for pid, (a, t) in tasks.items() if a == attempt}
        assert len(running) == 2 * p, tasks
        for pid in running:
            os.kill(pid, signal.SIGSTOP)
        for pid in running:
            wait_stopped(pid)
        time.sleep(0.5)  # acks already sent may still complete a checkpoint: its copy is here
        folders = copy_folders(tmp_path)
        assert len(folders) == p, folders
        for i, folder in enumerate(sorted(folders, key=lambda f: int(f.name.rsplit("-kg")[1]
                                                                     .split("-")[0]))):
            copies = sorted(folder.glob("chk-*"))
            assert copies, folder
            reasons = {_damage(c, ("truncate", "delete", "symlink")[i]) for c in copies}
            expected[p + i] = reasons.pop() if len(reasons) == 1 else "|".join(sorted(reasons))
        victim = next(pid for pid, t in running.items() if t == 0)
        os.kill(victim, signal.SIGKILL)
        for pid in running:
            if pid != victim:
                os.kill(pid, signal.SIGCONT)
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    reader.join(10)
    stderr = driver.stderr.read() if driver.stderr else ""
    assert driver.returncode == 0, stderr[-4000:]
    result = json.loads(lines[-1])
    check_exact_sums(tmp_path / "out", n, KEYS)
    assert result["status"] == "finished" and result["restarts"] == 1, result["failures"]
    first = [r for r in result["local_restores"] if r["attempt"] == 1]
    assert sorted(r["task"] for r in first) == [p + i for i in range(p)], first
    for r in first:
        assert not r["local"], r
        assert any(reason in r["reason"] for reason in expected[r["task"]].split("|")), (
            r, expected)
    assert not copy_folders(tmp_path)


def test_a_run_again_after_the_driver_was_killed_restores_from_local_copies(tmp_path, rocksdb):
    """The driver SIGKILLed once 3 checkpoints completed (nothing deletes its
    job's copies); the job run again resumes its latest checkpoint under the
    same job id, and every keyed task restores from its local copy."""
    from tests.fault.test_rescale import wait_for_exit

    p, n = 2, 8 * N
    cmd = [sys.executable, str(HERE / "sums_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(KEYS), "--out", str(tmp_path / "out"), "--storage",
           str(tmp_path / "chk"), "--interval", "0.1", "--rate", "30000"]
    first = subprocess.Popen([*cmd, "--progress"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert first.stdout is not None
    for line in first.stdout:
        msg = json.loads(line)
        if "progress" in msg and msg["progress"]["checkpoints_completed"] >= 3:
            break
    else:
        raise AssertionError(first.stderr.read() if first.stderr else "no 3 checkpoints")
    tasks = set(task_processes(first.pid))
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    wait_for_exit(tasks)  # orphaned tasks notice the lost driver and exit
    assert copy_folders(tmp_path)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["status"] == "finished", result
    first_attempt = [r for r in result["local_restores"] if r["attempt"] == 0]
    assert sorted(r["task"] for r in first_attempt) == [p, p + 1], result["local_restores"]
    assert all(r["local"] for r in first_attempt), first_attempt
    check_exact_sums(tmp_path / "out", n, KEYS)
    assert not copy_folders(tmp_path)
