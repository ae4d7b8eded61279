"""The CDC tests' ``Stopper`` (``cdc_checks``) with a real job and a real
random killer (``drive``): it stops the writer only once every kill landed
and the attempt after the last one runs; a job or a limit that comes first
fails, naming what it still waited for. The job is the running sums of
``tests/fault/sums_job.py``, which ends by itself; the writer is only its
stop event."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.connectors.cdc_checks import Stopper
from tests.fault.checks import drive

SUMS_JOB = Path(__file__).parents[1] / "fault" / "sums_job.py"


def _cmd(tmp: Path, n: int, rate: float) -> list[str]:
    return [sys.executable, str(SUMS_JOB), "--n", str(n), "--parallelism", "2",
            "--out", str(tmp / "out"), "--storage", str(tmp / "chk"), "--rate", str(rate)]


def _writer() -> Any:
    return SimpleNamespace(stop=threading.Event())


def test_the_writer_stops_once_the_kill_landed_and_the_next_attempt_runs(tmp_path):
    writer = _writer()
    stopper = Stopper(writer, after=0.0, limit=120)
    result, done = drive(_cmd(tmp_path, 40_000, 2000), kills=1, tasks=4, seed=1,
                         kill_delays=(0.2, 0.5), timeout=300, watcher=stopper)
    assert done == 1 and result["status"] == "finished", result
    assert writer.stop.is_set()
    assert stopper.stopped_at is not None and stopper.stopped_at[0] == 1
    assert stopper.stopped_at[1] >= 1, "stopped before the attempt after the kill ran"


def test_a_limit_reached_before_the_kill_landed_fails_naming_it(tmp_path):
    writer = _writer()
    stopper = Stopper(writer, after=0.0, limit=1.0)
    with pytest.raises(AssertionError, match=r"random killer's kills \(0 of 1 landed"):
        drive(_cmd(tmp_path, 8000, 2000), kills=1, tasks=4, seed=1,
              kill_delays=(600.0, 600.0), timeout=300, watcher=stopper)
    assert writer.stop.is_set() and stopper.stopped_at is None


def test_a_job_that_ends_first_fails_naming_what_the_stopper_waited_for(tmp_path):
    stopper = Stopper(_writer(), after=600.0)
    with pytest.raises(AssertionError, match="the job ended while the writer waited for "
                                             "600 s of writes"):
        drive(_cmd(tmp_path, 200, 1000), kills=0, tasks=4, seed=0, kill_delays=(1, 1),
              timeout=300, watcher=stopper)
