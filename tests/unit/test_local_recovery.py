"""Local recovery (``RocksDBStateBackend(local_recovery=True)``, the
default) without processes: a failover restores from the task's local copy
(shown by removing the checkpoint storage's shared files first); a copy
that is damaged (a truncated, missing, altered or extra file, a symbolic
link in a file's or a folder's place, another checkpoint's or host's
manifest) is refused with its reason and the state comes from the storage,
exactly; which copies are kept as checkpoints complete; rescaled and
cross-job restores look for none; a copy that cannot be made never fails a
checkpoint; the job's clean-up deletes only the folders it made."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend, remove_local_copies
from lockgate.state.keygroups import key_group_for_key, key_group_range
from lockgate.state.rocksdb import recovery as rocksdb_recovery
from lockgate.state.rocksdb.recovery import LocalRestore, base_folder
from lockgate.state.serde import StateSerializer
from tests.unit.test_rocksdb_backend import V, write_incremental
from tests.unit.test_rocksdb_backend import restore_incremental as restore_at
from tests.unit.test_rocksdb_changelog import contents, copy, mutate

pytest.importorskip("rocksdict")

M = 16


def rocks(tmp: Path, kg: range = range(M), task: int = 0, attempt: int = 0, *,
          job: Path, job_id: str = "job", **options):
    config = RocksDBStateBackend(local_dir=str(tmp / "local"), **{"memory_mb": 32, **options})
    return create_keyed_backend(config, M, kg, StateSerializer(), BackendScope(
        job_id, "op", task, attempt, str(job)))


def restore(b, handle, job: Path, checkpoint_id: int, index: int = 0, p: int = 1
            ) -> LocalRestore | None:
    """Restore ``handle`` (of checkpoint ``checkpoint_id`` of the job folder
    ``job``) into ``b`` as a task does; what it did about its local copy."""
    from lockgate.checkpoint.kinds import OperatorStateMode
    from lockgate.checkpoint.metadata import OperatorMetadata
    from lockgate.runtime.keyed_state import restore_keyed

    chk = job / f"chk-{checkpoint_id}"
    chk.mkdir(parents=True, exist_ok=True)
    meta = OperatorMetadata(1, OperatorStateMode.SPLIT, [handle[0]])
    return restore_keyed(b, meta, index, p, M, str(chk), lambda h: handle[1], checkpoint_id)


def copies(tmp: Path) -> list[Path]:
    return sorted((tmp / "local").glob("lockgate-recovery-*/*/*/chk-*"))


def two_checkpoints(tmp: Path, job: Path, **options) -> tuple[object, dict, object]:
    """A backend with two completed checkpoints (the second only a changelog
    on top of the first's materialization); returns (backend, model at 2,
    handle of 2)."""
    b = rocks(tmp, job=job, **options)
    rng = random.Random(11)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 3000)
    write_incremental(b, 1)
    b.notify_checkpoint_complete(1)
    mutate(b, model, rng, 500)
    handle = write_incremental(b, 2)
    b.notify_checkpoint_complete(2)
    return b, copy(model), handle


def test_a_failover_restores_from_the_local_copy_without_the_storage(tmp_path):
    job = tmp_path / "job"
    b, model, handle = two_checkpoints(tmp_path, job)
    assert handle[0].incremental.changelog  # the copy holds a changelog file too
    assert [p.name for p in copies(tmp_path)] == ["chk-2"]  # only the latest completed
    b.close()
    shutil.rmtree(job / "shared")  # the storage cannot serve it: only the copy can
    r = rocks(tmp_path, attempt=1, job=job)
    note = restore(r, handle, job, 2)
    assert note == LocalRestore(2, True)
    assert note.describe() == "restored from local copy of checkpoint 2"
    r.get_state(V)
    assert contents(r) == model
    assert [p.name for p in copies(tmp_path)] == ["chk-2"]  # kept for the next failure
    r.close()


def test_without_changelog_the_copy_is_the_rocksdb_checkpoint(tmp_path):
    job = tmp_path / "job"
    b, model, handle = two_checkpoints(tmp_path, job, changelog=False)
    b.close()
    shutil.rmtree(job / "shared")
    r = rocks(tmp_path, attempt=1, job=job, changelog=False)
    assert restore(r, handle, job, 2) == LocalRestore(2, True)
    r.get_state(V)
    assert contents(r) == model
    r.close()


def _sst(copy_dir: Path, kind: str = "db") -> Path:
    return sorted((copy_dir / kind).iterdir(), key=lambda p: p.stat().st_size)[-1]


def _truncate(c: Path) -> str:
    f = _sst(c)
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    return f"{f.name} has {f.stat().st_size} bytes"


def _delete(c: Path) -> str:
    f = _sst(c)
    f.unlink()
    return f"{f.name} is missing"


def _symlink(c: Path) -> str:
    f = _sst(c)
    keep = c.parent.parent / "elsewhere.sst"  # the very bytes, behind a link
    shutil.copyfile(f, keep)
    f.unlink()
    f.symlink_to(keep)
    return f"{f.name} is a symbolic link"


def _flip(c: Path) -> str:
    f = _sst(c)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    return f"{f.name} does not match its checksum"


def _flip_changelog(c: Path) -> str:
    f = _sst(c, "log")
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    return f"{f.name} does not match its checksum"


def _extra(c: Path) -> str:
    (c / "db" / "999999.sst").write_bytes(b"x")
    return "a file the checkpoint does not name"


def _folder_link(c: Path) -> str:
    moved = c.parent.parent / "moved"
    (c / "db").rename(moved)
    (c / "db").symlink_to(moved)
    return "db is a symbolic link"


def _other_checkpoint(c: Path) -> str:
    m = json.loads((c / "manifest.json").read_text())
    m["checkpoint"] = 1
    (c / "manifest.json").write_text(json.dumps(m))
    return "its manifest has checkpoint 1, not 2"


def _other_host(c: Path) -> str:
    m = json.loads((c / "manifest.json").read_text())
    m["host"] = "elsewhere"
    (c / "manifest.json").write_text(json.dumps(m))
    return "its manifest has host 'elsewhere'"


def _no_manifest(c: Path) -> str:
    (c / "manifest.json").unlink()
    return "it has no manifest"


def _gone(c: Path) -> str:
    shutil.rmtree(c)
    return "none on this host"


@pytest.mark.parametrize("damage", [_truncate, _delete, _symlink, _flip, _flip_changelog,
                                    _extra, _folder_link, _other_checkpoint, _other_host,
                                    _no_manifest, _gone])
def test_a_damaged_copy_is_refused_and_the_storage_restores_exactly(tmp_path, damage):
    job = tmp_path / "job"
    b, model, handle = two_checkpoints(tmp_path, job)
    b.close()
    (c,) = copies(tmp_path)
    reason = damage(c)
    r = rocks(tmp_path, attempt=1, job=job)
    note = restore(r, handle, job, 2)
    assert note is not None and not note.local and reason in note.reason, note
    assert note.describe().startswith("local copy of checkpoint 2 unusable (")
    assert note.describe().endswith("): downloading")
    r.get_state(V)
    assert contents(r) == model
    assert not copies(tmp_path)  # a refused copy goes
    # the next checkpoint makes a good one, and the one after restores from it
    mutate(r, model := copy(model), random.Random(5), 200)
    handle3 = write_incremental(r, 3)
    r.notify_checkpoint_complete(3)
    r.close()
    r2 = rocks(tmp_path, attempt=2, job=job)
    assert restore(r2, handle3, job, 3) == LocalRestore(3, True)
    r2.get_state(V)
    assert contents(r2) == model
    r2.close()


def test_completed_checkpoints_keep_one_copy_and_the_pending_ones(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(2)
    model: dict = {"v": {}, "m": {}}
    for n in (1, 2, 3):
        mutate(b, model, rng, 200)
        write_incremental(b, n)
    assert [p.name for p in copies(tmp_path)] == ["chk-1", "chk-2", "chk-3"]
    b.notify_checkpoint_complete(2)  # 3 is still pending: kept
    assert [p.name for p in copies(tmp_path)] == ["chk-2", "chk-3"]
    folder = copies(tmp_path)[0].parent
    shutil.copytree(folder / "chk-3", folder / "chk-9")  # a run before left one
    b.notify_checkpoint_complete(3)
    assert [p.name for p in copies(tmp_path)] == ["chk-3"]
    b.close()


def test_a_rescaled_or_other_jobs_restore_looks_for_no_copy(tmp_path):
    job = tmp_path / "job"
    b, model, handle = two_checkpoints(tmp_path, job)
    b.close()
    merged: dict = {"v": {}, "m": {}}
    for i in range(2):  # at parallelism 2: other key groups
        r = rocks(tmp_path, key_group_range(i, 2, M), i, 1, job=job)
        assert restore(r, handle, job, 2, i, 2) is None
        r.get_state(V)
        for name, table in contents(r).items():
            merged[name].update(table)
        r.close()
    assert merged == model
    # the copy of the old key-group range went: no task owns it now
    assert not copies(tmp_path)

    b, model, handle = two_checkpoints(tmp_path / "b", tmp_path / "b" / "job")
    b.close()
    other = rocks(tmp_path / "b", attempt=0, job=tmp_path / "b" / "other", job_id="other")
    restore_at(other, [handle], tmp_path / "b" / "job" / "chk-2", 0, 1)  # another job's
    other.get_state(V)
    assert contents(other) == model
    base = Path(base_folder(str(tmp_path / "b" / "local")))
    assert not [p for p in base.iterdir() if p.name.startswith("other")]  # nothing made
    other.close()


def test_a_copy_that_cannot_be_made_never_fails_the_checkpoint(tmp_path, monkeypatch, caplog):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, random.Random(1), 300)
    real = os.link

    def full(src, dst, *args, **kwargs):
        if "lockgate-recovery" in str(dst):
            raise OSError(28, "No space left on device")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(rocksdb_recovery.os, "link", full)
    handle = write_incremental(b, 1)
    monkeypatch.setattr(rocksdb_recovery.os, "link", real)
    assert "no local copy of checkpoint 1" in caplog.text
    assert not copies(tmp_path) and not list((tmp_path / "local").rglob(".chk-*"))
    b.close()
    r = rocks(tmp_path, attempt=1, job=job)
    assert restore(r, handle, job, 1) == LocalRestore(1, False, "none on this host")
    r.get_state(V)
    assert contents(r) == model
    r.close()


def test_local_recovery_off_keeps_no_copy(tmp_path):
    job = tmp_path / "job"
    b, model, handle = two_checkpoints(tmp_path, job, local_recovery=False)
    assert not list((tmp_path / "local").glob("lockgate-recovery-*"))
    b.close()
    r = rocks(tmp_path, attempt=1, job=job, local_recovery=False)
    assert restore(r, handle, job, 2) is None
    r.get_state(V)
    assert contents(r) == model
    r.close()
    with pytest.raises(Exception, match="local_recovery"):
        RocksDBStateBackend(local_recovery="yes")  # type: ignore[arg-type]


def test_copies_are_kept_with_incremental_checkpoints_and_local_recovery_only():
    assert RocksDBStateBackend().keeps_local_copies
    assert not RocksDBStateBackend(local_recovery=False).keeps_local_copies
    assert not RocksDBStateBackend(incremental=False).keeps_local_copies


def test_the_jobs_clean_up_deletes_only_what_it_made(tmp_path):
    job = tmp_path / "job"
    b, _, _ = two_checkpoints(tmp_path, job)
    b.close()
    config = RocksDBStateBackend(local_dir=str(tmp_path / "local"))
    base = Path(base_folder(config.directory))
    (job_folder,) = [p for p in base.iterdir() if p.name.startswith("job-")]
    stranger = base / "not-ours"  # no mark: not Lockgate's
    stranger.mkdir()
    (stranger / "keep.txt").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    (base / "a-link").symlink_to(outside)
    remove_local_copies(config, "another-job")
    assert job_folder.exists()
    remove_local_copies(config, "job")
    assert not job_folder.exists()
    assert (stranger / "keep.txt").exists() and (outside / "keep.txt").exists()
    remove_local_copies(RocksDBStateBackend(local_dir=str(tmp_path / "nothing")), "job")
    remove_local_copies(None, "job")  # a heap job: nothing
    assert not (tmp_path / "nothing" / base.name).exists()


def test_stale_job_folders_go_when_a_task_keeps_a_copy(tmp_path):
    job = tmp_path / "job"
    b, _, _ = two_checkpoints(tmp_path, job)
    b.close()
    base = Path(base_folder(str(tmp_path / "local")))
    (old,) = list(base.iterdir())
    for p in [old, *old.iterdir()]:
        os.utime(p, (1, 1))  # untouched for a long time: its driver was killed
    c = rocks(tmp_path, job=tmp_path / "job2", job_id="job2")
    mutate(c, {"v": {}, "m": {}}, random.Random(1), 10)
    write_incremental(c, 1)
    assert not old.exists()
    c.close()


def test_tasks_at_the_same_parallelism_keep_each_others_copies(tmp_path):
    job = tmp_path / "job"
    backends, handles, models = [], [], []
    for i in range(2):
        b = rocks(tmp_path, key_group_range(i, 2, M), i, job=job)
        model: dict = {"v": {}, "m": {}}
        keys = [k for k in range(300) if key_group_for_key(k, M) in b.key_group_range]
        mutate(b, model, random.Random(i), 300, keys)
        handles.append(write_incremental(b, 1))
        b.notify_checkpoint_complete(1)
        backends.append(b)
        models.append(copy(model))
    for b in backends:
        b.close()
    assert len(copies(tmp_path)) == 2
    for i in range(2):
        r = rocks(tmp_path, key_group_range(i, 2, M), i, 1, job=job)
        assert restore(r, handles[i], job, 1, i, 2) == LocalRestore(1, True)
        r.get_state(V)
        assert contents(r) == models[i]
        r.close()
    assert len(copies(tmp_path)) == 2


def test_a_filesystem_without_hard_links_turns_local_recovery_off_once(tmp_path, monkeypatch,
                                                                       caplog):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    model: dict = {"v": {}, "m": {}}
    real = os.link

    def no_links(src, dst, *args, **kwargs):
        if "lockgate-recovery" in str(dst):
            raise OSError(1, "Operation not permitted")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(rocksdb_recovery.os, "link", no_links)
    for n in (1, 2, 3):
        mutate(b, model, random.Random(n), 100)
        write_incremental(b, n)
    assert caplog.text.count("local recovery is off for this task") == 1
    assert "no local copy of checkpoint" not in caplog.text
    assert not copies(tmp_path)
    b.close()


def test_the_jobs_summary_counts_the_restores_from_local_copies():
    from lockgate.api.result import Guarantee, JobResult, JobStatus, LocalRestoreRecord
    from lockgate.cluster.progress import summary_lines

    result = JobResult("j", JobStatus.FINISHED, Guarantee.EXACTLY_ONCE, 1, ["x"],
                       local_restores=[LocalRestoreRecord(1, 2, "sums", 7, True),
                                       LocalRestoreRecord(1, 3, "sums", 7, False, "none")])
    assert summary_lines(result)[-1] == (
        "local recovery: 1 keyed state restores from the tasks' local copies, 1 from the "
        "checkpoint storage")
    result.local_restores = []
    assert not any("local recovery" in line for line in summary_lines(result))


def test_a_link_planted_as_the_base_folder_is_never_followed(tmp_path, caplog):
    """Another folder linked in place of the copies' base: the checkpoints go
    on without copies (a warning), a restore reads the storage, and nothing
    is written through the link."""
    job = tmp_path / "job"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "local").mkdir()
    Path(base_folder(str(tmp_path / "local"))).symlink_to(elsewhere)
    b, model, handle = two_checkpoints(tmp_path, job)
    assert "local recovery is off for this task" in caplog.text
    b.close()
    r = rocks(tmp_path, attempt=1, job=job)
    note = restore(r, handle, job, 2)
    assert note is not None and not note.local and "symbolic link" in note.reason, note
    r.get_state(V)
    assert contents(r) == model
    r.close()
    assert not list(elsewhere.iterdir())
