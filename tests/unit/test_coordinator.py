"""The checkpoint coordinator driven by events and a fake clock (no processes,
no sleeps): triggering, completion, timeouts, declines, the final checkpoint."""

from __future__ import annotations

import json
import logging

import pytest

from lockgate.checkpoint import storage
from lockgate.checkpoint.metadata import Progress
from lockgate.cluster.coordinator import (
    AttemptPlan,
    CheckpointCoordinator,
    CheckpointFailureError,
)
from lockgate.config import CheckpointConfig
from lockgate.protocol import Finish, NotifyAborted, NotifyComplete, TriggerCheckpoint

TASK_OPERATORS = {0: (0, 0, ["src"]), 1: (1, 0, ["sum"]), 2: (1, 1, ["sum"])}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(tmp_path):
    clock = Clock()
    sent: list[tuple[int, int, dict]] = []
    config = CheckpointConfig(interval=1.0, storage=str(tmp_path), timeout=5.0, retained=2,
                              tolerable_failed_checkpoints=1)
    c = CheckpointCoordinator("job", tmp_path / "job", config, {"src": 1, "sum": 2},
                              {"src": "split", "sum": "split"}, 128,
                              lambda a, t, m: sent.append((a, t, m)), clock)
    c.start_attempt(AttemptPlan(0, [0], [0, 1, 2], TASK_OPERATORS))
    return c, clock, sent


def ack_all(c, n, tasks=(0, 1, 2)):
    for t in tasks:
        c.on_ack(t, n, {"src" if t == 0 else "sum": None}, (10 * t, t))


def test_next_trigger_in_counts_down_to_the_tick_that_triggers(env):
    c, clock, sent = env
    assert c.next_trigger_in() == pytest.approx(1.0)
    clock.now += 0.75
    assert c.next_trigger_in() == pytest.approx(0.25)
    clock.now += 0.25
    assert c.next_trigger_in() == 0.0
    c.tick()
    assert [m for _, _, m in sent] == [TriggerCheckpoint(1)]
    assert c.next_trigger_in() is None  # one checkpoint at a time: none is due
    ack_all(c, 1)
    assert c.next_trigger_in() == pytest.approx(1.0)  # an interval after the trigger
    clock.now += 5.0
    assert c.next_trigger_in() == 0.0


def test_triggers_on_interval_and_completes_on_last_ack(env, tmp_path):
    c, clock, sent = env
    c.tick()
    assert sent == []
    clock.now += 1.0
    c.tick()
    assert sent == [(0, 0, TriggerCheckpoint(1))]
    c.tick()  # one checkpoint at a time
    assert len(sent) == 1
    c.on_ack(0, 1, {"src": None})
    c.on_ack(1, 1, {"sum": None})
    assert not (tmp_path / "job" / "chk-1" / "_metadata").exists()
    c.on_ack(2, 1, {"sum": None})
    meta = json.loads((tmp_path / "job" / "chk-1" / "_metadata").read_text())
    assert meta["checkpoint_id"] == 1
    assert [m for _, _, m in sent[1:]] == [NotifyComplete(1)] * 3
    assert c.history[-1].status == "completed"


def test_the_history_records_how_long_writing_metadata_took(env, monkeypatch):
    c, clock, sent = env
    write = storage.write_metadata

    def slow_write(chk, metadata):  # the write itself, taking 0.25 s of the clock
        write(chk, metadata)
        clock.now += 0.25

    monkeypatch.setattr(storage, "write_metadata", slow_write)
    clock.now += 1.0
    c.tick()
    ack_all(c, 1)
    assert c.history[-1].status == "completed"
    assert c.history[-1].metadata_duration == pytest.approx(0.25)


def test_retention_deletes_old_checkpoints(env, tmp_path):
    c, clock, sent = env
    for n in range(1, 5):
        clock.now += 1.0
        c.tick()
        ack_all(c, n)
    assert storage.completed_checkpoints(tmp_path / "job") == [3, 4]
    assert [x.checkpoint_id for x in c.completed] == [3, 4]


def test_timeout_aborts_and_too_many_failures_fail_the_job(env, caplog):
    c, clock, sent = env
    clock.now += 1.0
    c.tick()
    clock.now += 5.1
    with caplog.at_level(logging.WARNING, logger="lockgate.checkpoint"):
        c.tick()
    # visible at the default level, with the reason and how near the job is to failing
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint 1 failed (1 in a row, 1 tolerated): expired before every task acknowledged"]
    assert NotifyAborted(1) in [m for _, _, m in sent]
    assert c.history[-1].status == "failed" and "expired" in c.history[-1].failure
    clock.now += 1.0
    c.tick()  # checkpoint 2
    with pytest.raises(CheckpointFailureError, match="2 checkpoints failed in a row"):
        c.on_decline(1, 2, "disk full")


def test_late_and_duplicate_acks_are_ignored(env):
    c, clock, sent = env
    clock.now += 1.0
    c.tick()
    c.on_decline(2, 1, "busy")
    assert c.on_ack(0, 1, {"src": None}).name == "DISCARDED"
    clock.now += 1.0
    c.tick()
    assert c.on_ack(0, 2, {"src": None}).name == "SUCCESS"
    assert c.on_ack(0, 2, {"src": None}).name == "DUPLICATE"
    assert c.on_ack(7, 2, {}).name == "UNKNOWN"


def test_final_checkpoint_after_every_task_reached_end_of_data(env):
    c, clock, sent = env
    clock.now += 1.0
    c.tick()  # a periodic checkpoint is in flight
    for t in (0, 1, 2):
        c.on_end_of_data(t)
    assert sent[-1] == (0, 0, TriggerCheckpoint(1))  # final waits for it
    ack_all(c, 1)
    c.tick()
    assert sent[-1] == (0, 0, TriggerCheckpoint(2, "final"))  # always aligned
    assert c.pending is not None and c.pending.is_final
    ack_all(c, 2)
    assert c.finished
    assert [m for _, _, m in sent[-3:]] == [Finish()] * 3


def test_attempt_after_a_completed_final_checkpoint_takes_its_own(env):
    """A task died after the final checkpoint completed, before the job ended:
    the next attempt (restored from that checkpoint) is not finished until its
    own final checkpoint completes; without one its tasks would wait forever."""
    c, clock, sent = env
    for t in (0, 1, 2):
        c.on_end_of_data(t)
    ack_all(c, 1)
    assert c.finished
    c.on_attempt_failed()
    c.start_attempt(AttemptPlan(1, [0], [0, 1, 2], TASK_OPERATORS))
    assert not c.finished
    for t in (0, 1, 2):
        c.on_end_of_data(t)
    assert sent[-1] == (1, 0, TriggerCheckpoint(2, "final"))
    assert c.pending is not None and c.pending.is_final
    ack_all(c, 2)
    assert c.finished
    assert [m for a, _, m in sent[-3:] if a == 1] == [Finish()] * 3


def test_progress_adds_the_restored_baseline(env, tmp_path):
    c, clock, sent = env
    clock.now += 1.0
    c.tick()
    ack_all(c, 1)  # read 0+10+20, written 0+1+2
    assert c.latest.metadata.progress == Progress(read=30, written=3)
    c.on_attempt_failed()
    c.start_attempt(AttemptPlan(1, [0], [0, 1, 2], TASK_OPERATORS))
    clock.now += 1.0
    c.tick()
    ack_all(c, 2)
    assert c.latest.metadata.progress == Progress(read=60, written=6)


def test_history_keeps_only_the_newest_records(tmp_path):
    clock = Clock()
    config = CheckpointConfig(interval=1.0, storage=str(tmp_path), history_size=3)
    c = CheckpointCoordinator("job", tmp_path / "job", config, {"src": 1, "sum": 2},
                              {"src": "split", "sum": "split"}, 128, lambda a, t, m: None, clock)
    c.start_attempt(AttemptPlan(0, [0], [0, 1, 2], TASK_OPERATORS))
    for n in range(1, 6):
        clock.now += 1.0
        c.tick()
        ack_all(c, n)
    assert [r.checkpoint_id for r in c.history] == [3, 4, 5]
    assert c.completed_count == 5


def test_failed_savepoints_do_not_count_towards_failing_the_job(env, tmp_path):
    """As Flink's CheckpointFailureManager: a savepoint that expires or is
    declined fails its request, never the job; periodic checkpoints count."""
    c, clock, sent = env
    for _ in range(3):  # tolerable_failed_checkpoints is 1
        n = c.trigger(savepoint_dir=str(tmp_path / "sp"))
        assert n is not None
        c.on_decline(1, n, "busy")
        assert isinstance(c.savepoint_results[n], Exception)
    assert c.consecutive_failures == 0
    clock.now += 1.0
    c.tick()
    clock.now += 5.1
    c.tick()  # checkpoint expired: 1 in a row, tolerated
    clock.now += 1.0
    c.tick()
    with pytest.raises(CheckpointFailureError, match="2 checkpoints failed in a row"):
        c.on_decline(1, c.pending.checkpoint_id, "disk full")


def test_metadata_that_cannot_be_written_declines_the_checkpoint_and_the_job_goes_on(
        env, tmp_path):
    """A real write failure (a file where the checkpoint's folder must go):
    the checkpoint fails and is counted, the tasks are told, the driver does
    not crash, and the next checkpoint completes."""
    c, clock, sent = env
    (tmp_path / "job").mkdir(exist_ok=True)
    (tmp_path / "job" / "chk-1").write_text("in the way")
    clock.now += 1.0
    c.tick()
    ack_all(c, 1)
    record = c.history[-1]
    assert record.status == "failed" and "_metadata could not be written" in record.failure
    assert NotifyAborted(1) in [m for _, _, m in sent]
    assert c.consecutive_failures == 1 and c.latest is None
    clock.now += 1.0
    c.tick()
    ack_all(c, 2)
    assert c.history[-1].status == "completed" and c.consecutive_failures == 0


@pytest.mark.parametrize(("end", "failure"), [("on_attempt_failed", "a task failed"),
                                              ("on_attempt_ended", "its attempt ended")])
def test_a_checkpoint_in_flight_when_its_attempt_ends_says_why(env, end, failure):
    """A cancel ends the attempt with a checkpoint in flight: its record says
    the attempt ended, not that a task failed; neither counts towards failing
    the job, and the tasks (gone) are told nothing."""
    c, clock, sent = env
    clock.now += 1.0
    c.tick()
    getattr(c, end)()
    assert c.pending is None and c.plan is None
    record = c.history[-1]
    assert record.status == "failed" and record.failure.startswith(failure)
    assert c.consecutive_failures == 0 and c.failed_count == 1
    assert not any(isinstance(m, NotifyAborted) for _, _, m in sent)


def test_background_cleanup_keeps_deletion_off_the_next_checkpoints_path(tmp_path, monkeypatch):
    """With ``background_cleanup`` a stalled deletion holds up neither the
    notification of the checkpoint that superseded it nor the next trigger;
    ``close`` waits for it, and the folder is as retention wants it."""
    import threading

    clock = Clock()
    sent: list[tuple[int, int, object]] = []
    config = CheckpointConfig(interval=1.0, storage=str(tmp_path), timeout=5.0, retained=1)
    c = CheckpointCoordinator("job", tmp_path / "job", config, {"src": 1, "sum": 2},
                              {"src": "split", "sum": "split"}, 128,
                              lambda a, t, m: sent.append((a, t, m)), clock,
                              background_cleanup=True)
    c.start_attempt(AttemptPlan(0, [0], [0, 1, 2], TASK_OPERATORS))
    release, deleting = threading.Event(), threading.Event()
    discard = storage.discard

    def stalled(chk):
        deleting.set()
        assert release.wait(10)
        discard(chk)

    monkeypatch.setattr(storage, "discard", stalled)
    for n in (1, 2, 3):
        clock.now += 1.0
        c.tick()
        ack_all(c, n)
    assert deleting.wait(10)  # chk-1's deletion is stalled...
    assert [m for _, _, m in sent if isinstance(m, TriggerCheckpoint)] == [
        TriggerCheckpoint(n) for n in (1, 2, 3)]  # ...yet checkpoints 2 and 3 went on
    assert sent[-1][2] == NotifyComplete(3)
    assert (tmp_path / "job" / "chk-1").exists()
    release.set()
    c.close()
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["chk-3"]
