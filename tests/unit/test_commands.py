"""The job master's requests (``Commands``) alone, with a real checkpoint
coordinator and a fake clock: a savepoint, a stop with a drain, a rescale
from its request to its tasks running, a cancel, and what each request gets
when the attempt fails or the job ends first."""

from __future__ import annotations

import time

import pytest

from lockgate.cluster.commands import CommandKind, Commands
from lockgate.cluster.coordinator import AttemptPlan, CheckpointCoordinator
from lockgate.cluster.failures import JobEnds
from lockgate.config import CheckpointConfig
from lockgate.errors import LockgateError
from lockgate.protocol import Drain, NotifyAborted, TriggerCheckpoint

TASK_OPERATORS = {0: (0, 0, ["src"]), 1: (1, 0, ["sum"])}


class Env:
    def __init__(self, tmp_path) -> None:
        self.now = 100.0
        self.sent: list[tuple[int, object]] = []
        config = CheckpointConfig(interval=None, storage=str(tmp_path), timeout=5.0)
        self.coordinator = CheckpointCoordinator(
            "job", tmp_path / "job", config, {"src": 1, "sum": 1},
            {"src": "split", "sum": "split"}, 128, lambda a, t, m: self.sent.append((t, m)),
            lambda: self.now)
        self.coordinator.start_attempt(AttemptPlan(0, [0], [0, 1], TASK_OPERATORS))
        self.commands = Commands("job", self.coordinator, None,
                                 lambda: self.sent.append((0, Drain())))

    def ack_all(self, n: int) -> None:
        for t, uid in ((0, "src"), (1, "sum")):
            self.coordinator.on_ack(t, n, {uid: None})


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def test_a_savepoint_is_answered_with_its_folder(env, tmp_path):
    future = env.commands.submit(CommandKind.SAVEPOINT, {"dir": str(tmp_path / "sp")},
                                 True, "running")
    env.commands.serve()
    assert env.sent == [(0, TriggerCheckpoint(1, "savepoint"))]
    env.ack_all(1)
    assert not future.done()  # answered by the loop, between its ticks
    env.commands.serve()
    assert future.result(0)["checkpoint_id"] == 1
    assert future.result(0)["path"].startswith(str(tmp_path / "sp"))


def test_a_request_without_a_savepoint_folder_is_refused_naming_the_fix(env):
    future = env.commands.submit(CommandKind.STOP, {}, True, "running")
    env.commands.serve()
    with pytest.raises(LockgateError, match="savepoint_dir"):
        future.result(0)
    assert env.sent == []


def test_a_stop_with_a_drain_ends_with_the_final_savepoint(env, tmp_path):
    future = env.commands.submit(CommandKind.STOP, {"dir": str(tmp_path / "sp"), "drain": True},
                                 True, "running")
    env.commands.serve()
    assert env.sent == [(0, Drain())]
    assert env.commands.busy() == "the job is stopping"
    for t in (0, 1):
        env.coordinator.on_end_of_data(t)
    assert env.sent[-1] == (0, TriggerCheckpoint(1, "savepoint"))
    env.ack_all(1)
    env.commands.drained()
    env.commands.job_ended("stopped", None)
    assert future.result(0)["path"].startswith(str(tmp_path / "sp"))


def test_a_rescale_is_answered_when_the_next_attempts_tasks_run(env):
    future = env.commands.submit(CommandKind.RESCALE, {"graph": None,
                                                       "requested": time.time()}, True, "running")
    env.commands.serve()
    assert env.sent == [(0, TriggerCheckpoint(1, "rescale"))]
    assert env.commands.busy() == "a rescale is in progress"
    assert env.commands.rescaled() is None  # its checkpoint is pending
    env.ack_all(1)
    env.commands.serve()
    cmd = env.commands.rescaled()
    assert cmd is not None and cmd.future is future and env.commands.rescale_checkpoint == 1
    assert not future.done()
    env.commands.rescale_ran({"attempt": 1})
    value = future.result(0)
    assert value["attempt"] == 1 and value["seconds"] >= 0
    env.commands.rescale_ran({"attempt": 2})  # a later attempt: nothing to answer


def test_a_rescale_whose_job_fails_before_its_tasks_run_is_answered(env):
    """The attempt failed during the rescale and the job fails (the restart
    strategy gives up): the request is answered, not left waiting."""
    future = env.commands.submit(CommandKind.RESCALE, {"graph": None,
                                                       "requested": time.time()}, True, "running")
    env.commands.serve()
    assert env.commands.attempt_failed() is not None
    env.commands.job_ended("failed", RuntimeError("gave up"))
    with pytest.raises(LockgateError, match="before the rescaled tasks ran"):
        future.result(0)


def test_a_cancel_ends_the_job_and_is_answered_when_it_ended(env, tmp_path):
    savepoint = env.commands.submit(CommandKind.SAVEPOINT, {"dir": str(tmp_path / "sp")},
                                    True, "running")
    env.commands.serve()
    cancel = env.commands.submit(CommandKind.CANCEL, {}, True, "running")
    with pytest.raises(JobEnds):
        env.commands.serve()
    assert not cancel.done()
    env.commands.job_ended("cancelled", None)
    assert cancel.result(0) == {"status": "cancelled"}
    with pytest.raises(LockgateError, match="before the savepoint completed"):
        savepoint.result(0)


def test_requests_to_a_job_that_is_not_running_are_refused(env):
    with pytest.raises(LockgateError, match="job job is finished"):
        env.commands.submit(CommandKind.SAVEPOINT, {}, False, "finished").result(0)


@pytest.mark.parametrize("kind", [CommandKind.STOP, CommandKind.SAVEPOINT])
def test_a_stop_or_savepoint_after_the_final_checkpoint_is_refused_saying_why(env, tmp_path,
                                                                               kind):
    """The input ended and the final checkpoint is in progress when the stop
    comes: it is refused at once, saying that the final checkpoint follows;
    once that completed (every task was told to end), a request is refused
    saying that all the output is committed. No barrier follows the final
    checkpoint (none would be taken after the tasks' Finish)."""
    for t in (0, 1):
        env.coordinator.on_end_of_data(t)
    assert env.sent == [(0, TriggerCheckpoint(1, "final"))]
    future = env.commands.submit(kind, {"dir": str(tmp_path / "sp")}, True, "running")
    env.commands.serve()
    with pytest.raises(LockgateError, match="is finishing: its input ended and its final "
                                            r"checkpoint follows \(it commits all its "
                                            r"output\), so .* the job ends finished"):
        future.result(0)
    env.ack_all(1)
    sent = len(env.sent)
    assert env.coordinator.trigger(savepoint_dir=str(tmp_path / "sp")) is None
    # a request that comes later is refused the same way, at once
    later = env.commands.submit(kind, {"dir": str(tmp_path / "sp")}, True, "running")
    env.commands.serve()
    with pytest.raises(LockgateError, match="is finishing: its input ended and its final "
                                            r"checkpoint completed \(all its output is "
                                            r"committed\), so .* the job ends finished"):
        later.result(0)
    assert len(env.sent) == sent  # no barrier after Finish


@pytest.mark.parametrize("kind", [CommandKind.STOP, CommandKind.SAVEPOINT, CommandKind.RESCALE])
def test_a_request_after_the_input_ended_is_refused_before_the_final_checkpoint(env, tmp_path,
                                                                               kind):
    """Every source read to its end, a downstream task has not ended its
    input yet (the final checkpoint is not triggered): the job is finishing.
    The request is refused at once and starts nothing (a stop's savepoint
    would hold a job with nothing left to read, and end it stopped); the
    final checkpoint follows when the last task ends its input."""
    env.coordinator.on_end_of_data(0)  # the source task
    future = env.commands.submit(kind, {"dir": str(tmp_path / "sp"), "graph": None,
                                        "requested": time.time()}, True, "running")
    env.commands.serve()
    with pytest.raises(LockgateError, match="is finishing: its input ended and its final "
                                            "checkpoint follows"):
        future.result(0)
    assert env.sent == [] and env.commands.busy() is None
    env.coordinator.on_end_of_data(1)
    assert env.sent == [(0, TriggerCheckpoint(1, "final"))]


@pytest.mark.parametrize("kind", [CommandKind.STOP, CommandKind.RESCALE])
def test_a_stop_in_flight_when_the_input_ends_is_aborted_and_the_job_finishes(env, tmp_path,
                                                                               kind):
    """The stop's barrier was sent, and the source read to its end before it
    took it (its end comes before its acknowledgement): the stop's savepoint
    is aborted (the tasks holding still go on), the request is refused
    saying the job finishes, and the final checkpoint follows."""
    future = env.commands.submit(kind, {"dir": str(tmp_path / "sp"), "graph": None,
                                        "requested": time.time()}, True, "running")
    env.commands.serve()
    barrier = "stop" if kind == CommandKind.STOP else "rescale"
    assert env.sent == [(0, TriggerCheckpoint(1, barrier))]
    env.coordinator.on_end_of_data(0)
    assert env.sent[1:] == [(0, NotifyAborted(1)), (1, NotifyAborted(1))]
    env.commands.serve()
    with pytest.raises(LockgateError, match="is finishing: its input ended and its final "
                                            "checkpoint follows"):
        future.result(0)
    assert env.commands.busy() is None and env.commands.rescaled() is None
    env.coordinator.on_end_of_data(1)
    assert env.sent[-1] == (0, TriggerCheckpoint(2, "final"))
    env.ack_all(2)
    assert env.coordinator.finished and env.coordinator.savepoint_results.get(2) is None
