"""What a completed checkpoint's ``_metadata`` write makes durable on a local
filesystem: a power loss cannot be staged here, so the test records which
files and folders are fsynced (the real fsyncs still run)."""

from __future__ import annotations

import os

import pytest

from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind
from lockgate.checkpoint.metadata import CheckpointMetadata


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_metadata_then_the_checkpoint_folder_then_the_job_folder(tmp_path, fsynced):
    job_dir = storage.prepare_job_dir(str(tmp_path / "checkpoints"), "job-1")
    assert str(tmp_path / "checkpoints") in fsynced  # the job folder's own entry
    chk = storage.checkpoint_dir(job_dir, 3)
    os.makedirs(chk)  # as the first task writing into it does
    fsynced.clear()
    storage.write_metadata(chk, CheckpointMetadata(
        job_id="job-1", checkpoint_id=3, kind=CheckpointKind.CHECKPOINT, timestamp=0.0,
        final=False, max_parallelism=128, operators={}))
    # the file, its folder (the rename), then the job folder (the chk-3 entry)
    assert fsynced[-2:] == [chk, job_dir]
    assert fsynced[0].startswith(os.path.join(chk, ".")) and fsynced[0].endswith(".tmp")
