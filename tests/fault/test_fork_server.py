"""Every process of a job is in the fault model: the local launcher's fork
server, and the start of an attempt.

- SIGKILLs of the fork server, at random moments of a running attempt and
  while it forks the tasks of the next one, are failed attempts: the job
  restarts on a new server and its committed output is exact, record by record.
- Orphaned tasks end by themselves within seconds: after their driver or their
  fork server was SIGKILLed, even while blocked restoring state.
- The start-up watchdog: an attempt whose tasks do not all register in time
  fails with the reason in the log, and the job recovers (both launchers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.fault.checks import HERE, fork_servers, run_job, task_processes
from tests.fixtures import check_exact_sums

N = 60_000


def _cmd(tmp_path, *, n: int, faults: list, launcher: str = "local",
         extra: list[str] | None = None) -> list[str]:
    return [sys.executable, str(HERE / "sums_job.py"), "--n", str(n), "--parallelism", "2",
            "--out", str(tmp_path / "out"), "--storage", str(tmp_path / "chk"),
            "--interval", "0.2", "--faults", json.dumps(faults), "--launcher", launcher,
            *(extra or [])]


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)  # polling /proc: no event to await for others' processes
    raise AssertionError(f"not within {timeout} s: {what}")


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] != "Z":
                    alive.add(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return alive


def _tasks_blocked_in_restore(driver: subprocess.Popen, n: int) -> set[int]:
    """The pids of the driver's ``n`` tasks of attempt 0, once all run (each
    hangs in restore: the fault below); a moment later they are there."""
    pids = _wait_for(lambda: {p for p, (a, _) in task_processes(driver.pid).items() if a == 0}
                     if len(task_processes(driver.pid)) == n else None, 60, "all tasks running")
    time.sleep(0.3)  # from its name to the fault point: a few lines of code
    return set(pids)


HANG_IN_RESTORE = [{"point": "restore", "attempt": 0, "signal": "hang"}]


def test_random_kills_of_the_fork_server_and_tasks(tmp_path):
    """Half the kills strike the fork server (half of those while it forks the
    next attempt's tasks), the others a task: every one a failed attempt."""
    result, kills = run_job(tmp_path, n=4 * N, parallelism=2, kills=6, seed=5, interval=0.2,
                            keys=7, extra=["--rate", "50000"], kill_delays=(0.1, 0.6),
                            kill_fork_server=0.5)
    check_exact_sums(tmp_path / "out", 4 * N, 7)
    assert result["status"] == "finished", result["failures"]
    assert result["records_in"] == 4 * N and result["records_out"] == 4 * N
    assert kills == 6, f"only {kills} kills happened"
    assert result["fork_server_kills"] >= 2, result["fork_server_kills"]
    assert result["restarts"] >= kills - 1, result["failures"]


def test_tasks_end_when_the_fork_server_is_killed_during_restore(tmp_path):
    """Every task hangs restoring its state; the fork server is SIGKILLed: the
    tasks die with it, and the job restarts on a new server and ends exact."""
    driver = subprocess.Popen(_cmd(tmp_path, n=N, faults=HANG_IN_RESTORE),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tasks = _tasks_blocked_in_restore(driver, 4)
        (server,) = fork_servers(driver.pid)
        os.kill(server, signal.SIGKILL)
        _wait_for(lambda: not _alive(tasks), 5, f"tasks {tasks} gone")
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["restarts"] == 1, result["failures"]
    check_exact_sums(tmp_path / "out", N, 2)


def test_tasks_end_when_their_driver_is_killed_during_restore(tmp_path, launcher):
    """The driver is SIGKILLed while every task hangs restoring its state:
    the tasks (and the local launcher's fork server) end within seconds."""
    driver = subprocess.Popen(_cmd(tmp_path, n=N, faults=HANG_IN_RESTORE, launcher=launcher),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tasks = _tasks_blocked_in_restore(driver, 4) | fork_servers(driver.pid)
    finally:
        driver.kill()
        driver.wait()
    _wait_for(lambda: not _alive(tasks), 8, f"fork server and tasks {tasks} gone")


def test_tasks_end_when_their_driver_is_killed_and_the_fork_server_is_frozen(tmp_path):
    """The fork server is frozen (it cannot end, so its tasks do not die with
    it) and the driver SIGKILLed while every task hangs restoring its state:
    each task ends by itself, having lost its control connection."""
    driver = subprocess.Popen(_cmd(tmp_path, n=N, faults=HANG_IN_RESTORE),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (server,) = _wait_for(lambda: fork_servers(driver.pid), 60, "a fork server")
    try:
        tasks = _tasks_blocked_in_restore(driver, 4)
        os.kill(server, signal.SIGSTOP)
        driver.kill()
        driver.wait()
        _wait_for(lambda: not _alive(tasks), 10, f"tasks {tasks} gone")
    finally:
        os.kill(server, signal.SIGKILL)


def test_an_attempt_that_does_not_start_is_failed_and_restarted(tmp_path, launcher):
    """A task of the first attempt freezes before it registers: the start-up
    watchdog fails the attempt with the reason in the log, and the job
    restarts (on Spark: on a new stage) and ends exact."""
    faults = [{"point": "register", "task": 1, "attempt": 0, "signal": "SIGSTOP"}]
    driver = subprocess.run(
        _cmd(tmp_path, n=N, faults=faults, launcher=launcher, extra=["--start-timeout", "4"]),
        capture_output=True, text=True, timeout=240)
    assert driver.returncode == 0, driver.stderr[-3000:]
    result = json.loads(driver.stdout.strip().splitlines()[-1])
    check_exact_sums(tmp_path / "out", N, 2)
    assert result["restarts"] == 1, result["failures"]
    reason = result["failures"][0]
    assert "attempt 0 did not start: 1 of 4 task(s) not registered 4 s" in reason, reason
    assert "numbers->pairs[1] (task 1)" in reason, reason
    assert "attempt 0 did not start" in driver.stderr, driver.stderr[-3000:]
