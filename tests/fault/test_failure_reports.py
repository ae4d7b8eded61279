"""What a failed attempt reports, and how soon the job restarts: a task killed
with SIGKILL is the one named (never a peer whose channel the death reset),
and tasks that keep failing with different errors in turn back off as one
failing the same way does."""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import threading
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from lockgate.errors import JobFailedError
from tests.fault.checks import task_processes
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums, start_and_await

N = 6_000_000
KEYS = 3
# tasks of the sums job at parallelism 2: numbers->pairs [0] [1], sums->out [0] [1]
VICTIMS = [(2, "sums->out[0]"), (1, "numbers->pairs[1]"), (3, "sums->out[1]"),
           (0, "numbers->pairs[0]")]


def test_the_killed_task_is_the_one_named(tmp_path: Path, launcher: str) -> None:
    """SIGKILL sink and source tasks in turn, one per attempt, while records
    flow at full speed (their peers see reset connections and broken pipes
    first): each failure names the killed task, and the output is exact."""
    p = build(N, 2, KEYS, str(tmp_path / "out"), str(tmp_path / "chk"), 0.2)
    progressed = [threading.Event() for _ in VICTIMS]

    def on_progress(progress) -> None:
        if progress.restarts < len(progressed):
            progressed[progress.restarts].set()

    def killer() -> None:
        for attempt, (task, _) in enumerate(VICTIMS):
            if not progressed[attempt].wait(120):
                return
            pid = next((pid for pid, at in task_processes(os.getpid()).items()
                        if at == (attempt, task)), None)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = p.run(launcher=launcher, on_progress=on_progress)
    thread.join(10)
    assert result.restarts == len(VICTIMS), result.failures
    for (task, name), reason in zip(VICTIMS, result.failures, strict=True):
        assert reason.startswith(f"task {name} (task {task}) "), result.failures
        assert "Connection" not in reason.split("(and")[0], result.failures
        if launcher == "local":  # the process's exit names the signal (not a lost connection)
            assert reason.split(" (and")[0].endswith("was killed by SIGKILL"), result.failures
    check_exact_sums(tmp_path / "out", N, KEYS)


def _flaky(x: int) -> int:
    raise ValueError(f"flaky service answered {random.random():.6f}")


def test_back_off_grows_when_failures_differ_in_turn(tmp_path: Path, launcher: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Every attempt fails with another error (another task, another message)
    and no checkpoint completes in between: the delays grow 0, 0.5, 1, 2 s,
    and the job fails after its restarts."""
    p = Pipeline("flaky", parallelism=2,  # no periodic checkpoint: none completes in between
                 checkpoint=CheckpointConfig(interval=None, storage=str(tmp_path / "chk")),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    (p.source(SequenceSource(1, 1000), uid="numbers").map(_flaky, uid="flaky")
       .sink(FileSink(str(tmp_path / "out")), uid="out"))
    with caplog.at_level(logging.WARNING, logger="lockgate.driver"), \
            pytest.raises(JobFailedError, match="failed after 4 failure"):
        p.run(launcher=launcher)
    reasons = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    delays = [float(m[1]) for r in reasons if (m := re.search(r"in (\d+\.\d\d) s", r))]
    assert delays == [0.0, 0.5, 1.0], reasons


def test_a_tasks_own_report_is_never_replaced_by_its_exit_code(tmp_path: Path,
                                                               launcher: str) -> None:
    """Every task fails in its restore (a state whose kind changed) and exits
    at once: its exit event may reach the driver before its report. Run after
    run, the job fails naming the state and both kinds, never a bare exit code."""
    from tests.integration.test_savepoints import CountV1, CountV2, _counting

    client = start_and_await(_counting(tmp_path, CountV1(), 100_000, 20_000, held=True),
                             launcher=launcher)
    savepoint = client.stop(dir=str(tmp_path / "sp")).savepoint
    for _ in range(4):
        with pytest.raises(JobFailedError) as info:
            _counting(tmp_path, CountV2(), 100_000, None).run(launcher=launcher,
                                                              from_savepoint=savepoint)
        message = str(info.value)
        assert "'count'" in message and "list" in message, message
        assert "exited with code" not in message and "Restarting cannot help" in message
