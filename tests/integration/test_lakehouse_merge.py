"""The merge commit of the Delta and Iceberg sinks, called directly on staged
files (no job): a key of two columns, thousands of keys deleted in one
commit, the last change of a key winning within a commit, and a commit
that only deletes keys the table does not hold still recording its
checkpoint (a restore must not look for its staged files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lockgate.connectors.lakehouse import StagedFile

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

APP = "lockgate/job/lake"
SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64()),
                    ("gone", pa.bool_())])


def _target(kind: str, tmp: Path) -> Any:
    if kind == "delta":
        from lockgate.connectors.delta import DeltaTarget
        return DeltaTarget(str(tmp / "table"), "merge", ["a", "b"], "gone", "lake")
    from lockgate.connectors.iceberg import IcebergTarget
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
               "warehouse": f"file://{tmp}/warehouse"}
    return IcebergTarget("lockgate", catalog, "lake.t", "merge", ["a", "b"], "gone", "lake")


def _rows(kind: str, target: Any) -> dict[tuple[int, str], int]:
    if kind == "delta":
        table = target._table().to_pyarrow_table()
    else:
        table = target._table().scan().to_arrow()
    return {(r["a"], r["b"]): r["v"] for r in table.to_pylist()}


def _commit(target: Any, tmp: Path, checkpoint: int, *parts: list[dict]) -> None:
    """Stage each of ``parts`` as one task's file of ``checkpoint``, and commit them."""
    files = []
    for task, rows in enumerate(parts):
        path = tmp / f"c{checkpoint}-t{task}-a0.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(path))
        files.append(StagedFile("job", "lake", checkpoint, task, 0, str(path), len(rows)))
    target.commit(files, {APP: checkpoint}, lambda point: None)
    assert target.committed_version(APP) == checkpoint
    assert not any(Path(f.path).exists() for f in files)


def row(a: int, b: str, v: int, gone: bool = False) -> dict:
    return {"a": a, "b": b, "v": v, "gone": gone}


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_merge_of_thousands_of_keys_in_one_commit(tmp_path, kind):
    target = _target(kind, tmp_path)
    want: dict[tuple[int, str], int] = {}
    first = [row(i % 40, f"k{i}", i) for i in range(3000)]
    _commit(target, tmp_path, 1, first[:1500], first[1500:])
    want.update({(r["a"], r["b"]): r["v"] for r in first})
    assert _rows(kind, target) == want

    # 2,500 keys deleted, 300 updated twice (the later change wins), 100 new,
    # 50 deletes of keys the table never held
    deletes = [row(i % 40, f"k{i}", -1, True) for i in range(2500)]
    updates = [row(i % 40, f"k{i}", 10_000 + i) for i in range(2500, 2800)]
    again = [row(i % 40, f"k{i}", 20_000 + i) for i in range(2500, 2800)]
    new = [row(7, f"new{i}", i) for i in range(100)]
    absent = [row(99, f"never{i}", 0, True) for i in range(50)]
    _commit(target, tmp_path, 2, deletes + updates, again + new + absent)
    for i in range(2500):
        del want[(i % 40, f"k{i}")]
    want.update({(i % 40, f"k{i}"): 20_000 + i for i in range(2500, 2800)})
    want.update({(7, f"new{i}"): i for i in range(100)})
    assert _rows(kind, target) == want

    # a key deleted and written again in the same commit: the last change wins
    _commit(target, tmp_path, 3, [row(0, "k2600", -1, True), row(5, "k5", -1, True)],
            [row(0, "k2600", 1), row(5, "k5", 2, False)])
    last_of = {(0, "k2600"): 1, (5, "k5"): 2}  # the second task's file comes last
    want.update(last_of)
    assert _rows(kind, target) == want

    # only deletes of keys the table does not hold: nothing changes, the
    # checkpoint is recorded all the same
    _commit(target, tmp_path, 4, [row(99, f"never{i}", 0, True) for i in range(20)])
    assert _rows(kind, target) == want
