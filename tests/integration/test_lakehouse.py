"""Delta and Iceberg sinks end to end on the ``local`` launcher: merge with
deletes, Arrow batches straight in, a given schema, the checks at start, and
tables on S3 (a moto server) with a kill in the middle of a commit. Tables are
read back with delta-rs and pyiceberg."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import DeltaSink, FileSource, IcebergSink, SequenceSource
from lockgate.errors import ConfigurationError
from tests.integration.test_s3_storage import KEY, S3, SECRET

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")


def _catalog(tmp: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
            "warehouse": f"file://{tmp}/warehouse"}


def _sink(kind: str, tmp: Path, **kw):
    if kind == "delta":
        return DeltaSink(str(tmp / "table"), **kw)
    return IcebergSink("lake.t", _catalog(tmp), **kw)


def _rows(kind: str, tmp: Path) -> list[dict]:
    if kind == "delta":
        return deltalake.DeltaTable(str(tmp / "table")).to_pyarrow_table().to_pylist()
    from pyiceberg.catalog import load_catalog
    table = load_catalog("lockgate", **_catalog(tmp)).load_table("lake.t")
    return table.scan().to_arrow().to_pylist()


def change(x: int) -> dict:
    """Key x % 50: inserted, updated, and deleted when x % 50 < 10 in the last round."""
    return {"id": x % 50, "v": x, "gone": x > 150 and x % 50 < 10}


def halves(b: pa.RecordBatch) -> pa.RecordBatch:
    ids = b.column("id")
    return pa.RecordBatch.from_arrays([ids, pc.divide(ids.cast(pa.float64()), 2)],
                                      names=["id", "half"])


def latest(a: dict, b: dict) -> dict:
    """The change of the larger x (the sources' interleaving is undone)."""
    return b if b["v"] > a["v"] else a


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_merge_with_deletes(tmp_path, kind):
    p = Pipeline("merge", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 200, rate=100), uid="numbers")
       .map(change, uid="changes").key_by(lambda r: r["id"])
       .reduce(latest, uid="latest")
       .sink(_sink(kind, tmp_path, mode="merge", key="id", delete_column="gone"), uid="lake"))
    result = p.run(launcher="local")
    assert result.status == "finished"
    assert len(result.completed_checkpoints) > 1
    got = sorted((r["id"], r["v"]) for r in _rows(kind, tmp_path))
    assert got == [(k, 150 + k) for k in range(10, 50)]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_arrow_batches_with_a_given_schema(tmp_path, kind):
    schema = pa.schema([("id", pa.int64()), ("half", pa.float64())])
    p = Pipeline("arrow", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (tmp_path / "in").mkdir()
    ids = pa.array(range(1, 5001), pa.int32())  # cast to the given schema's int64
    for part in range(2):
        pq.write_table(pa.table({"id": ids.filter(pc.equal(pc.bit_wise_and(ids, 1), part))}),
            str(tmp_path / "in" / f"{part}.parquet"))
    (p.source_arrow(FileSource(str(tmp_path / "in"), format="parquet"), uid="numbers")
       .map_arrow(halves, uid="halves")
       .sink(_sink(kind, tmp_path, schema=schema), uid="lake"))
    assert p.run(launcher="local").status == "finished"
    rows = _rows(kind, tmp_path)
    assert sorted(r["id"] for r in rows) == list(range(1, 5001))
    assert all(r["half"] == r["id"] / 2 for r in rows)


def test_settings_are_checked(tmp_path):
    with pytest.raises(ConfigurationError, match="key="):
        DeltaSink(str(tmp_path), mode="merge")
    with pytest.raises(ConfigurationError, match="unknown mode"):
        IcebergSink("a.b", _catalog(tmp_path), mode="upsert")
    with pytest.raises(ConfigurationError, match="namespace"):
        IcebergSink("b", _catalog(tmp_path))
    with pytest.raises(ConfigurationError, match="not a local"):
        IcebergSink("a.b", {"type": "sql", "uri": "sqlite:///x.db",
                            "warehouse": "s3://bucket/w"})
    with pytest.raises(ConfigurationError, match="delete_column"):
        DeltaSink(str(tmp_path), delete_column="gone")


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_partitioned_merge_moves_a_row_between_partitions(tmp_path, kind):
    """A row whose partition column changes leaves its old partition; an
    existing table's partitioning is checked against the sink's."""
    def row(x: int) -> dict:  # key x % 20; its partition moves at each round
        return {"id": x % 20, "v": x, "part": (x // 20) % 3, "gone": x > 80 and x % 20 < 4}

    def job(**kw) -> Pipeline:
        p = Pipeline("parts", parallelism=2,
                     checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
        (p.source(SequenceSource(1, 100, rate=300), uid="numbers")
           .map(row, uid="rows").key_by(lambda r: r["id"])
           .reduce(latest, uid="latest")
           .sink(_sink(kind, tmp_path, mode="merge", key="id", delete_column="gone", **kw),
                 uid="lake"))
        return p

    assert job(partition_by=["part"]).run(launcher="local").status == "finished"
    got = sorted((r["id"], r["v"], r["part"]) for r in _rows(kind, tmp_path))
    assert got == [(k, 80 + k, (80 + k) // 20 % 3) for k in range(4, 20)]
    with pytest.raises(ConfigurationError, match=r"partitioned by \['part'\], the sink by"):
        _sink(kind, tmp_path, mode="merge", key="id", partition_by=["v"]).validate()
    _sink(kind, tmp_path, mode="merge", key="id").validate()  # the table's own partitioning


def test_partition_settings_are_checked(tmp_path):
    with pytest.raises(ConfigurationError, match="delete marker"):
        DeltaSink(str(tmp_path), mode="merge", key="id", delete_column="gone",
                  partition_by="gone")
    with pytest.raises(ConfigurationError, match="twice"):
        IcebergSink("a.b", _catalog(tmp_path), partition_by=["p", "p"])
    with pytest.raises(ConfigurationError, match="lacks the partition column"):
        DeltaSink(str(tmp_path), schema=pa.schema([("id", pa.int64())]), partition_by=["p"])


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_given_schema_must_have_the_key_and_delete_columns(tmp_path, kind):
    """Both sinks refuse a schema without the key or the delete marker at
    once, naming the missing columns and the fix."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    for key, delete_column, missing in (("k", None, ["k"]), ("id", "gone", ["gone"]),
                                        (["k", "id"], "gone", ["k", "gone"])):
        with pytest.raises(ConfigurationError) as e:
            _sink(kind, tmp_path, mode="merge", key=key, delete_column=delete_column,
                  schema=schema)
        sink = "DeltaSink" if kind == "delta" else "IcebergSink"
        assert str(e.value) == (f"{sink}: the schema lacks the column(s) {missing}; add them "
                                "or fix key/delete_column")
    _sink(kind, tmp_path, mode="merge", key="id", delete_column="v", schema=schema)


# ---------------------------------------------------------------- on S3


@pytest.fixture(scope="module")
def s3_process():
    """A moto S3 server in its own process (delta-rs holds the GIL while it
    waits for an answer: a server thread in this process would never give it)."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no moto server"
                time.sleep(0.1)  # a port to wait for: no event to await
        yield S3("127.0.0.1", port)
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def s3(s3_process, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_process



@pytest.mark.parametrize("kind", ["delta", "iceberg"])
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_on_s3_exactly_once_under_a_kill(tmp_path, s3, kind, mode):
    """Table and staging on S3 (a moto server on loopback): a kill of the
    committer in the middle of its commit (files copied, table commit not
    made), then the table holds every row once and no staged file is left."""
    bucket = s3.bucket()
    kw = {"mode": "merge", "key": "id"} if mode == "merge" else {}
    staging = s3.url(bucket, "staging")
    if kind == "delta":
        options = {"AWS_ENDPOINT_URL": f"http://{s3.endpoint}", "AWS_ACCESS_KEY_ID": KEY,
                   "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                   "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
        sink = DeltaSink(f"s3://{bucket}/table", storage_options=options, staging=staging,
                         **kw)
    else:
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                   "warehouse": f"s3://{bucket}/warehouse",
                   "s3.endpoint": f"http://{s3.endpoint}", "s3.access-key-id": KEY,
                   "s3.secret-access-key": SECRET, "s3.region": "us-east-1"}
        sink = IcebergSink("lake.t", catalog, staging=staging, **kw)
    p = Pipeline("s3", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, 3000, rate=3000), uid="numbers")
       .map(lambda x: {"id": x, "k": x % 7}, uid="rows")
       .sink(sink, uid="lake"))
    result = p.run(launcher="local", fault_injection=[
        {"point": "table_commit", "task": 0, "attempt": 0, "count": 1}])
    assert result.status == "finished" and result.restarts == 1, result.failures
    if kind == "delta":
        rows = deltalake.DeltaTable(f"s3://{bucket}/table",
                                    storage_options=options).to_pyarrow_table()
    else:
        from pyiceberg.catalog import load_catalog
        rows = load_catalog("lockgate", **catalog).load_table("lake.t").scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(1, 3001))
    staged = [k for k in s3.keys(bucket)
              if k.startswith("staging/") and "probe" not in k and not k.endswith("/")]
    assert staged == [], staged
