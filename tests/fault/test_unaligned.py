"""Exactly-once with unaligned checkpoints under SIGKILL, on both launchers.

The sink is slowed (``--slow-sink``) so that batches queue up in flight: the
unaligned barriers overtake them and they are stored with the checkpoints
(channel state), then replayed after a kill. Kills come at named protocol
points of the unaligned path (the barrier just sent ahead, the channel state
file half written, the recovered in-flight data being replayed) and at random
moments from outside; the committed output must equal a failure-free run's,
record by record. Longer variants with ``LOCKGATE_SOAK=1``.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.fault.checks import HERE, drive, run_job
from tests.fault.test_windows import check
from tests.fixtures import check_exact_sums

N = 60_000
SOAK = os.environ.get("LOCKGATE_SOAK") == "1"
SKEWED_KEYS = 7
SLOW = ["--unaligned", "--slow-sink", "40000", "--batch-size", "256"]


def _check(tmp_path, result, n=N, keys=2):
    check_exact_sums(tmp_path / "out", n, keys)
    assert result["status"] == "finished"
    assert result["records_in"] == n and result["records_out"] == n, result


def _in_flight_stored(result) -> bool:
    """Some completed checkpoint held in-flight data (channel state)."""
    return any(c["status"] == "completed" and c["in_flight"] > 0
               for c in result["checkpoints"])


def test_unaligned_kills_at_protocol_points(tmp_path, launcher):
    """One kill per attempt at a point of the unaligned path; each later
    attempt restores in-flight data and replays it."""
    keyed = 2  # global number of the first keyed task (sources are 0 and 1)
    faults = [
        {"point": "unaligned_barrier", "task": keyed, "attempt": 0, "count": 3},
        {"point": "channel_state", "task": keyed + 1, "attempt": 1, "count": 2},
        {"point": "replay", "task": keyed, "attempt": 2, "count": 2},
        {"point": "replay", "task": None, "attempt": 3, "count": 1},
    ]
    if SOAK:
        faults += [
            {"point": "channel_state", "task": 0, "attempt": 4, "count": 2},
            {"point": "acked", "task": keyed + 1, "attempt": 5, "count": 2},
        ]
    # 240,000 records through sinks of 2 x 40,000 records/s: at least 3 s of
    # work, while the four kills need a few checkpoints each
    # 7 keys: both keyed tasks get records (with 2, both keys may hash to one)
    result, _ = run_job(tmp_path, n=4 * N, parallelism=2, faults=faults, interval=0.1,
                        keys=7, extra=SLOW, launcher=launcher)
    _check(tmp_path, result, n=4 * N, keys=7)
    assert result["restarts"] >= 3, result["failures"]
    assert _in_flight_stored(result), result["checkpoints"]


@pytest.mark.parametrize("seed", [1] + ([2, 3, 4] if SOAK else []))
def test_unaligned_random_kills(tmp_path, seed, launcher):
    """SIGKILL random tasks at random moments while in-flight data is
    checkpointed and replayed."""
    # sinks of 2 x 40,000 records/s: at least 3 s (24 s soaking) of work,
    # while 3 (12) kills at most 0.7 s apart leave at most 2.1 s (8.4 s) of
    # progress: every planned kill happens
    n = (16 if SOAK else 4) * N
    kills = 12 if SOAK else 3
    result, done = run_job(tmp_path, n=n, parallelism=2, kills=kills, seed=seed,
                           interval=0.15, keys=7, extra=SLOW,
                           kill_delays=(0.2, 0.7), launcher=launcher)
    _check(tmp_path, result, n=n, keys=7)
    assert done == kills, f"only {done} kills happened"
    assert _in_flight_stored(result), result["checkpoints"]


@pytest.mark.parametrize("launcher", ["local"] + (["spark"] if SOAK else []))
def test_unaligned_with_aligned_timeout_is_exact(tmp_path, launcher):
    """Checkpoints that start aligned and turn unaligned after 50 ms, with a
    kill while one's channel state is written (on Spark with LOCKGATE_SOAK=1:
    the CI budget)."""
    faults = [{"point": "channel_state", "task": 2, "attempt": 0, "count": 2}]
    result, _ = run_job(tmp_path, n=2 * N, parallelism=2, faults=faults, interval=0.1, keys=7,
                        extra=["--aligned-timeout", "0.05", *SLOW[1:]], launcher=launcher)
    _check(tmp_path, result, n=2 * N, keys=7)
    assert result["restarts"] == 1, result["failures"]
    assert _in_flight_stored(result), result["checkpoints"]


WINDOWS = ["tumbling", "sliding", "session", "join"]


@pytest.mark.parametrize("launcher,windows", [("local", w) for w in WINDOWS] + [
    ("spark", w) for w in (WINDOWS if SOAK else ["join"])])
def test_unaligned_windows_with_watermarks_in_flight(tmp_path, windows, launcher):
    """Event-time windows (tumbling, sliding, session) and an interval
    join behind a slow function: the source sends a watermark after every
    batch, so the in-flight data the unaligned barriers overtake holds
    watermarks among the batches, and the window (join) tasks snapshot at
    different points (with different watermarks). Under kills, the
    committed windows (late firings included) or pairs, and the late
    records, equal the plain-Python reference record by record: each task
    restores its own watermarks (the join: each input's), so the records
    it judged late before a kill are late after it, and no others."""
    # 36,000 records, 6 of 7 through a window function of 5,000 records/s:
    # at least 6 s of work, while 3 kills at most 0.6 s apart leave 1.8 s of
    # progress: every planned kill happens
    n, p = 36_000, 2
    # 7 keys: 6 go to the first window task, 1 to the second. The first lags
    # behind (a long queue), the second's watermark is ahead of it by a few
    # batches; every 5th record is late by about one batch only
    # (ref.STAMPS): restored with the first task's watermark, the second
    # would admit the ones it judged late, in the first batch it reads (a
    # whole one: no rate limit, so at least one of key 6)
    stamps = "near-late"
    cmd = [sys.executable, str(HERE / "windows_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(SKEWED_KEYS), "--out", str(tmp_path / "out"),
           "--late", str(tmp_path / "late"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.1",
           "--unaligned", "--slow", "0.0002", "--windows", windows, "--stamps", stamps,
           "--launcher", launcher]
    tasks = 1 + 3 * p + (windows == "join")  # the join's right input: a map task
    result, kills = drive(cmd, kills=3, tasks=tasks, seed=5, kill_delays=(0.3, 0.6),
                          timeout=240)
    assert result["status"] == "finished"
    assert kills == 3, result["failures"]
    assert _in_flight_stored(result), result["checkpoints"]
    check(tmp_path, n, windows, SKEWED_KEYS, stamps)


def test_unaligned_job_rescales_through_an_aligned_savepoint(tmp_path):
    """An unaligned job under backpressure, stopped with a savepoint at
    parallelism 2: the savepoint holds no in-flight data (savepoints stay
    aligned) and resumes at parallelism 3; the periodic unaligned checkpoints
    with in-flight data would be refused there. Exact output."""
    from lockgate.checkpoint import storage
    from lockgate.checkpoint.restore import check_channel_state
    from lockgate.errors import LockgateError
    from tests.fault.sums_job import build
    from tests.fixtures import start_and_await

    n = N

    def job(parallelism: int, held: bool = False):
        # held: the first job's input cannot end before its stop, however
        # slow the machine; the second reads the rest with the plain source
        return build(n, parallelism, 2, str(tmp_path / "out"), str(tmp_path / "chk"), 0.1,
                     rate=30_000, unaligned=True, slow_sink=20_000, batch_size=256, held=held)

    client = start_and_await(job(2, held=True), launcher="local",
                             until=lambda pr: pr.records_read > n // 3)
    first = client.stop(str(tmp_path / "sp"))
    assert first.status == "stopped" and first.savepoint, first
    assert any(c.in_flight for c in first.completed_checkpoints), "no in-flight data stored"
    meta = storage.read_metadata(first.savepoint)
    assert not any(op.has_channel_state for op in meta.operators.values())
    retained = [storage.read_metadata(str(d)) for d in sorted((tmp_path / "chk").glob("*/chk-*"))
                if (d / "_metadata").exists()]
    for chk in retained:  # those with in-flight data: refused at parallelism 3
        if any(op.has_channel_state for op in chk.operators.values()):
            with pytest.raises(LockgateError, match="savepoint"):
                check_channel_state(chk, {uid: 3 for uid in chk.operators}, "checkpoint")
    second = job(3).run(launcher="local", from_savepoint=first.savepoint)
    assert second.status == "finished"
    check_exact_sums(tmp_path / "out", n, 2)
