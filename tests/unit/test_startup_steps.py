"""The start-up breakdown (lockgate/cluster/startup.py): driver and task steps
on one timeline, each task step the slowest task's, steps before an attempt
is launched belonging to it, and the steps' trip in Running (validated)."""

from __future__ import annotations

import pytest

from lockgate.cluster.startup import AttemptSteps, StartupLog
from lockgate.protocol import ProtocolError, Running, decode_control, encode_control


def test_a_task_step_is_the_slowest_tasks_and_the_timeline_is_in_time_order() -> None:
    a = AttemptSteps(1, {"launch": 10.0, "registered": 10.5, "running": 10.9},
                     {0: {"entry": 10.1, "connected": 10.2, "restored": 10.6, "running": 10.7},
                      1: {"entry": 10.3, "connected": 10.4, "restored": 10.45,
                          "running": 10.8}})
    assert a.timeline() == [("launch", 10.0), ("task entry", 10.3), ("connected", 10.4),
                            ("registered", 10.5), ("restored", 10.6),
                            ("task running", 10.8), ("running", 10.9)]
    assert [name for name, _ in a.breakdown()] == [name for name, _ in a.timeline()[1:]]
    assert sum(seconds for _, seconds in a.breakdown()) == pytest.approx(0.9)
    assert a.total() == pytest.approx(0.9)
    assert "attempt 1 up in 0.900 s" in a.describe()


def test_steps_before_a_launch_belong_to_the_attempt_launched_next() -> None:
    log = StartupLog()
    log.mark("run", 1.0)
    log.mark("master", 2.0)
    log.begin(0)
    log.mark("submitted", 3.0)
    log.mark("registered", 4.0)
    log.task_running(0, {"entry": 3.5, "running": 4.5}, True, {"submitted": 2.9})
    first = log.current
    assert first is not None and first.attempt == 0
    assert first.driver["run"] == 1.0 and first.driver["submitted"] == 3.0  # the first counts
    log.mark("killed", 5.0)
    log.mark("failed", 5.1)
    log.mark("stopped", 5.2)
    assert "failed" not in first.driver
    log.begin(1)
    second = log.current
    assert second is not None and second is not first
    assert [n for n, _ in second.timeline()][:4] == ["killed", "failed", "stopped", "launch"]
    assert log.attempts == [first, second]


def test_running_carries_the_steps_and_refuses_what_is_not_steps() -> None:
    steps = {"entry": 1_700_000_000.25, "running": 1_700_000_000.5}
    assert decode_control(encode_control(Running(steps))) == Running(steps)
    assert decode_control(encode_control(Running())) == Running()
    for bad in ({"x": float("nan")}, {"x": -1.0}, {"x": True}, {"x" * 33: 1.0},
                {str(i): 1.0 for i in range(17)}):
        with pytest.raises(ProtocolError, match="running: steps"):
            Running(bad)


def test_running_carries_what_local_recovery_did_and_refuses_malformed_reports() -> None:
    reports = [["sums", 7, True, ""], ["windows", 7, False, "000012.sst is missing"]]
    assert decode_control(encode_control(Running({}, reports))) == Running({}, reports)
    for bad in ([["sums", 7, True]], [["sums", -1, True, ""]], [["sums", 7, 1, ""]],
                [[1, 7, True, ""]], [["sums", 7, True, "x" * 1001]], [("sums", 7, True, "")],
                [["s", 1, True, ""]] * 257):
        with pytest.raises(ProtocolError, match="running: local_restores"):
            Running({}, bad)
