"""Names read back from a checkpoint or savepoint are untrusted: a crafted
``_metadata`` or state file naming a path outside its folder is refused with
an error naming the field, and no file outside the job's folders is read, created, moved or changed.

The savepoints are real (a job stopped half way, so its file sink holds
pre-committed parts and its source a position); the tests then rewrite one
subtask's operator state by hand, as an attacker with write access to a
shared bucket would, with a matching size and CRC so that only the name can
give it away."""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, FileSource
from lockgate.errors import CheckpointCorruptError, JobFailedError
from lockgate.state.serde import StateSerializer
from tests.fault.sums_job import build as build_sums
from tests.fixtures import operator_state


def tree(root: Path, skip: set[Path]) -> dict[str, str]:
    """Every file below ``root`` but in ``skip`` folders: path -> sha256."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(s in p.parents for s in skip):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def stop_half_way(p: Pipeline, tmp: Path) -> str:
    checkpointed = threading.Event()
    client = p.start(launcher="local", on_progress=lambda _: checkpointed.set())
    assert checkpointed.wait(120), "no checkpoint completed"
    result = client.stop(str(tmp / "savepoints"))
    assert result.status == "stopped" and result.savepoint
    return result.savepoint


def op_state(sp: str, uid: str) -> list[tuple[int, list]]:
    """Per subtask with state: (index, its operator-state entries)."""
    return [(i, entries) for i, entries in enumerate(operator_state(sp, uid)) if entries]


def craft(sp: str, uid: str, index: int, entries: list) -> None:
    """Rewrite subtask ``index`` of operator ``uid`` to hold ``entries`` as
    its operator state, with a consistent size and CRC-32."""
    meta_path = Path(sp) / "_metadata"
    meta = json.loads(meta_path.read_text())
    handle = meta["operators"][uid]["subtasks"][index]
    blob = StateSerializer().dumps(entries)
    (Path(sp) / handle["file"]).write_bytes(blob)
    handle.update(keyed_offset=0, op_state=[0, len(blob)], size=len(blob),
                  crc32=zlib.crc32(blob))
    handle.pop("key_groups", None)
    meta_path.write_text(json.dumps(meta))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every folder of the job, that nothing may touch."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


@pytest.mark.parametrize("escape", ["../../victim.txt", "/ABS/victim.txt", "..", "a/b.state"])
def test_a_state_file_named_outside_its_checkpoint_is_refused(tmp_path: Path, victim: Path,
                                                              escape: str) -> None:
    out = tmp_path / "out"
    sp = stop_half_way(build_sums(200_000, 2, 3, str(out), str(tmp_path / "chk"), 0.2,
                                  rate=40_000), tmp_path)
    meta_path = Path(sp) / "_metadata"
    meta = json.loads(meta_path.read_text())
    handle = next(h for h in meta["operators"]["sums"]["subtasks"] if h)
    handle["file"] = escape.replace("/ABS", str(tmp_path))
    meta_path.write_text(json.dumps(meta))
    before = tree(tmp_path, {tmp_path / "chk"})
    p = build_sums(200_000, 2, 3, str(out), str(tmp_path / "chk"), 0.2)
    with pytest.raises(CheckpointCorruptError, match="the state file of operator 'sums'"):
        p.run(launcher="local", from_savepoint=sp)
    assert tree(tmp_path, {tmp_path / "chk"}) == before


@pytest.mark.parametrize("field", ["pending", "final"])
@pytest.mark.parametrize("escape", ["../victim.txt", "/ABS/victim.txt", ".part-x-0-0-0.jsonl"])
def test_a_sink_part_named_outside_its_folder_is_refused(tmp_path: Path, victim: Path,
                                                         field: str, escape: str) -> None:
    out = tmp_path / "out"
    sp = stop_half_way(build_sums(200_000, 2, 3, str(out), str(tmp_path / "chk"), 0.2,
                                  rate=40_000), tmp_path)
    index, handles = next((i, hs) for i, hs in op_state(sp, "out") if hs)
    handles[0][field] = escape.replace("/ABS", str(tmp_path))
    craft(sp, "out", index, handles)
    before = tree(tmp_path, {tmp_path / "chk"})
    p = build_sums(200_000, 2, 3, str(out), str(tmp_path / "chk"), 0.2)
    with pytest.raises(JobFailedError) as e:
        p.run(launcher="local", from_savepoint=sp)
    assert "CheckpointCorruptError" in str(e.value) and "file sink 'out'" in str(e.value)
    assert "damaged or was crafted" in str(e.value)
    assert tree(tmp_path, {tmp_path / "chk"}) == before  # the sink's folder too


@pytest.mark.parametrize("escape", ["../secret.jsonl", "/ABS/secret.jsonl", "a/../../secret.jsonl"])
def test_a_source_position_outside_its_folder_is_refused(tmp_path: Path, escape: str) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for f in range(20):
        (src / f"part-{f:03d}.jsonl").write_text(
            "".join(json.dumps({"i": f * 500 + i}) + "\n" for i in range(500)))
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"i": -1, "secret": True}) + "\n")

    def job() -> Pipeline:
        p = Pipeline("files", parallelism=2, batch_size=64,
                     checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
        (p.source(FileSource(str(src), format="jsonl"), uid="lines")
           .map(lambda r: (__import__("time").sleep(0.002), r)[1], uid="slow")
           .sink(FileSink(str(out), format="jsonl"), uid="out"))
        return p

    sp = stop_half_way(job(), tmp_path)
    index, entries = next((i, es) for i, es in op_state(sp, "lines") if es)
    entries[0]["file"] = escape.replace("/ABS", str(tmp_path))
    craft(sp, "lines", index, entries)
    # (the sink's tasks may commit the savepoint's pre-committed parts first: allowed)
    before = tree(tmp_path, {tmp_path / "chk", out})
    with pytest.raises(JobFailedError) as e:
        job().run(launcher="local", from_savepoint=sp)
    assert "file source 'lines'" in str(e.value) and "damaged or was crafted" in str(e.value)
    assert tree(tmp_path, {tmp_path / "chk", out}) == before
    assert "secret" not in "".join(p.read_text() for p in out.glob("part-*"))
