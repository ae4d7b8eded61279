"""Faults inside the job: a record that cannot
be sent to the next task, a savepoint to another filesystem, fsync errors and
savepoint folders that must be refused.

Functions the tasks run are defined at module level, so the task processes
import them from this module.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import threading
import time
import uuid
import zlib
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline, fs
from lockgate.checkpoint import storage
from lockgate.cli import main as cli_main
from lockgate.cluster.coordinator import AttemptPlan, CheckpointCoordinator
from lockgate.connectors import CollectSink, SequenceSource
from lockgate.errors import ConfigurationError, JobFailedError, LockgateError
from lockgate.fs import transfer as fs_transfer
from lockgate.protocol import NotifyAborted
from tests.fault.sums_job import build as build_sums
from tests.fixtures import check_exact_sums, start_and_await

# ------------------------------------------------ item 6: unpicklable records


class Holder:
    """A record holding a lock: pickle refuses it."""

    def __init__(self, x: int) -> None:
        self.x = x
        self.lock = threading.Lock()


def bad(x: int) -> object:
    return Holder(x) if x == 50 else x


def _unpicklable_job(tmp: Path, restart, partition: str) -> Pipeline:
    p = Pipeline("unpicklable", parallelism=2, restart=restart,
                 checkpoint=CheckpointConfig(interval=0.5, storage=str(tmp / "chk")))
    stream = p.source(SequenceSource(1, 200), uid="numbers").map(bad, uid="bad")
    if partition == "rebalance":
        stream = stream.rebalance().map(repr, uid="after")
    else:
        stream = stream.key_by(lambda r: 0).reduce(lambda a, b: b, uid="after")
    stream.sink(CollectSink(), uid="out")
    return p


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partition", ["rebalance", "key_by"])
def test_an_unpicklable_record_fails_the_job_naming_its_operator(
        tmp_path: Path, launcher: str, partition: str) -> None:
    """The record crosses a channel: the job fails at once, without restarts
    (the replay would emit the same record), naming the operator that
    emitted it and pickle's reason (nothing hangs)."""
    started = time.monotonic()
    with pytest.raises(JobFailedError) as failed:
        _unpicklable_job(tmp_path, FixedDelayRestart(max_attempts=5, delay_s=0.0),
                         partition).run(launcher=launcher)
    message = str(failed.value)
    assert ("operator 'bad' emitted a record that cannot be sent to the next task: "
            "TypeError: cannot pickle '_thread.lock' object") in message, message
    assert "UnsendableRecordError" in message and "Restarting cannot help" in message, message
    assert time.monotonic() - started < 120


# ---------------------------------------- item 8: savepoints to another filesystem

N = 60_000
KEYS = 3


def _sums(tmp: Path, rate: float | None = 30_000) -> Pipeline:
    return build_sums(N, 2, KEYS, str(tmp / "out"), str(tmp / "chk"), 0.2, rate=rate)


@pytest.fixture
def other_device(tmp_path: Path):
    """A folder on another filesystem than ``tmp_path`` (``/dev/shm``, a tmpfs)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no other filesystem than the temporary folder's (/dev/shm)")
    folder = shm / f"lockgate-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _only_savepoints(folder: Path | str) -> list[str]:
    """The names in a savepoint folder; no hidden (unfinished) one may be left."""
    names = sorted(fs.listdir(folder))
    assert not [n for n in names if n.startswith(".")], f"left behind: {names}"
    return names


@pytest.mark.timeout(300)
def test_a_savepoint_to_another_device_restores_exactly(tmp_path: Path,
                                                        other_device: Path) -> None:
    """Checkpoints on one device, savepoints on another (os.replace gives
    EXDEV there): an intermediate savepoint and a stop's both complete, and
    the job resumed from the stop's savepoint writes the exact output."""
    client = start_and_await(_sums(tmp_path), launcher="local")
    first = client.savepoint(dir=str(other_device))
    result = client.stop(dir=str(other_device))
    assert result.status == "stopped", result
    assert _only_savepoints(other_device) == sorted(
        [os.path.basename(first), os.path.basename(result.savepoint)])
    for sp in (first, result.savepoint):
        assert storage.read_metadata(sp)
        assert any(name.endswith(".state") for name in os.listdir(sp))
    job_dir = Path(storage.checkpoint_dir(tmp_path / "chk" / client.job_id, 1)).parent
    assert not [p.name for p in job_dir.iterdir() if p.name.startswith("chk-")
                and not (p / "_metadata").exists()], "the savepoints' checkpoint folders remain"
    final = _sums(tmp_path, rate=None).run(launcher="local", from_savepoint=result.savepoint)
    assert final.status == "finished" and final.records_in == N
    check_exact_sums(tmp_path / "out", N, KEYS)


@pytest.mark.timeout(300)
def test_a_failure_half_way_through_a_savepoint_leaves_nothing(
        tmp_path: Path, other_device: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target fills up after the first state file was copied (ENOSPC on
    the second): the savepoint request fails saying so, nothing is left in the
    target folder (no empty or partial savepoint, no hidden folder), and the
    job goes on: the next savepoint there completes and restores exactly."""
    copied: list[str] = []
    real_copy = fs_transfer.copy

    def filling_up(src, dst, *rest):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        copied.append(str(dst))
        return real_copy(src, dst, *rest)

    client = start_and_await(_sums(tmp_path), launcher="local")
    monkeypatch.setattr(fs_transfer, "copy", filling_up)
    target = other_device / "sp"
    with pytest.raises(LockgateError, match="No space left on device") as failed:
        client.savepoint(dir=str(target))
    assert str(target) in str(failed.value)
    assert copied, "the failure did not come half way"
    assert not target.exists(), f"left behind: {os.listdir(target)}"
    monkeypatch.setattr(fs_transfer, "copy", real_copy)
    result = client.stop(dir=str(target))
    assert result.status == "stopped" and result.restarts == 0, result
    assert _only_savepoints(target) == [os.path.basename(result.savepoint)]
    _sums(tmp_path, rate=None).run(launcher="local", from_savepoint=result.savepoint)
    check_exact_sums(tmp_path / "out", N, KEYS)


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on loopback, as ``tests/integration/test_s3_storage.py`` starts it."""
    moto_server = pytest.importorskip("moto.server")
    from tests.integration.test_s3_storage import S3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield S3(*server.get_host_and_port())
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_a_savepoint_to_s3_from_local_checkpoints_restores_exactly(
        tmp_path: Path, s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints on the local disk, the savepoint in a bucket (another URL
    scheme): its state files are copied, ``_metadata`` comes last, and the
    job resumed from the bucket writes the exact output."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    bucket = s3_server.bucket()
    target = s3_server.url(bucket, "savepoints")
    client = start_and_await(_sums(tmp_path), launcher="local")
    result = client.stop(dir=target)
    assert result.status == "stopped", result
    keys = s3_server.keys(bucket)
    assert keys and {k.split("/")[1] for k in keys} == {
        result.savepoint.split("?")[0].rsplit("/", 1)[1]}, keys
    assert any(k.endswith("/_metadata") for k in keys), keys
    assert any(k.endswith(".state") for k in keys), keys
    _sums(tmp_path, rate=None).run(launcher="local", from_savepoint=result.savepoint)
    check_exact_sums(tmp_path / "out", N, KEYS)


def test_write_savepoint_into_a_full_tmpfs_leaves_nothing(tmp_path: Path) -> None:
    """A real ENOSPC half way (a 1 MiB tmpfs; needs the right to mount):
    nothing is left in the target, and the error names it."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.system(f"mount -t tmpfs -o size=1m tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        chk = tmp_path / "job" / "chk-7"
        chk.mkdir(parents=True)
        meta = _handmade_metadata(chk, {"a-0.state": 600_000, "a-1.state": 600_000})
        with pytest.raises(OSError, match="No space left on device") as failed:
            storage.write_savepoint(str(chk), str(mnt / "sp"), "job", 7, meta)
        assert str(mnt / "sp") in str(failed.value)
        assert os.listdir(mnt) == []
        assert not chk.exists()
    finally:
        os.system(f"umount {mnt}")


def test_a_savepoint_whose_last_rename_cannot_be_synced_is_not_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fsync of the folder that holds the savepoints fails after its
    folder was renamed into place: the rename is undone and everything
    removed, so no savepoint exists that its request says failed."""
    chk = tmp_path / "job" / "chk-7"
    chk.mkdir(parents=True)
    meta = _handmade_metadata(chk, {"a-0.state": 1000, "a-1.state": 2000})
    target = tmp_path / "sp"
    target.mkdir()
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.samestat(os.fstat(fd), os.stat(target)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        storage.write_savepoint(str(chk), str(target), "job", 7, meta)
    assert os.listdir(target) == []


def _handmade_metadata(chk: Path, files: dict[str, int]):
    """The metadata of a checkpoint ``chk`` whose one operator has a state
    file of each size in ``files`` (written there)."""
    subtasks = []
    for name, size in files.items():
        data = os.urandom(size)
        (chk / name).write_bytes(data)
        subtasks.append({"file": name, "size": size, "crc32": zlib.crc32(data),
                         "keyed_offset": 0})
    (chk / "_metadata").write_text(json.dumps({
        "format": 1, "checkpoint_id": 7, "kind": "savepoint", "max_parallelism": 128,
        "operators": {"a": {"parallelism": len(files), "operator_state_mode": "split",
                            "subtasks": subtasks}}}))
    meta = storage.read_metadata(chk)
    (chk / "_metadata").unlink()
    return meta


# ------------------------------------------ item 10: fsync, savepoint folders


@pytest.mark.timeout(300)
def test_savepoint_folders_that_would_be_lost_or_mixed_up_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file, a folder inside this job's checkpoint folder (its retention
    deletes checkpoints), inside another job's checkpoint folder, or inside a
    savepoint: each request fails at once, through the JobClient and through
    `lockgate savepoint` (the REST API), saying why and what to give
    instead; nothing is written and the job goes on."""
    client = start_and_await(_sums(tmp_path, rate=20_000), launcher="local")
    job_dir = tmp_path / "chk" / client.job_id
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    other_job = tmp_path / "chk" / "sums-other"
    (other_job / "chk-3").mkdir(parents=True)
    savepoint = tmp_path / "sps" / "savepoint-sums-old-4"
    savepoint.mkdir(parents=True)
    (savepoint / "_metadata").write_text("{}")
    cases = {
        a_file: "is a file",
        a_file / "below": f"cannot be made: {a_file} is a file",
        job_dir: "inside this job's checkpoint folder",
        job_dir / "savepoints": "inside this job's checkpoint folder",
        job_dir / "chk-1": "inside this job's checkpoint folder",
        other_job: "is another job's checkpoint folder (it holds chk-3)",
        other_job / "chk-3" / "sp": "another job's checkpoint folder (it holds chk-3)",
        savepoint: "is a checkpoint or savepoint (it has _metadata)",
        savepoint / "sp": f"is inside {savepoint}, a checkpoint or savepoint",
    }

    def others() -> list[Path]:
        """Everything but the job's own checkpoints and output."""
        return sorted(p for p in tmp_path.rglob("*")
                      if job_dir not in (p, *p.parents) and tmp_path / "out" not in p.parents)

    before = others()
    fix = f"give another folder, e.g. one beside the checkpoint folders: {tmp_path}/chk/savepoints"
    for target, why in cases.items():
        with pytest.raises(ConfigurationError) as refused:
            client.savepoint(dir=str(target))
        assert why in str(refused.value) and fix in str(refused.value), str(refused.value)
    capsys.readouterr()
    for target, why in list(cases.items())[:3]:
        assert cli_main(["savepoint", client.job_id, "--dir", str(target)]) == 1
        err = capsys.readouterr().err
        assert f"the savepoint of job {client.job_id} failed: the savepoint folder " \
            f"{target} " in err and why in err and fix in err, err
    with pytest.raises(ConfigurationError, match="inside this job's checkpoint folder"):
        client.stop(dir=str(job_dir / "sp"))
    assert not (job_dir / "sp").exists() and not (job_dir / "savepoints").exists()
    assert others() == before
    assert client.status()["status"] == "running" and client.status()["restarts"] == 0
    result = client.stop(dir=str(tmp_path / "chk" / "savepoints"))
    assert result.status == "stopped" and result.restarts == 0
    assert not [h for h in result.checkpoints if h.kind == "savepoint" and h.status == "failed"]


def _failing_fsync(monkeypatch: pytest.MonkeyPatch, error: int, folders: bool) -> list[int]:
    """``os.fsync`` of folders (or of files) fails with ``error`` from now on;
    returns the list of the failed calls' descriptors."""
    real, failed = os.fsync, []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode) == folders:
            failed.append(fd)
            raise OSError(error, os.strerror(error))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


def test_a_failed_folder_fsync_is_an_error_unless_folders_cannot_be_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_fsync(monkeypatch, errno.EIO, folders=True)
    with pytest.raises(OSError, match="Input/output error"):
        fs.sync_dir(tmp_path)
    with pytest.raises(OSError, match="Input/output error"):
        fs.write_atomic(str(tmp_path / "_metadata"), b"{}")
    assert os.listdir(tmp_path) == [], "a write its writer was told failed was left"
    _failing_fsync(monkeypatch, errno.EINVAL, folders=True)  # not supported there
    fs.sync_dir(tmp_path)
    fs.write_atomic(str(tmp_path / "_metadata"), b"{}")
    assert (tmp_path / "_metadata").read_bytes() == b"{}"


def test_a_failed_file_fsync_fails_the_state_file(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot writer declines a checkpoint whose state file raised."""
    failed = _failing_fsync(monkeypatch, errno.EIO, folders=False)
    with pytest.raises(OSError, match="Input/output error"):
        storage.write_state_file(str(tmp_path), "op-0.state", lambda out: out.write(b"x" * 10))
    assert failed


def test_a_failed_fsync_of_metadata_declines_the_checkpoint_and_the_job_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder fsync after ``_metadata``'s rename fails (EIO): the
    checkpoint is declined and counted, its ``_metadata`` is gone (nothing
    would restore a checkpoint the job counted as failed), and once the disk
    is well again the next checkpoint completes."""
    now, sent = [100.0], []
    config = CheckpointConfig(interval=1.0, storage=str(tmp_path), timeout=5.0,
                              tolerable_failed_checkpoints=1)
    c = CheckpointCoordinator("job", tmp_path / "job", config, {"src": 1, "sum": 1},
                              {"src": "split", "sum": "split"}, 128,
                              lambda a, t, m: sent.append(m), lambda: now[0])
    c.start_attempt(AttemptPlan(0, [0], [0, 1], {0: (0, 0, ["src"]), 1: (1, 0, ["sum"])}))

    def checkpoint(n: int) -> None:
        now[0] += 1.0
        c.tick()
        for task, uid in ((0, "src"), (1, "sum")):
            c.on_ack(task, n, {uid: None}, (0, 0))

    failed = _failing_fsync(monkeypatch, errno.EIO, folders=True)
    checkpoint(1)
    assert failed
    record = c.history[-1]
    assert record.status == "failed" and "Input/output error" in record.failure, record
    assert NotifyAborted(1) in sent and c.consecutive_failures == 1
    assert storage.completed_checkpoints(tmp_path / "job") == []
    monkeypatch.undo()
    checkpoint(2)
    assert c.history[-1].status == "completed" and c.consecutive_failures == 0
    assert storage.completed_checkpoints(tmp_path / "job") == [2]
