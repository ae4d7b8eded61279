"""Exactly-once under SIGKILL: the committed output equals a failure-free run's.

Every kill here is a real SIGKILL of a task process: either from outside at a
random moment (``RandomKiller``), or by the task itself at a named protocol
point (fault injection as data, see ``lockgate.runtime.faults``). Every test
runs on both launchers: on Spark, the killed processes are the tasks that the
Spark Python workers (the job's hosts) fork; one test kills hosts too.
"""

from __future__ import annotations

import os

import pytest

from lockgate.checkpoint import storage
from tests.fault.checks import run_job
from tests.fixtures import check_exact_sums

N = 60_000


def _check(tmp_path, result, n=N, keys=2):
    check_exact_sums(tmp_path / "out", n, keys)
    assert result["status"] == "finished"
    # progress counts survive restarts: restored checkpoint's count + this attempt's
    assert result["records_in"] == n and result["records_out"] == n, result


@pytest.mark.parametrize("parallelism", [2, 3])
def test_targeted_kills_at_protocol_points(tmp_path, parallelism, launcher):
    """One kill per attempt, each at another protocol point."""
    p = parallelism
    keyed = p  # global number of the first keyed task (sources are 0..p-1)
    faults = [
        {"point": "batch", "task": 0, "attempt": 0, "count": 20},
        {"point": "alignment", "task": keyed, "attempt": 1, "count": 3},
        {"point": "snapshot", "task": 1, "attempt": 2, "count": 2},
        {"point": "acked", "task": keyed + 1, "attempt": 3, "count": 1},
        {"point": "commit", "task": keyed, "attempt": 4, "count": 2},
        {"point": "end_of_data", "task": keyed + p - 1, "attempt": 5, "count": 1},
        {"point": "final_snapshot", "task": 0, "attempt": 6, "count": 1},
    ]
    result, _ = run_job(tmp_path, n=N, parallelism=p, faults=faults, interval=0.1,
                        extra=["--rate", "40000"], launcher=launcher)
    _check(tmp_path, result)
    assert result["restarts"] == len(faults), result["failures"]


def test_kills_with_state_inline_in_metadata(tmp_path, launcher):
    """Small state kept in ``_metadata`` (``inline_threshold``): the tasks
    write no state file, so a task's state exists only in its ack until the
    driver writes ``_metadata`` (temp file, fsync, rename, folder fsync: it
    survives a SIGKILL of any process and a power loss once renamed). Kills
    after the snapshot (``snapshot``), between the ack and the completion
    (``acked``) and on the completion notice (``commit``) restore exactly."""
    faults = [
        {"point": "snapshot", "task": 1, "attempt": 0, "count": 2},
        {"point": "acked", "task": 3, "attempt": 1, "count": 1},
        {"point": "commit", "task": 2, "attempt": 2, "count": 2},
    ]
    result, _ = run_job(tmp_path, n=N, parallelism=2, faults=faults, interval=0.1,
                        extra=["--rate", "40000", "--inline-threshold", "65536"],
                        launcher=launcher)
    _check(tmp_path, result)
    assert result["restarts"] == len(faults), result["failures"]
    latest = result["latest_checkpoint"]
    assert os.listdir(latest) == ["_metadata"]  # every state file inline
    handles = [h for _, h in storage.read_metadata(latest).state_files()]
    assert handles and all(h.inline is not None for h in handles)


@pytest.mark.parametrize("parallelism,seed", [(2, 1), (3, 2)])
def test_random_kills(tmp_path, parallelism, seed, launcher):
    """SIGKILL random tasks at random moments, from outside."""
    # 240,000 records at 50,000/s: at least 4.8 s of work, while 6 kills at most
    # 0.6 s apart leave at most 3.6 s of progress: every planned kill happens.
    result, kills = run_job(tmp_path, n=4 * N, parallelism=parallelism, kills=6, seed=seed,
                            interval=0.2, keys=7, extra=["--rate", "50000"],
                            kill_delays=(0.1, 0.6), launcher=launcher)
    _check(tmp_path, result, n=4 * N, keys=7)
    assert kills == 6, f"only {kills} kills happened"
    assert result["restarts"] >= kills - 1


def test_random_kills_of_tasks_and_their_spark_hosts(tmp_path):
    """On Spark, half the kills strike the task's host (the Python worker that
    forked it: its Spark task dies, the stage is replaced), the others the
    task (the next attempt is a fork on the same hosts)."""
    result, kills = run_job(tmp_path, n=4 * N, parallelism=2, kills=6, seed=3,
                            interval=0.2, keys=7, extra=["--rate", "50000"],
                            kill_delays=(0.1, 0.6), launcher="spark", kill_hosts=0.5)
    _check(tmp_path, result, n=4 * N, keys=7)
    assert kills == 6, f"only {kills} kills happened"
    assert 0 < result["host_kills"] < kills, result["host_kills"]
    assert result["restarts"] >= kills - 1


def test_failure_free_run_is_exact(tmp_path, launcher):
    result, _ = run_job(tmp_path, n=N, parallelism=2, launcher=launcher)
    _check(tmp_path, result)
    assert result["restarts"] == 0, result["failures"]
    assert any(c["status"] == "completed" for c in result["checkpoints"])
