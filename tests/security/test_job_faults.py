"""Faults inside the job (issue 11, items 6, 8 and 10): a record that cannot
be sent to the next task, a savepoint to another filesystem, fsync errors and
savepoint folders that must be refused.

Functions the tasks run are defined at module level, so the task processes
import them from this module.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, NoRestart, Pipeline
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.errors import JobFailedError

# ------------------------------------------------ item 6: unpicklable records


class Holder:
    """A record holding a lock: pickle refuses it."""

    def __init__(self, x: int) -> None:
        self.x = x
        self.lock = threading.Lock()


def bad(x: int) -> object:
    return Holder(x) if x == 50 else x


def _unpicklable_job(tmp: Path, restart, partition: str) -> Pipeline:
    p = Pipeline("unpicklable", parallelism=2, restart=restart,
                 checkpoint=CheckpointConfig(interval=0.5, storage=str(tmp / "chk")))
    stream = p.source(SequenceSource(1, 200), uid="numbers").map(bad, uid="bad")
    if partition == "rebalance":
        stream = stream.rebalance().map(repr, uid="after")
    else:
        stream = stream.key_by(lambda r: 0).reduce(lambda a, b: b, uid="after")
    stream.sink(CollectSink(), uid="out")
    return p


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partition", ["rebalance", "key_by"])
def test_an_unpicklable_record_fails_the_job_naming_its_operator(
        tmp_path: Path, launcher: str, partition: str) -> None:
    """The record crosses a channel: the attempt fails at once with the
    operator that emitted it and pickle's reason, and with NoRestart the job
    fails (nothing hangs)."""
    started = time.monotonic()
    with pytest.raises(JobFailedError) as failed:
        _unpicklable_job(tmp_path, NoRestart(), partition).run(launcher=launcher)
    message = str(failed.value)
    assert ("operator 'bad' emitted a record that cannot be sent to the next task: "
            "TypeError: cannot pickle '_thread.lock' object") in message, message
    assert "UserFunctionError" in message, message
    assert time.monotonic() - started < 120


@pytest.mark.timeout(240)
def test_an_unpicklable_record_restarts_by_the_strategy(tmp_path: Path) -> None:
    """Not a fatal error: the job restarts as its strategy says (the same
    record fails every attempt), then fails with the same cause."""
    with pytest.raises(JobFailedError) as failed:
        _unpicklable_job(tmp_path, FixedDelayRestart(max_attempts=2, delay_s=0.0),
                         "rebalance").run(launcher="local")
    message = str(failed.value)
    assert "after 3 failure(s) (2 restarts)" in message, message
    assert "operator 'bad' emitted a record that cannot be sent" in message, message
