"""The pure pieces of the lakehouse sinks: staged names, restored handles
(untrusted), the recovery plan, the last change per key, the committed
checkpoint of Iceberg snapshot summaries."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from lockgate.connectors.delta import last_per_key
from lockgate.connectors.iceberg import committed_in
from lockgate.connectors.lakehouse import (
    LakeFileHandle,
    app_id,
    beside,
    check_handle,
    parse_staged_name,
    plain_uri,
    plan_recovery,
    safe,
    staged_name,
    valid_handle,
)
from lockgate.connectors.twophase import Precommitted
from lockgate.errors import ConfigurationError


def handle(cid: int, task: int, app: str = "a", attempt: int = 0) -> dict:
    return {"app": app, "job": "j", "file": staged_name(cid, task, attempt), "rows": 3,
            "checkpoint_id": cid, "task_index": task}


def test_staged_names_round_trip_and_reject_others():
    assert parse_staged_name(staged_name(12, 3, 4)) == (12, 3, 4)
    for bad in ("c1-t2.parquet", "../c1-t2-a3.parquet", "c1-t2-a3.parquet.inprogress", ""):
        assert parse_staged_name(bad) is None
    assert safe("a/../b c") == "a_.._b_c"
    assert app_id("job-1", "out") == "lockgate/job-1/out"


def test_restored_handles_are_checked():
    assert valid_handle(handle(3, 1))
    assert not valid_handle({**handle(3, 1), "file": "../../etc/passwd"})
    assert not valid_handle({**handle(3, 1), "checkpoint_id": 4})  # file of another checkpoint
    assert not valid_handle({**handle(3, 1), "task_index": "1"})
    assert not valid_handle({**handle(3, 1), "job": 7})
    assert not valid_handle({k: v for k, v in handle(3, 1).items() if k != "app"})
    assert not valid_handle({**handle(3, 1), "job": "j" * 2000})
    with pytest.raises(ConfigurationError, match="not a lakehouse sink handle"):
        check_handle({**handle(3, 1), "job": 7}, "out")
    assert check_handle(handle(3, 1, attempt=2), "out") == LakeFileHandle(
        "a", "j", staged_name(3, 1, 2), 3, 2)


def decoded(entries: list[dict]) -> list[Precommitted[LakeFileHandle]]:
    """Restored entries as the two-phase-commit base hands them to ``recover``."""
    return [Precommitted(e["checkpoint_id"], e["task_index"], check_handle(e, "out"))
            for e in entries]


def test_plan_commits_only_what_the_table_lacks():
    handles = decoded([handle(5, 1), handle(4, 0), handle(6, 0), handle(2, 0, app="old")])
    plan = plan_recovery(handles, {"a": 4, "old": None})
    assert [(h.handle.app, h.checkpoint_id) for h in plan.to_commit] == [
        ("old", 2), ("a", 5), ("a", 6)]
    assert plan.versions == {"a": 6, "old": 2}
    assert [h.checkpoint_id for h in plan.committed] == [4]
    assert plan_recovery(handles, {"a": 9, "old": 2}).to_commit == []


def test_last_change_per_key_keeps_row_order():
    t = pa.table({"k": [1, 2, 1, 3, 2], "v": [10, 20, 11, 30, 21]})
    assert last_per_key(t, ["k"]).to_pydict() == {"k": [1, 3, 2], "v": [11, 30, 21]}
    t2 = pa.table({"a": [1, 1, 1], "b": [1, 2, 1], "v": [1, 2, 3]})
    assert sorted(last_per_key(t2, ["a", "b"]).column("v").to_pylist()) == [2, 3]


def test_committed_checkpoint_of_iceberg_summaries():
    snaps = [SimpleNamespace(summary={"lockgate.checkpoint.a": "3"}),
             SimpleNamespace(summary={"lockgate.checkpoint.a": "7", "x": "y"}),
             SimpleNamespace(summary={"lockgate.checkpoint.b": "9"}),
             SimpleNamespace(summary={"lockgate.checkpoint.a": "-1"}),  # not an id
             SimpleNamespace(summary=None)]
    assert committed_in(snaps, "a") == 7
    assert committed_in(snaps, "c") is None


def test_table_locations_beside_the_staging_url():
    staging = "s3://K:S@bucket/staging/x?endpoint_override=h:1&scheme=http"
    assert beside(staging, "s3://bucket/wh/t") == \
        "s3://K:S@bucket/wh/t?endpoint_override=h:1&scheme=http"
    assert plain_uri(beside(staging, "s3://bucket/wh/t/data/f")) == "s3://bucket/wh/t/data/f"
    assert beside(staging, "file:///tmp/wh") == "/tmp/wh"
    with pytest.raises(ConfigurationError, match="bucket"):
        beside(staging, "s3://other/wh")


def test_staged_writer_writes_row_groups_as_the_batches_come(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from lockgate.connectors import lakehouse

    monkeypatch.setattr(lakehouse, "ROW_GROUP_ROWS", 10)
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    path = str(tmp_path / ".t0-a0-s0.parquet.inprogress")
    w = lakehouse.StagedWriter(path, schema)
    rows = []
    for start in range(0, 34, 4):
        batch = pa.RecordBatch.from_pylist(
            [{"k": k, "v": str(k)} for k in range(start, min(start + 4, 34))], schema=schema)
        rows += batch.to_pylist()
        w.add(batch)
    assert w.close() == 34
    f = pq.ParquetFile(path)
    assert f.read().to_pylist() == rows  # in order, each row once
    # a row group per 10 rows buffered or more, then the rest
    assert [f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)] \
        == [12, 12, 10]


def test_staged_writer_discard_deletes_the_file_and_errors_surface(tmp_path, monkeypatch):
    from lockgate.connectors import lakehouse

    monkeypatch.setattr(lakehouse, "ROW_GROUP_ROWS", 2)
    schema = pa.schema([("k", pa.int64())])
    path = tmp_path / ".t0-a0-s1.parquet.inprogress"
    w = lakehouse.StagedWriter(str(path), schema)
    w.add(pa.RecordBatch.from_pylist([{"k": 1}, {"k": 2}], schema=schema))
    w.add(pa.RecordBatch.from_pylist([{"k": 3}, {"k": 4}], schema=schema))  # waits for the 1st
    assert path.exists()
    w.discard()
    assert not path.exists() and not list(tmp_path.iterdir())

    other = pa.schema([("k", pa.string())])  # a batch the file's schema refuses
    bad = lakehouse.StagedWriter(str(path), schema)
    bad.add(pa.RecordBatch.from_pylist([{"k": "x"}, {"k": "y"}], schema=other))
    with pytest.raises((ValueError, pa.ArrowException)):
        bad.close()  # the background write's error, raised here
    assert not path.exists()
