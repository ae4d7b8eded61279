"""The RocksDB backend's incremental checkpoints on S3 (a moto server on
loopback): shared files uploaded and downloaded as objects, recovery after
SIGKILLs, a restore at another parallelism, and retention on an object store
(the bucket holds exactly the shared files the retained checkpoints name)."""

from __future__ import annotations

import json

import pytest

from lockgate import NoRestart, fs
from lockgate.checkpoint import storage
from lockgate.errors import JobFailedError
from tests.fault.sums_job import build
from tests.fixtures import check_exact_sums
from tests.integration.test_s3_storage import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("rocksdict")


def test_incremental_checkpoints_on_s3(s3, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", "rocksdb")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    bucket = s3.bucket()
    out, chk = s3.url(bucket, "out"), s3.url(bucket, "chk")
    n = 30_000
    faults = [{"point": "acked", "task": 2, "attempt": 0, "count": 3},
              {"point": "snapshot", "task": 3, "attempt": 1, "count": 2}]
    first = build(n, 2, 50, out, chk, interval=0.1, rate=10_000)
    result = first.run(launcher="local", fault_injection=faults, job_id="first")
    assert result.restarts == 2, result.failures
    check_exact_sums(out, n, 50)
    job_dir = fs.join(chk, "first")
    latest = storage.latest_completed(job_dir)
    assert latest is not None
    referenced = set()
    for n_ in storage.completed_checkpoints(job_dir):
        meta = storage.read_metadata(storage.checkpoint_dir(job_dir, n_))
        for _, h in meta.state_files():
            if h.incremental is not None:
                referenced |= {f.name for f in h.incremental.shared.values()}
                referenced |= {f.name for f in h.incremental.changelog}
    assert referenced
    shared = {k.rsplit("/", 1)[1] for k in s3.keys(bucket)
              if k.startswith("chk/first/shared/") and not k.endswith("/")}
    assert shared == referenced

    # a job that dies; a new one resumes from its S3 checkpoint at 3 tasks
    # (downloads, range copies) and the output of both is exact
    out2 = s3.url(bucket, "out2")
    dying = build(n, 2, 50, out2, chk, interval=0.1, rate=10_000)
    dying.restart = NoRestart()
    with pytest.raises(JobFailedError):
        dying.run(launcher="local", job_id="dying",
                  fault_injection=[{"point": "snapshot", "task": 2, "attempt": 0, "count": 4}])
    resume_from = storage.latest_completed(fs.join(chk, "dying"))
    assert resume_from is not None
    resumed = build(n, 3, 50, out2, chk, interval=0.1)
    result = resumed.run(launcher="local", from_checkpoint=resume_from, job_id="resumed")
    assert result.status == "finished" and result.restarts == 0
    check_exact_sums(out2, n, 50)
    meta = json.loads(fs.read_bytes(fs.join(result.latest_checkpoint or "", "_metadata")))
    assert all("incremental" in h for h in meta["operators"]["sums"]["subtasks"])
