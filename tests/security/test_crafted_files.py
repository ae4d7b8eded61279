"""Files read back from a checkpoint are untrusted: a crafted file tree
(a symbolic link out of the checkpoint, a named pipe, a device, a huge or a
truncated file, a flipped byte) in place of ``_metadata``, a state file, a
shared SST file or a changelog file is refused by a real restore, with an
error that names the file and what is wrong with it; nothing outside the
job's folders is created, changed, deleted or read, and no restore hangs.

The checkpoints are real: a finished job's last one on the heap backend and
on RocksDB with and without a changelog (incremental handles, shared and
changelog files), one of a job with broadcast state, one of a job with
Arrow state, and one of an unaligned job that holds in-flight data
(``.channels`` files); each example damages a private copy and restores a
whole job from it. Hypothesis picks the examples (a few in the
normal run, more with ``LOCKGATE_SOAK=1``); the cases of each kind that must
never regress are listed as well.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from lockgate.errors import CheckpointCorruptError, JobFailedError
from lockgate.state.backends import HeapStateBackend, RocksDBStateBackend
from tests.fault.arrow_sums_job import build as build_arrow
from tests.fault.arrow_sums_job import write_input
from tests.fault.enrich_job import build as build_enrich
from tests.fault.sums_job import build as build_sums
from tests.fixtures import start_and_await
from tests.security.test_local_folders import snapshot

pytest.importorskip("rocksdict")

SOAK = bool(os.environ.get("LOCKGATE_SOAK"))
N, KEYS = 6000, 5

BACKENDS = {
    "heap": HeapStateBackend(),
    "rocksdb-changelog": RocksDBStateBackend(memory_mb=16),
    "rocksdb-sst": RocksDBStateBackend(memory_mb=16, changelog=False),
}


def add(a: tuple, b: tuple) -> tuple:
    return a[0], a[1] + b[1]


def pair(x: int) -> tuple:
    return x % KEYS, x


def sums(backend: str, root: Path) -> Pipeline:
    p = Pipeline("sums", parallelism=2, state_backend=BACKENDS[backend],
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(root / "chk")))
    (p.source(SequenceSource(1, N, rate=8000), uid="numbers")
       .map(pair, uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(add, uid="sums")
       .sink(FileSink(str(root / "out"), format="jsonl"), uid="out"))
    return p


def enrich(root: Path) -> Pipeline:
    return build_enrich(2000, 2, str(root / "out"), str(root / "rej"),
                        str(root / "chk"), 0.2)


def arrow(root: Path) -> Pipeline:
    if not (root / "in").exists():
        write_input(root / "in", 20_000)
    return build_arrow(str(root / "in"), 2, 7, str(root / "out"), str(root / "copy"),
                       str(root / "chk"), 0.2, 20_000, 1000)


def unaligned(root: Path) -> Pipeline:
    return build_sums(200_000, 2, 7, str(root / "out"), str(root / "chk"), 0.1,
                      rate=30_000, unaligned=True, slow_sink=20_000, batch_size=256)


@dataclass(frozen=True)
class Tree:
    """A kind of checkpoint: the job that writes it (and restores it), the
    operator whose state file is damaged, and whether the job runs to its
    end (else it is cancelled once a checkpoint holds in-flight data)."""

    build: Callable[[Path], Pipeline]
    uid: str
    finishes: bool = True


TREES = {
    **{b: Tree(functools.partial(sums, b), "sums") for b in BACKENDS},
    "broadcast": Tree(enrich, "enrich"),
    "arrow": Tree(arrow, "sums"),
    "unaligned": Tree(unaligned, "sums", finishes=False),
}


def channel_files(root: Path) -> list[Path]:
    return [f for f in root.glob("chk/*/chk-*/*.channels") if (f.parent / "_metadata").exists()]


def write_tree(tree: Tree, root: Path) -> Path:
    """The checkpoint ``tree`` describes, written by a real job under ``root``."""
    os.environ["TMPDIR"] = str(root)  # the RocksDB folders, for this run
    try:
        p = tree.build(root)
        if tree.finishes:
            result = p.run(launcher="local")
            assert result.status == "finished" and result.latest_checkpoint, result
            return Path(result.latest_checkpoint)
        client = start_and_await(p, launcher="local", until=lambda _: channel_files(root),
                                 what="no checkpoint held in-flight data")
        client.cancel()
    finally:
        os.environ.pop("TMPDIR")
    found = channel_files(root)
    assert found, "the checkpoint with in-flight data was not retained"
    return max(found, key=lambda f: int(f.parent.name[4:])).parent


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per kind of tree: its checkpoint."""
    return {name: write_tree(tree, tmp_path_factory.mktemp(name)) for name, tree in TREES.items()}


def targets(chk: Path, uid: str) -> dict[str, Path]:
    """The files of checkpoint ``chk`` a crafted tree may replace."""
    meta = json.loads((chk / "_metadata").read_text())
    handles = [h for h in meta["operators"][uid]["subtasks"] if h]
    state = max(handles, key=lambda h: h["size"])
    found = {"_metadata": chk / "_metadata", "state file": chk / state["file"]}
    channels = sorted(chk.glob("*.channels"))
    if channels:
        found["channels file"] = max(channels, key=lambda f: f.stat().st_size)
    inc = [h["incremental"] for h in handles if "incremental" in h]
    shared = [ref for i in inc for ref in i["shared"].values()]
    log = [ref for i in inc for ref in i.get("changelog", [])]
    if shared:
        found["shared file"] = chk.parent / "shared" / max(shared, key=lambda r: r[1])[0]
    if log:
        found["changelog file"] = chk.parent / "shared" / max(log, key=lambda r: r[1])[0]
    return found


@dataclass
class Outside:
    """Things beyond the job's folders: a copy of the damaged file's bytes
    (a link to it would pass every size and checksum check), and a FIFO
    holding a byte that a read through a link would take."""

    root: Path
    copy: Path
    pipe: Path
    pipe_fd: int

    def untouched(self) -> bool:
        try:
            return os.read(os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK), 1) == b"x"
        finally:
            os.close(self.pipe_fd)


def damage(path: Path, how: str, outside: Outside) -> None:
    data = path.read_bytes()
    outside.copy.write_bytes(data)
    path.unlink()
    match how:
        case "link":
            path.symlink_to(outside.copy)
        case "link to a pipe":
            path.symlink_to(outside.pipe)
        case "pipe":
            os.mkfifo(path)
        case "device":
            if os.geteuid() == 0:
                os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
            else:
                path.symlink_to("/dev/zero")
        case "folder":
            path.mkdir()
        case "huge":
            with open(path, "wb") as f:
                f.write(data)
                f.truncate(len(data) + (1 << 30))  # sparse: a gigabyte of zeros more
        case "truncated":
            path.write_bytes(data[: len(data) // 2])
        case "flipped":
            path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))


WORDS = {
    "link": "is a symbolic link",
    "link to a pipe": "is a symbolic link",
    "pipe": "is a named pipe",
    "device": "is a device" if os.geteuid() == 0 else "is a symbolic link",
    "folder": "is a folder",
    "huge": "has more than",
    "truncated": "it is truncated",
    "flipped": "checksum",
}


def restore(kind: str, chk: Path, how: str, target: str, tmp: Path) -> None:
    """Damage ``target`` of a copy of ``chk`` as ``how`` says and restore a
    job from it (its sinks and sources where the checkpoint's were: they
    check that): refused, naming the file and the problem; nothing outside
    read or touched."""
    root = tmp / "run"
    shutil.rmtree(root, ignore_errors=True)
    job = root / "chk" / chk.parent.name
    shutil.copytree(chk.parent, job, symlinks=True)
    copy = job / chk.name
    tree = TREES[kind]
    path = targets(copy, tree.uid)[target]
    pipe = root / "outside.fifo"
    os.mkfifo(pipe)
    outside = Outside(root, root / "outside.bin", pipe,
                      os.open(pipe, os.O_RDWR | os.O_NONBLOCK))
    os.write(outside.pipe_fd, b"x")
    damage(path, how, outside)
    (root / "local").mkdir()
    before = snapshot(root)
    os.environ["TMPDIR"] = str(root / "local")
    try:
        with pytest.raises((CheckpointCorruptError, JobFailedError)) as e:
            tree.build(chk.parent.parent.parent).run(launcher="local",
                                                     from_checkpoint=str(copy))
    finally:
        os.environ.pop("TMPDIR")
        untouched = outside.untouched()
    message = str(e.value)
    assert "CheckpointCorruptError" in message or e.type is CheckpointCorruptError, message
    assert str(path) in message, message
    words = WORDS[how]
    if target == "_metadata" and how in ("truncated", "flipped"):
        words = "is corrupt"  # no recorded size or checksum: its JSON is checked
    if target == "_metadata" and how == "huge":
        words = "is larger than 268435456 bytes"  # its limit
    if target in ("state file", "channels file") and how in ("huge", "truncated"):
        words = "bytes, the checkpoint recorded"  # the driver's size check
    assert words in message, message
    assert untouched, "a byte was read from a pipe outside the checkpoint"
    after = snapshot(root)
    changed = {k for k in before.keys() | after.keys()
               if before.get(k) != after.get(k)
               and k.split(os.sep)[0] not in ("chk", "out", "local", "in", "rej", "copy")}
    assert not changed, changed
    # the tasks ended by the failure may leave their folders (the next task
    # on this host removes them): only inside Lockgate's own base folder
    assert set(os.listdir(root / "local")) <= {f"lockgate-rocksdb-{os.geteuid()}"}
    if (root / "out").exists():
        assert not any((root / "out").iterdir())


HOWS = list(WORDS)


@pytest.mark.parametrize("kind,target,how", [
    ("heap", "_metadata", "pipe"),
    ("heap", "_metadata", "link"),
    ("heap", "state file", "link to a pipe"),
    ("heap", "state file", "pipe"),
    ("heap", "state file", "device"),
    ("heap", "state file", "folder"),
    ("rocksdb-sst", "shared file", "link"),
    ("rocksdb-sst", "shared file", "flipped"),
    ("rocksdb-changelog", "changelog file", "pipe"),
    ("rocksdb-changelog", "changelog file", "huge"),
    ("rocksdb-changelog", "shared file", "link to a pipe"),
    ("broadcast", "state file", "link"),
    ("arrow", "state file", "flipped"),
    ("unaligned", "channels file", "pipe"),
    ("unaligned", "channels file", "link"),
])
def test_a_crafted_file_is_refused(finished, tmp_path, kind, target, how):
    restore(kind, finished[kind], how, target, tmp_path)


@settings(max_examples=40 if SOAK else 6, deadline=None, derandomize=not SOAK,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_crafted_trees(finished, tmp_path, data):
    kind = data.draw(st.sampled_from(sorted(TREES)), "kind")
    target = data.draw(st.sampled_from(sorted(targets(finished[kind], TREES[kind].uid))),
                       "target")
    how = data.draw(st.sampled_from(HOWS), "how")
    restore(kind, finished[kind], how, target, tmp_path)
