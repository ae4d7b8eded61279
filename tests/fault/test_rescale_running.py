"""Rescale a running job (``JobClient.rescale``) up and down while records
flow, with SIGKILLs of random tasks before, during and after: the job goes on in the
same driver, and its committed output is exact, record by record, on both
launchers. A rescale to a bad parallelism is refused and the job goes on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fault.checks import HERE
from tests.fixtures import check_exact_sums

N = 120_000
KEYS = 5


def run_plan(tmp_path, plan: str, parallelism: int, launcher: str = "local",
             extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, str(HERE / "sums_job.py"), "--n", str(N), "--parallelism",
           str(parallelism), "--keys", str(KEYS), "--out", str(tmp_path / "out"),
           "--storage", str(tmp_path / "chk"), "--interval", "0.2", "--rate", "12000",
           "--launcher", launcher, "--plan", plan, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["plan_error"] is None, (result["plan_error"], done.stderr[-4000:])
    assert result["status"] == "finished"
    check_exact_sums(tmp_path / "out", N, KEYS)
    return result


def rescales(result: dict) -> list[dict]:
    return [s for s in result["plan"] if s["step"].split(":")[-1].isdigit()
            and not s["step"].startswith("bad:")]


def test_rescale_up_and_down_with_kills_local(tmp_path):
    # kills before and after each rescale, and one during a rescale
    result = run_plan(tmp_path, "kill,3,kill,1,kill,killing:2,kill", parallelism=2)
    assert [s["parallelism"] for s in rescales(result)] == [3, 1, 2]
    # the kills; a rescale is no restart (the kill during one may find its tasks ended)
    assert result["restarts"] in (4, 5)
    # the checkpoint history goes on across the rescales
    ids = [c["checkpoint_id"] for c in result["checkpoints"]]
    assert ids == sorted(ids) and len(ids) > 6


def test_rescale_refused_job_unharmed_local(tmp_path):
    # 0 and above max_parallelism (128) are refused, the job goes on; then a real one
    result = run_plan(tmp_path, "bad:0,bad:129,bad:2,3", parallelism=2)
    refused = [s["refused"] for s in result["plan"] if "refused" in s]
    assert "1..max_parallelism (128)" in refused[0] and "1..max_parallelism" in refused[1]
    assert "already runs at that parallelism" in refused[2]
    assert rescales(result)[0]["parallelism"] == 3
    assert result["restarts"] == 0


def test_rescale_up_and_down_with_kills_spark(tmp_path):
    result = run_plan(tmp_path, "kill,3,kill,1", parallelism=2, launcher="spark",
                      extra=("--master", "local[6]"))
    assert [s["parallelism"] for s in rescales(result)] == [3, 1]
    assert result["restarts"] == 2


def test_rescale_beyond_spark_slots_refused(tmp_path):
    # local[4]: 2 x 2 tasks run; 3 x 2 = 6 tasks need 6 slots: refused, the job goes on
    result = run_plan(tmp_path, "bad:3,1", parallelism=2, launcher="spark",
                      extra=("--master", "local[4]"))
    refused = result["plan"][0]["refused"]
    assert "6 task slots" in refused and "goes on at its parallelism" in refused
    assert rescales(result)[0]["parallelism"] == 1


def _on_rocksdb(monkeypatch, tmp_path) -> None:
    pytest.importorskip("rocksdict")
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "rocksdb")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local"))  # the databases' folders
    (tmp_path / "local").mkdir()


def _killed_in_restore(*attempts: int) -> tuple[str, ...]:
    """Every keyed task of these attempts dies in the middle of its RocksDB
    restore: its base handle materialized and clipped to its key groups, the
    other handles' key groups not yet copied in."""
    return ("--faults", json.dumps([{"point": "restore_ranges", "attempt": a, "count": 1}
                                    for a in attempts]))


def test_rescale_from_incremental_checkpoints_with_kills_local(tmp_path, monkeypatch):
    """On RocksDB a rescale's checkpoint is incremental and the next attempt
    restores by key-group ranges: kills before, during and after, and in the
    middle of two rescaled restores (attempts 2 and 5: the rescales to 3 and
    to 1, each after a kill), then the restart restores again."""
    _on_rocksdb(monkeypatch, tmp_path)
    result = run_plan(tmp_path, "kill,3,kill,1,kill,killing:2,kill", parallelism=2,
                      extra=_killed_in_restore(2, 5))
    assert [s["parallelism"] for s in rescales(result)] == [3, 1, 2]
    assert result["restarts"] in (6, 7)  # the kills and the two restores killed
    check_incremental(tmp_path / "chk")


def test_rescale_from_incremental_checkpoints_with_kills_spark(tmp_path, monkeypatch):
    _on_rocksdb(monkeypatch, tmp_path)
    result = run_plan(tmp_path, "kill,3,kill,1", parallelism=2, launcher="spark",
                      extra=("--master", "local[6]", *_killed_in_restore(2)))
    assert [s["parallelism"] for s in rescales(result)] == [3, 1]
    assert result["restarts"] == 3
    check_incremental(tmp_path / "chk")


def check_incremental(storage) -> None:
    """The keyed operator's retained checkpoints are incremental."""
    (job_dir,) = storage.iterdir()
    metas = [json.loads(m.read_text()) for m in job_dir.glob("chk-*/_metadata")]
    assert metas
    for meta in metas:
        assert all(h is not None and "incremental" in h
                   for h in meta["operators"]["sums"]["subtasks"])
