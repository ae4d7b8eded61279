"""Which failure an attempt reports when one task's error breaks its peers'
channels: the reports come through separate connections, in any order."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockgate import CheckpointConfig, KeyedProcessFunction, NoRestart, Pipeline
from lockgate.cluster.jobmaster import AttemptFailed, JobMaster, prepare_job
from lockgate.cluster.server import Event
from lockgate.connectors import CollectSink, SequenceSource

SOURCE, DOWN_0, DOWN_1 = 1, 2, 3  # parallelism 2: tasks 0-1 read, 2-3 process


class Echo(KeyedProcessFunction):
    def process_element(self, value, ctx):
        return [value]


@pytest.fixture
def master(tmp_path: Path):
    p = Pipeline("cause", parallelism=2, restart=NoRestart(),
                 checkpoint=CheckpointConfig(storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 10), uid="numbers")
       .key_by(lambda x: x % 3)
       .process(Echo(), uid="echo")
       .sink(CollectSink(str(tmp_path / "collect")), uid="out"))
    master, _ = prepare_job(p, launcher="local", rest=False)
    yield master
    master.server.close()


def failed(task: int, error_type: str, error: str) -> Event:
    return Event("message", 0, task, {"t": "failed", "error_type": error_type,
                                      "error": f"{error_type}: {error}", "traceback": ""})


def broken_channel(task: int) -> AttemptFailed:
    return AttemptFailed(f"task {task} failed: ConnectionError: input channel from task "
                         f"{SOURCE} broke", task, "ConnectionError")


def test_a_peer_that_reported_a_broken_channel_is_no_silent_death(master: JobMaster) -> None:
    """The order seen in CI: both downstream tasks report the broken channel
    and disconnect before the source's own report arrives. The second one's
    disconnection is not a death without a report: the source's error is the cause."""
    for ev in (failed(DOWN_1, "ConnectionError", "input channel from task 1 broke"),
               Event("disconnected", 0, DOWN_1),
               failed(SOURCE, "UserFunctionError", "the key selector broke"),
               Event("disconnected", 0, SOURCE)):
        master.events.put(ev)
    cause = master._root_cause(broken_channel(DOWN_0))
    assert (cause.task, cause.error_type) == (SOURCE, "UserFunctionError"), cause.reason
    assert "the key selector broke" in cause.reason


def test_a_peer_that_disconnects_without_a_report_died(master: JobMaster) -> None:
    """A task gone without saying why (SIGKILL) is the cause."""
    master.events.put(Event("disconnected", 0, SOURCE))
    cause = master._root_cause(broken_channel(DOWN_0))
    assert cause.task == SOURCE and "lost its connection" in cause.reason
