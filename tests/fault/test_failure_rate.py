"""The failure-rate restart strategy with real processes: tasks SIGKILLed
now and then (under the rate) never use the restarts up, and the job ends
exact; a burst over the rate fails the job naming the strategy and the
failures. Local launcher: the strategy is the driver's, whichever launcher."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from lockgate import FailureRateRestart
from lockgate.errors import JobFailedError
from tests.fault.checks import task_processes
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums

N = 150_000
RATE = 10_000.0  # records/s: the job lasts 15 s at least, whatever the machine's load
KEYS = 3
VICTIMS = [2, 1, 3]  # sums->out[0], numbers->pairs[1], sums->out[1]


def _run_killing(tmp_path: Path, strategy: FailureRateRestart, gap: float,
                 kills: int) -> tuple[object, int]:
    """Run the sums job under ``strategy``, SIGKILLing one task of each of the
    first ``kills`` attempts once it completed a checkpoint, and, but for the
    first, ``gap`` seconds later (so that failures are seen ``gap`` seconds
    apart at least: the restarted attempt's checkpoint comes after the
    previous failure was seen); the job's result (or its error) and the kills."""
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2, rate=RATE)
    p.restart = strategy
    progressed = [threading.Event() for _ in range(kills)]
    killed: list[int] = []

    def on_progress(progress) -> None:
        if progress.restarts < kills:
            progressed[progress.restarts].set()

    def killer() -> None:
        for attempt in range(kills):
            if not progressed[attempt].wait(120):
                return
            if attempt:
                time.sleep(gap)
            victim = VICTIMS[attempt % len(VICTIMS)]
            pid = next((pid for pid, at in task_processes(os.getpid()).items()
                        if at == (attempt, victim)), None)
            if pid is not None:
                killed.append(victim)
                os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        result: object = p.run(launcher="local", on_progress=on_progress)
    except JobFailedError as e:
        result = e
    thread.join(10)
    return result, len(killed)


def test_failures_spread_under_the_rate_never_use_the_restarts_up(tmp_path: Path) -> None:
    """One failure allowed per second, three kills 2 s or more apart: the job
    restarts each time (a count of one restart would have failed it) and
    its output is exact."""
    result, killed = _run_killing(
        tmp_path, FailureRateRestart(max_failures_per_interval=1, interval_s=1.0), 2.0, 3)
    assert not isinstance(result, JobFailedError), result
    assert killed == 3 and result.restarts == 3, (killed, result.failures)
    for victim, reason in zip(VICTIMS, result.failures, strict=True):
        assert f"(task {victim})" in reason, result.failures  # the killed task, by name
    check_exact_sums(tmp_path / "out", N, KEYS)


def test_a_burst_over_the_rate_fails_the_job_naming_the_strategy(tmp_path: Path) -> None:
    """One failure allowed per 2 minutes: the second kill, as soon as the
    restarted attempt runs, fails the job; its message names the strategy,
    its limit and both failures."""
    result, killed = _run_killing(
        tmp_path, FailureRateRestart(max_failures_per_interval=1, interval_s=120.0), 0.0, 2)
    assert killed == 2, killed
    assert isinstance(result, JobFailedError), result
    message = str(result)
    assert ("FailureRateRestart(max_failures_per_interval=1, interval_s=120) allows 1 "
            "failure(s) in 120 s, and 2 came within") in message, message
    named = f"(task {VICTIMS[0]}) " in message and f"(task {VICTIMS[1]}) " in message
    assert named, message  # both failures, each naming its killed task
