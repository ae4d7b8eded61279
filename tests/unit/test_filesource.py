"""Unit tests of the replayable file source."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lockgate.connectors.base import TaskInfo
from lockgate.connectors.filesource import FileSource, assign_file, list_files
from lockgate.errors import LockgateError


def _info(task_index: int = 0, parallelism: int = 1) -> TaskInfo:
    return TaskInfo("job", "src", task_index, parallelism, 128, 0)


def _reader(src: FileSource, state: list[Any] | None = None, task: int = 0, p: int = 1) -> Any:
    r = src.create_reader(_info(task, p))
    r.restore(state or [])
    return r


def _drain(r: Any, n: int = 1000) -> list[Any]:
    out: list[Any] = []
    while True:
        batch = r.poll(n)
        if batch is None:
            return out
        out += batch


def _write_jsonl(folder: Path) -> list[Any]:
    (folder / "a.jsonl").write_text('{"i":0}\n{"i":1}\n\n{"i":2}\n')
    (folder / "b.jsonl").write_text("")
    (folder / "sub").mkdir()
    (folder / "sub" / "c.jsonl").write_text('[3]\n"four"\n5')  # no final newline
    (folder / ".d.jsonl.inprogress").write_text('{"hidden":1}\n')
    (folder / "_SUCCESS").write_text("")
    return [{"i": 0}, {"i": 1}, {"i": 2}, [3], "four", 5]


def _write_csv(folder: Path) -> list[Any]:
    (folder / "a.csv").write_text('x,y\n1,"multi\nline"\n2,b\n\n')
    (folder / "b.csv").write_text("x,y\r\n3,c\r\n")
    (folder / "empty.csv").write_text("")
    return [{"x": "1", "y": "multi\nline"}, {"x": "2", "y": "b"}, {"x": "3", "y": "c"}]


def _write_parquet(folder: Path) -> list[Any]:
    rows = [{"i": i, "s": str(i)} for i in range(7)]
    pq.write_table(pa.Table.from_pylist(rows[:5]), folder / "a.parquet", row_group_size=2)
    pq.write_table(pa.Table.from_pylist(rows[5:]), folder / "b.parquet")
    pq.write_table(
        pa.Table.from_pylist(rows[:0], schema=pa.table({"i": [1], "s": ["x"]}).schema),
        folder / "c.parquet",
    )
    return rows


WRITERS = {"jsonl": _write_jsonl, "csv": _write_csv, "parquet": _write_parquet}


def test_list_files_skips_hidden(tmp_path: Path) -> None:
    _write_jsonl(tmp_path)
    (tmp_path / "_tmp").mkdir()
    (tmp_path / "_tmp" / "x.jsonl").write_text("1\n")
    assert list_files(str(tmp_path)) == ["a.jsonl", "b.jsonl", "sub/c.jsonl"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_reads_everything_then_none(tmp_path: Path, fmt: str) -> None:
    expected = WRITERS[fmt](tmp_path)
    src = FileSource(str(tmp_path), fmt)
    assert src.bounded and src.replayable
    r = _reader(src)
    assert _drain(r) == expected
    assert r.poll(10) is None
    assert all(e["done"] for e in r.snapshot_state(1))
    r.close()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_resume_at_every_position(tmp_path: Path, fmt: str, step: int) -> None:
    """The files are read in turn (one batch of one file per poll): from
    every position, a resumed reader reads exactly the records not read yet."""
    expected = WRITERS[fmt](tmp_path)
    src = FileSource(str(tmp_path), fmt)
    r = _reader(src)
    states: list[tuple[int, list[Any]]] = [(0, r.snapshot_state(0))]
    seen: list[Any] = []
    while (batch := r.poll(step)) is not None:
        assert len(batch) <= step
        seen += batch
        states.append((len(seen), r.snapshot_state(len(states))))
    assert _sorted(seen) == _sorted(expected)
    for n, state in states:
        r2 = _reader(src, state)
        assert _sorted(_drain(r2, step)) == _sorted(seen[n:]), (n, state)
        r2.close()


def _sorted(records: list[Any]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in records)


def test_state_entries_shape(tmp_path: Path) -> None:
    _write_jsonl(tmp_path)
    r = _reader(FileSource(str(tmp_path)))
    assert r.snapshot_state(1) == []
    assert r.poll(2) == [{"i": 0}, {"i": 1}]
    assert r.snapshot_state(2) == [{"file": "a.jsonl", "offset": 16, "done": False}]
    r.poll(1)
    _drain(r)
    assert r.snapshot_state(3) == [
        {"file": "a.jsonl", "offset": 25, "done": True},
        {"file": "b.jsonl", "offset": 0, "done": True},
        {"file": "sub/c.jsonl", "offset": 12, "done": True},
    ]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_files_split_among_tasks_exactly_once(tmp_path: Path, p: int) -> None:
    for i in range(20):
        (tmp_path / f"f{i:02d}.jsonl").write_text(f"{i}\n")
    src = FileSource(str(tmp_path))
    got: list[int] = []
    for t in range(p):
        part = _drain(_reader(src, task=t, p=p))
        assert part == sorted(part)  # sorted name order within a task
        assert all(assign_file(f"f{i:02d}.jsonl", p) == t for i in part)
        got += part
    assert sorted(got) == list(range(20))


def test_restore_with_union_state_keeps_only_own_files(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}.jsonl").write_text(f"{i}\n{i + 100}\n")
    src = FileSource(str(tmp_path))
    union: list[Any] = []
    for t in range(3):
        r = _reader(src, task=t, p=3)
        r.poll(3)  # 1.5 files each
        union += r.snapshot_state(1)
    got: list[int] = []
    for t in range(2):  # rescale 3 -> 2 with union state
        got += _drain(_reader(src, union, task=t, p=2))
    first: list[int] = []
    for t in range(3):
        r = _reader(src, task=t, p=3)
        first += r.poll(3)
    assert sorted(first + got) == sorted(list(range(10)) + list(range(100, 110)))


def test_missing_file_in_state_raises(tmp_path: Path) -> None:
    (tmp_path / "gone.jsonl").write_text("1\n")
    src = FileSource(str(tmp_path))
    r = _reader(src)
    r.poll(1)
    state = r.snapshot_state(1)
    (tmp_path / "gone.jsonl").unlink()
    with pytest.raises(LockgateError, match="gone.jsonl"):
        _reader(src, state)


def test_missing_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(LockgateError, match="does not exist"):
        _reader(FileSource(str(tmp_path / "nope")))


def test_bad_arguments() -> None:
    with pytest.raises(LockgateError, match="format"):
        FileSource("/tmp", "xml")


def test_bad_json_line_names_file(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("1\n{oops\n")
    r = _reader(FileSource(str(tmp_path)))
    with pytest.raises(LockgateError, match="bad.jsonl"):
        _drain(r)


def test_watch_picks_up_new_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("1\n")
    src = FileSource(str(tmp_path), watch=True, poll_interval=0.05)
    assert not src.bounded
    r = _reader(src)
    assert r.poll(10) == [1]
    assert r.poll(10) == []
    (tmp_path / "b.jsonl").write_text("2\n")
    assert r.poll(10) == []  # not rescanned before poll_interval
    time.sleep(0.06)
    assert r.poll(10) == [2]
    state = r.snapshot_state(1)
    time.sleep(0.06)
    assert r.poll(10) == []  # a.jsonl and b.jsonl are not read twice
    (tmp_path / "c.jsonl").write_text("3\n")
    r2 = _reader(src, state)
    assert r2.poll(10) == [3]


def test_watch_missing_folder_waits(tmp_path: Path) -> None:
    folder = tmp_path / "later"
    r = _reader(FileSource(str(folder), watch=True, poll_interval=0.0))
    assert r.poll(5) == []
    folder.mkdir()
    (folder / "x.jsonl").write_text(json.dumps({"a": 1}) + "\n")
    assert r.poll(5) == [{"a": 1}]
