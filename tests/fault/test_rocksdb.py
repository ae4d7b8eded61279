"""The fault-injection suite on the RocksDB state backend, with incremental
checkpoints: random SIGKILLs on both launchers, a rescale chain through
retained incremental checkpoints (the driver SIGKILLed each time; the last
hop onto the heap backend), windows and timers through savepoints across
backends, and retention: after the job, the shared folder holds exactly the
files the retained checkpoints name.

The jobs are the suite's own (``sums_job.py``, ``windows_job.py``); the
backend comes from ``LOCKGATE_STATE_BACKEND`` (read by each driver).
``LOCKGATE_SOAK=1``: targeted kills at every protocol point, windows under
random kills on both launchers, more kills.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.fault.checks import HERE, drive, run_job, task_pids
from tests.fault.test_rescale import start, wait_for_exit
from tests.fault.test_windows import KEYS, check
from tests.fault.windows_job import build
from tests.fixtures import check_exact_sums, start_and_await

pytest.importorskip("rocksdict")

SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
N = 60_000


@pytest.fixture
def rocksdb(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "rocksdb")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local"))  # the databases' folders
    (tmp_path / "local").mkdir()


def retained_metadata(job_dir: Path) -> list[dict]:
    return [json.loads(m.read_text()) for m in sorted(job_dir.glob("chk-*/_metadata"))]


def check_incremental_and_retention(storage: Path) -> None:
    """The keyed operator's checkpoints are incremental, and the shared
    folder holds exactly the files of the retained checkpoints."""
    (job_dir,) = storage.iterdir()
    metas = retained_metadata(job_dir)
    assert metas
    referenced = set()
    for meta in metas:
        for h in meta["operators"]["sums"]["subtasks"]:
            assert h is not None and "incremental" in h, h
            referenced |= {ref[0] for ref in h["incremental"]["shared"].values()}
            referenced |= {ref[0] for ref in h["incremental"].get("changelog", [])}
    assert referenced
    assert set(os.listdir(job_dir / "shared")) == referenced


def test_random_kills_on_rocksdb(tmp_path, launcher, rocksdb):
    """SIGKILL random tasks at random moments; exact output, and no shared
    file left that no retained checkpoint names."""
    kills = 6 if SOAK else 4
    result, done = run_job(tmp_path, n=4 * N, parallelism=2, kills=kills, seed=5,
                           interval=0.1, keys=500, extra=["--rate", "50000"],
                           kill_delays=(0.1, 0.6), launcher=launcher)
    check_exact_sums(tmp_path / "out", 4 * N, 500)
    assert result["status"] == "finished" and result["records_out"] == 4 * N, result
    assert done == kills and result["restarts"] >= kills - 1, result["failures"]
    check_incremental_and_retention(tmp_path / "chk")


def test_random_kills_across_early_flushes(tmp_path, rocksdb):
    """Many keys and a checkpoint every 0.5 s: the memtable between two
    checkpoints is large enough for the early flush (state/rocksdb/flush.py)
    to cut it in two SST files, so kills land before, between and after
    early flushes and barriers; the output stays exact."""
    keys, n = 100_000, 6 * N
    result, done = run_job(tmp_path, n=n, parallelism=2, kills=3, seed=11,
                           interval=0.5, keys=keys, extra=["--rate", "60000"],
                           kill_delays=(0.4, 1.5))
    check_exact_sums(tmp_path / "out", n, keys)
    assert result["status"] == "finished" and result["records_out"] == n, result
    assert done == 3, result["failures"]
    check_incremental_and_retention(tmp_path / "chk")
    # That early flushes happen, and split a checkpoint's writes without losing
    # or adding any, is tests/unit/test_rocksdb_early_flush.py's: counting the
    # files of the retained checkpoints here depended on where the barriers
    # fell against the early flushes (and compaction output adds files too).


def test_many_checkpoints_keep_exactly_the_retained_files(tmp_path, rocksdb):
    """Retention 3 over many incremental checkpoints: exactly 3 checkpoints
    and the files they name stay."""
    result, _ = run_job(tmp_path, n=2 * N, parallelism=2, interval=0.05, keys=20_000,
                        extra=["--rate", "40000"])
    completed = [c for c in result["checkpoints"] if c["status"] == "completed"]
    assert len(completed) >= 8, result["checkpoints"]
    (job_dir,) = (tmp_path / "chk").iterdir()
    assert len(list(job_dir.glob("chk-*"))) == 3
    check_incremental_and_retention(tmp_path / "chk")
    check_exact_sums(tmp_path / "out", 2 * N, 20_000)


def _run_until_checkpoints(tmp_path: Path, name: str, parallelism: int, *extra: str) -> Path:
    """Start the sums job, SIGKILL its driver once it completed 3
    checkpoints, and return its latest completed checkpoint."""
    proc = start(tmp_path, name, parallelism, *extra)
    assert proc.stdout is not None
    done = False
    for line in proc.stdout:
        msg = json.loads(line)
        if "progress" in msg and msg["progress"]["checkpoints_completed"] >= 3:
            done = True
            break
    assert done, proc.stderr.read() if proc.stderr else ""
    tasks = task_pids(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_exit(tasks)
    job_dir = next((tmp_path / name).iterdir())
    chk = sorted(job_dir.glob("chk-*/_metadata"), key=lambda p: int(p.parent.name[4:]))[-1]
    return chk.parent


def test_rescale_chain_through_retained_incremental_checkpoints(tmp_path, rocksdb,
                                                                monkeypatch):
    """2 tasks on RocksDB -> driver killed -> 3 tasks from its incremental
    checkpoint -> driver killed -> 1 task on the heap backend from that one;
    the committed output of the three runs together is exact."""
    a = _run_until_checkpoints(tmp_path, "chk-a", 2, "--rate", "15000")
    b = _run_until_checkpoints(tmp_path, "chk-b", 3, "--rate", "15000",
                               "--from-checkpoint", str(a))
    meta = json.loads((b / "_metadata").read_text())
    assert all(h["incremental"]["key_groups"][1] > 0 for h in meta["operators"]["sums"]
               ["subtasks"])
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "heap")
    c = start(tmp_path, "chk-c", 1, "--from-checkpoint", str(b))
    out, err = c.communicate(timeout=180)
    assert c.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["restarts"] == 0
    check_exact_sums(tmp_path / "out", N, 5)


def test_windows_through_savepoints_across_backends(tmp_path, monkeypatch):
    """Windows, their timers and the watermark: heap at 2 tasks -> savepoint
    -> RocksDB at 3 -> savepoint -> heap at 1: exact."""
    n = 24_000

    def job(parallelism: int, backend: str):
        monkeypatch.setenv("LOCKGATE_STATE_BACKEND", backend)
        return build(n, parallelism, KEYS, str(tmp_path / "out"), str(tmp_path / "late"),
                     str(tmp_path / "chk"), interval=0.2, rate=8000)

    first = start_and_await(job(2, "heap"), launcher="local",
                            until=lambda pr: pr.records_read > n // 4).stop(str(tmp_path / "sp"))
    assert first.status == "stopped" and first.savepoint
    second = start_and_await(job(3, "rocksdb"), launcher="local",
                             until=lambda pr: pr.records_read > n // 2,
                             from_savepoint=first.savepoint).stop(str(tmp_path / "sp"))
    assert second.status == "stopped" and second.savepoint
    sp = json.loads((Path(second.savepoint) / "_metadata").read_text())
    assert not any("incremental" in h for op in sp["operators"].values()
                   for h in op["subtasks"] if h)  # savepoints are canonical
    third = job(1, "heap").run(launcher="local", from_savepoint=second.savepoint)
    assert third.status == "finished"
    check(tmp_path, n)


@pytest.mark.skipif(not SOAK, reason="LOCKGATE_SOAK=1: the full matrix")
def test_windows_under_random_kills_on_rocksdb(tmp_path, launcher, rocksdb):
    n, p = 24_000, 2
    cmd = [sys.executable, str(HERE / "windows_job.py"), "--n", str(n), "--parallelism", str(p),
           "--keys", str(KEYS), "--out", str(tmp_path / "out"), "--late", str(tmp_path / "late"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "6000",
           "--launcher", launcher]
    result, kills = drive(cmd, kills=3, tasks=1 + 3 * p, seed=13, kill_delays=(0.3, 1.0),
                          timeout=300)
    assert result["status"] == "finished"
    assert kills == 3 and result["restarts"] >= kills - 1, result["failures"]
    check(tmp_path, n)


@pytest.mark.skipif(not SOAK, reason="LOCKGATE_SOAK=1: the full matrix")
@pytest.mark.parametrize("parallelism", [2, 3])
def test_targeted_kills_on_rocksdb(tmp_path, parallelism, launcher, rocksdb):
    p = parallelism
    keyed = p
    faults = [
        {"point": "batch", "task": 0, "attempt": 0, "count": 20},
        {"point": "alignment", "task": keyed, "attempt": 1, "count": 3},
        {"point": "snapshot", "task": keyed, "attempt": 2, "count": 2},
        {"point": "acked", "task": keyed + 1, "attempt": 3, "count": 1},
        {"point": "commit", "task": keyed, "attempt": 4, "count": 2},
        {"point": "end_of_data", "task": keyed + p - 1, "attempt": 5, "count": 1},
        {"point": "final_snapshot", "task": keyed, "attempt": 6, "count": 1},
    ]
    result, _ = run_job(tmp_path, n=N, parallelism=p, faults=faults, interval=0.1, keys=50,
                        extra=["--rate", "40000"], launcher=launcher)
    check_exact_sums(tmp_path / "out", N, 50)
    assert result["restarts"] == len(faults), result["failures"]
    check_incremental_and_retention(tmp_path / "chk")


def test_joins_broadcast_and_windows_on_rocksdb_under_random_kills(tmp_path, rocksdb):
    """The several-inputs pipeline of ``tests/fault/test_multi_input.py``
    (broadcast state, a side output, windows, an interval join: two-input
    keyed operators) with its keyed state in RocksDB, under random kills."""
    from tests.fault.test_multi_input import check as check_enrichment

    n, p, kills = (60_000, 2, 8) if SOAK else (20_000, 2, 3)
    cmd = [sys.executable, str(HERE / "enrich_job.py"), "--n", str(n), "--parallelism", str(p),
           "--out", str(tmp_path / "out"), "--rejected", str(tmp_path / "rejected"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "5000",
           "--launcher", "local"]
    result, done = drive(cmd, kills=kills, tasks=3 + 3 * p, seed=29, kill_delays=(0.3, 1.0),
                         timeout=600 if SOAK else 300)
    assert result["status"] == "finished"
    assert done == kills and result["restarts"] >= kills - 1, result["failures"]
    check_enrichment(tmp_path, n)
    # the two-input operators' keyed state was in RocksDB too
    (job_dir,) = (tmp_path / "chk").iterdir()
    (meta, *_) = reversed(retained_metadata(job_dir))
    for uid in ("enrich", "share"):
        assert any(h and "incremental" in h for h in meta["operators"][uid]["subtasks"]), uid


def test_kills_at_the_changelogs_protocol_points(tmp_path, launcher, rocksdb):
    """SIGKILLs where the RocksDB changelog is most fragile: just after a
    materialization between records (its files not uploaded yet), and just
    after a changelog file was uploaded (its checkpoint not acknowledged);
    the next attempts restore chains of changelog files. Exact output, and
    exactly the retained files in shared/."""
    p, keyed = 2, 2
    faults = [
        {"point": "materialize", "task": keyed, "attempt": 0, "count": 2},
        {"point": "changelog", "task": keyed + 1, "attempt": 1, "count": 2},
        {"point": "changelog", "task": keyed, "attempt": 2, "count": 4},
        {"point": "materialize", "task": keyed + 1, "attempt": 3, "count": 1},
    ]
    result, _ = run_job(tmp_path, n=3 * N, parallelism=p, faults=faults, interval=0.1,
                        keys=2_000, extra=["--rate", "30000"], launcher=launcher)
    check_exact_sums(tmp_path / "out", 3 * N, 2_000)
    assert result["restarts"] == len(faults), result["failures"]
    check_incremental_and_retention(tmp_path / "chk")
    changelogs = [len(h["incremental"].get("changelog", []))
                  for meta in retained_metadata(next((tmp_path / "chk").iterdir()))
                  for h in meta["operators"]["sums"]["subtasks"]]
    assert max(changelogs) >= 1, changelogs
