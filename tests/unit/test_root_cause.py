"""Which failure an attempt reports when one task's error breaks its peers'
channels: the reports come through separate connections, in any order.
``root_cause`` is a pure function of the events that follow."""

from __future__ import annotations

import queue
from collections.abc import Iterator

from lockgate.cluster.events import TaskDisconnected, TaskEvent, TaskExited, TaskMessage
from lockgate.cluster.failures import AttemptFailed, restart_delay, root_cause, streak
from lockgate.cluster.jobmaster import _EventWindow
from lockgate.config import FailureHistory, FixedDelayRestart
from lockgate.protocol import Failed

SOURCE, DOWN_0, DOWN_1 = 1, 2, 3  # parallelism 2: tasks 0-1 read, 2-3 process


def history(reasons: list[str]) -> FailureHistory:
    """``reasons`` one second apart, each after a short run."""
    return FailureHistory(tuple(float(t) for t in range(len(reasons))), (0.5,) * len(reasons),
                          tuple(reasons))

def name(task: int) -> str:
    return f"t{task}"


def failed(task: int, error_type: str, error: str) -> TaskMessage:
    return TaskMessage(0, task, Failed(f"{error_type}: {error}", error_type, None, ""))


def broken_channel(task: int) -> AttemptFailed:
    return AttemptFailed(f"task {task} failed: ConnectionError: input channel from task "
                         f"{SOURCE} broke", task, "ConnectionError")


def test_a_peer_that_reported_a_broken_channel_is_no_silent_death() -> None:
    """The order seen in CI: both downstream tasks report the broken channel
    and disconnect before the source's own report arrives. The second one's
    disconnection is not a death without a report: the source's error is the cause."""
    events = [failed(DOWN_1, "ConnectionError", "input channel from task 1 broke"),
              TaskDisconnected(0, DOWN_1),
              failed(SOURCE, "UserFunctionError", "the key selector broke"),
              TaskDisconnected(0, SOURCE)]
    cause = root_cause(broken_channel(DOWN_0), events, set(), name)
    assert (cause.task, cause.error_type) == (SOURCE, "UserFunctionError"), cause.reason
    assert "the key selector broke" in cause.reason
    assert cause.report is not None and cause.reported


def test_a_peer_that_disconnects_without_a_report_died() -> None:
    """A task gone without saying why (SIGKILL) is the cause."""
    cause = root_cause(broken_channel(DOWN_0), [TaskDisconnected(0, SOURCE)], set(), name)
    assert cause.task == SOURCE and "lost its connection" in cause.reason


def test_a_silent_death_is_named_by_its_exit_when_that_follows() -> None:
    """The killed task's disconnection reaches the driver before its exit:
    the exit's signal names the death, not the lost connection."""
    lost = AttemptFailed("task t1 lost its connection to the coordinator", SOURCE)
    lost.exit_pending = True
    events = iter([failed(DOWN_0, "ConnectionError", "input channel from task 1 broke"),
                   TaskExited(0, SOURCE, -9), TaskDisconnected(0, DOWN_0)])
    cause = root_cause(lost, events, set(), name)
    assert cause.reason == "task t1 was killed by SIGKILL" and cause.task == SOURCE
    assert next(events, None) is not None  # nothing waited for after the exit
    # no exit comes (or one without a code): the lost connection stands
    assert root_cause(lost, [TaskDisconnected(0, DOWN_0)], set(), name) is lost
    assert root_cause(lost, [TaskExited(0, SOURCE, None)], set(), name) is lost
    # seen by a peer first: the same
    cause = root_cause(broken_channel(DOWN_0),
                       [TaskDisconnected(0, SOURCE), TaskExited(0, SOURCE, -9)], set(), name)
    assert cause.task == SOURCE and cause.reason.startswith("task t1 was killed by SIGKILL (and ")


def test_a_silent_death_found_late_gets_time_for_its_exit() -> None:
    """A broken channel is reported first and the killed task's disconnection
    comes late in the wait: the wait is extended for its exit (the events
    stop where a deadline that was not extended would have ended them)."""
    extended: list[bool] = []

    def events() -> Iterator[TaskEvent]:
        yield TaskDisconnected(0, SOURCE)
        if extended:
            yield TaskExited(0, SOURCE, -9)

    cause = root_cause(broken_channel(DOWN_0), events(), set(), name,
                       lambda: extended.append(True))
    assert cause.task == SOURCE and "was killed by SIGKILL (and" in cause.reason, cause.reason
    extended.clear()
    cause = root_cause(broken_channel(DOWN_0), events(), set(), name)
    assert "lost its connection" in cause.reason, cause.reason


def test_a_killed_tasks_exit_seen_before_the_broken_channel_names_the_cause() -> None:
    """The killed task's exit overtook its peer's report (the job master kept
    it, waiting for the disconnection): the cause is the kill, though no
    exit follows among the events."""
    events = [TaskDisconnected(0, SOURCE), TaskDisconnected(0, DOWN_0)]
    cause = root_cause(broken_channel(DOWN_0), events, set(), name, exits={SOURCE: -9})
    assert cause.task == SOURCE and "was killed by SIGKILL (and" in cause.reason, cause.reason
    # an exit by the task's own failure (its report may still be on its way) is no kill
    cause = root_cause(broken_channel(DOWN_0), [], set(), name, exits={SOURCE: 1, DOWN_1: None})
    assert cause.task == DOWN_0, cause.reason


def test_the_job_masters_event_window_ends_at_its_deadline_unless_extended() -> None:
    events: queue.Queue[TaskEvent] = queue.Queue()
    events.put(TaskExited(1, SOURCE, -9))  # another attempt's: never shown
    events.put(TaskExited(0, SOURCE, -9))
    window = _EventWindow(events, 0, 0.0)
    assert list(window) == []
    window.extend(5.0)
    assert next(iter(window)) == TaskExited(0, SOURCE, -9)


def test_a_finished_task_that_disconnects_did_not_die() -> None:
    failure = broken_channel(DOWN_0)
    assert root_cause(failure, [TaskDisconnected(0, SOURCE)], {SOURCE}, name) is failure


def test_a_failure_that_is_no_broken_channel_is_its_own_cause() -> None:
    failure = AttemptFailed("task 1 failed: ValueError: x", 1, "ValueError", reported=True)
    events = iter([TaskDisconnected(0, SOURCE)])
    assert root_cause(failure, events, set(), name) is failure
    assert next(events, None) is not None  # nothing was waited for


def test_the_same_reported_failure_backs_off_doubling_to_a_cap() -> None:
    strategy = FixedDelayRestart(max_attempts=100, delay_s=0.0)
    delays = [restart_delay(strategy, history(["boom"] * n), reported=True) for n in range(1, 8)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert restart_delay(strategy, history(["boom"] * 5), reported=False) == 0.0  # a death: at once
    assert restart_delay(FixedDelayRestart(max_attempts=2, delay_s=0.0), history(["a", "b", "c"]),
                         reported=True) is None


def test_a_reset_connection_is_a_broken_channel_and_the_dead_task_is_named() -> None:
    """A peer that was sending to the killed task reports the reset first;
    the killed task's silent exit is the cause."""
    reset = AttemptFailed("task 1 failed: ConnectionResetError: reset", SOURCE,
                          "ConnectionResetError")
    events = [failed(DOWN_1, "BrokenPipeError", "broken pipe"),
              TaskExited(0, DOWN_0, -9), TaskDisconnected(0, DOWN_0)]
    cause = root_cause(reset, events, set(), name)
    assert cause.task == DOWN_0 and "killed by SIGKILL" in cause.reason, cause.reason


def test_an_exit_seen_before_the_tasks_report_waits_for_it() -> None:
    """The exit event overtook the task's own report: the report is the cause."""
    exited = AttemptFailed("task 1 exited with code 1", SOURCE)
    exited.early_exit = True
    events = [failed(SOURCE, "CheckpointCorruptError", "bad state file"),
              TaskDisconnected(0, SOURCE)]
    cause = root_cause(exited, events, set(), name)
    assert cause.error_type == "CheckpointCorruptError" and cause.fatal, cause.reason
    # without a report before its disconnection, the exit stands (and waits no longer)
    rest = iter([TaskDisconnected(0, SOURCE), failed(DOWN_0, "ValueError", "x")])
    assert root_cause(exited, rest, set(), name) is exited
    assert next(rest, None) is not None


def test_failures_in_turn_without_a_checkpoint_back_off() -> None:
    """Different errors, no checkpoint completed in between: the delay grows;
    a completed checkpoint starts the streak again."""
    strategy = FixedDelayRestart(max_attempts=100, delay_s=0.0)
    reasons = [f"boom {i}" for i in range(6)]
    delays = [restart_delay(strategy, history(reasons[:n]), True, streak([3] * n))
              for n in range(1, 6)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert streak([1, 2, 2, 2]) == 3 and streak([2, 2, 3]) == 1
    assert restart_delay(strategy, history(reasons[:3]), True, streak([1, 2, 3])) == 0.0
