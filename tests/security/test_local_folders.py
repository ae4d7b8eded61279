"""The RocksDB backend's local folders: Lockgate deletes only what it
created and marked, inside a base folder of its own user, and leaves nothing
of its own behind.

A user's ``local_dir`` holds their own files (old folders, a folder shaped
like a job's, links); a crafted base folder (another user's, a symbolic
link) is refused; a real job on both launchers leaves ``local_dir`` exactly
as it was."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from lockgate.fs.private import UnsafeFolderError
from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.serde import StateSerializer
from tests.fixtures import check_exact_sums

pytest.importorskip("rocksdict")

from lockgate.state.rocksdb.local import MARK, base_folder


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below ``root`` (not following links): its type, mode,
    modification time and content (a file's bytes, a link's target)."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                body: object = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = Path(p).read_bytes()
            else:
                body = None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_mtime_ns, body)
    return out


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def users_files(d: Path, victim: Path) -> None:
    """A user's own things in ``d``, an hour old: data in nested folders,
    empty folders, a folder shaped like an old Lockgate job's task folder
    (with an ``owner`` file naming a dead process), and a link out."""
    (d / "projects" / "2024").mkdir(parents=True)
    (d / "projects" / "2024" / "data.txt").write_text("precious\n")
    (d / "empty" / "deeper").mkdir(parents=True)
    task_like = d / "some-job" / "sums-0-a0-12345678"
    task_like.mkdir(parents=True)
    (task_like / "owner").write_text(str(dead_pid()))
    (d / "link-out").symlink_to(victim)
    for p in sorted(d.rglob("*"), reverse=True):
        os.utime(p, (1e9, 1e9), follow_symlinks=False)
    os.utime(d, (1e9, 1e9))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    (v / "inner").mkdir(parents=True)
    (v / "inner" / "keep.txt").write_text("not Lockgate's\n")
    return v


def rocks(local: Path, job: str = "job", task: int = 0, attempt: int = 0):
    config = RocksDBStateBackend(local_dir=str(local), memory_mb=16)
    return create_keyed_backend(config, 16, range(16), StateSerializer(),
                                BackendScope(job, "op", task, attempt, str(local.parent / "chk")))


def test_a_backend_leaves_the_users_files_alone_and_nothing_of_its_own(tmp_path, victim):
    d = tmp_path / "ssd"
    d.mkdir()
    users_files(d, victim)
    before, victim_before = snapshot(d), snapshot(victim)
    b = rocks(d)
    base = Path(base_folder(b.config))
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    folder = Path(b.folder)
    assert folder.parent.parent == base and (folder / MARK).is_file()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    b.close()
    assert snapshot(d) == before and snapshot(victim) == victim_before


def test_orphans_inside_the_base_are_removed_and_nothing_else(tmp_path, victim):
    d = tmp_path / "local"
    b = rocks(d, "live")  # makes the base
    base = Path(base_folder(b.config))
    orphan = base / "old-job" / "op-0-a0-12345678"
    (orphan / "db").mkdir(parents=True)
    (orphan / MARK).write_text(f'{{"pid": {dead_pid()}, "host": "{os.uname().nodename}"}}')
    elsewhere = base / "old-job" / "op-1-a0-12345678"  # a dead pid of another host
    elsewhere.mkdir()
    (elsewhere / MARK).write_text(f'{{"pid": {dead_pid()}, "host": "another-host"}}')
    gone = base / "cut-job" / ".op-0-a0-11112222.gone"  # a removal cut short
    (gone / "db").mkdir(parents=True)
    stale = base / "cut-job" / ".op-1-a0-11112222.new"  # a making cut short
    stale.mkdir()
    os.utime(stale, (0, 0))
    fresh = base / "cut-job" / ".op-2-a0-11112222.new"  # being made now
    fresh.mkdir()
    unmarked = base / "cut-job" / "op-3-a0-11112222"
    unmarked.mkdir()
    (base / "cut-job" / "op-4-a0-11112222").symlink_to(victim)
    (base / "link-job").symlink_to(victim)
    victim_before = snapshot(victim)
    second = rocks(d, "live", task=1)
    assert not (base / "old-job" / "op-0-a0-12345678").exists()
    assert elsewhere.is_dir() and fresh.is_dir() and unmarked.is_dir()
    assert not gone.exists() and not stale.exists()
    assert Path(b.folder).is_dir()  # alive
    assert snapshot(victim) == victim_before
    b.close()
    second.close()
    assert snapshot(victim) == victim_before



def test_earlier_attempts_of_the_same_task_are_removed(tmp_path):
    d = tmp_path / "local"
    first = rocks(d, attempt=0)
    second = rocks(d, attempt=1)
    assert not Path(first.folder).exists() and Path(second.folder).is_dir()
    second.close()
    assert os.listdir(d) == []


def test_a_base_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    d = tmp_path / "local"
    base = d / f"lockgate-rocksdb-{os.geteuid()}"
    (base / "job").mkdir(parents=True)
    (base / "job" / "theirs.txt").write_text("another user's\n")
    os.chown(base, 65534, 65534)
    before = snapshot(d)
    with pytest.raises(UnsafeFolderError, match=r"belongs to another user \(uid 65534"):
        rocks(d)
    assert snapshot(d) == before


def test_a_base_that_is_a_link_is_refused(tmp_path, victim):
    d = tmp_path / "local"
    d.mkdir()
    (d / f"lockgate-rocksdb-{os.geteuid()}").symlink_to(victim)
    (victim / "job").mkdir()
    orphan = victim / "job" / "op-0-a0-12345678"  # looks like a dead task's folder
    orphan.mkdir()
    (orphan / MARK).write_text(f'{{"pid": {dead_pid()}, "host": "{os.uname().nodename}"}}')
    before = snapshot(victim)
    with pytest.raises(UnsafeFolderError, match="is a symbolic link"):
        rocks(d)
    assert snapshot(victim) == before


def test_a_job_leaves_local_dir_as_it_was(tmp_path, victim, launcher):
    """A whole job (the keyed operator in RocksDB, several checkpoints, two
    tasks): every file under ``local_dir`` that Lockgate did not create is
    exactly as it was, and none of its own is left."""
    d = tmp_path / "ssd"
    d.mkdir()
    users_files(d, victim)
    before, victim_before = snapshot(d), snapshot(victim)
    n, keys = 30_000, 7
    p = Pipeline("sums", parallelism=2, state_backend=RocksDBStateBackend(local_dir=str(d)),
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, n, rate=40_000), uid="numbers")
       .map(lambda x: (x % keys, x), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out"))
    result = p.run(launcher=launcher)
    assert result.status == "finished" and result.completed_checkpoints, result
    check_exact_sums(tmp_path / "out", n, keys)
    assert snapshot(d) == before
    assert snapshot(victim) == victim_before
    # checkpoint storage is private too: folders 0700, files 0600 (the umask is 022)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode)
             for p in (tmp_path / "chk").rglob("*")}
    assert any("/shared/" in k for k in modes) and any(k.endswith("_metadata") for k in modes)
    assert {k: m for k, m in modes.items()
            if m != (0o700 if (tmp_path / k).is_dir() else 0o600)} == {}
