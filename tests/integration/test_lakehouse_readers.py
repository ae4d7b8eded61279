"""The Delta and Iceberg tables that Lockgate writes are read as they are by
other engines: DuckDB (its ``delta`` and ``iceberg`` extensions:
``delta_scan``, ``iceberg_scan``), Polars (``read_delta``, ``scan_iceberg``)
and Spark.

The tables: a merged change stream (updates, deletes, a row moving between
partitions) into a table partitioned by ``region``, and an appended one,
for each format; written by a Lockgate job on the local launcher. Each
reader's rows must equal the expected rows exactly, types included.

Spark: the Delta Lake and Iceberg connectors of Spark are JVM packages
(``delta-spark``, ``iceberg-spark-runtime``) that Spark fetches from Maven,
which this machine cannot reach. Spark reads here the data files that the
table's own metadata names as current (Delta: ``DeltaTable.file_uris()``,
with the partition values from the Hive-style folders; Iceberg: the scan's
planned files), which is exactly the table only because these tables have
no deletion vectors, no column mapping and no delete files: the test checks
each of those before it reads.
"""

from __future__ import annotations

import datetime
import importlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import DeltaSink, IcebergSink, SequenceSource

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

N = 600
KEYS = 90
REGIONS = ["eu", "us", "apac"]
T0 = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("region", pa.string()),
                    ("amount", pa.float64()), ("at", pa.timestamp("us", tz="UTC")),
                    ("version", pa.int32()), ("deleted", pa.bool_())])
APPEND = pa.schema([("x", pa.int64()), ("region", pa.string()), ("half", pa.float64())])


def change(x: int) -> dict:
    """Change x of key x % KEYS: its region moves each round; the keys below 10
    are deleted in the last round."""
    key, round_ = x % KEYS, x // KEYS
    return {"id": key, "name": f"customer {key}", "region": REGIONS[(key + round_) % 3],
            "amount": x / 4, "at": T0 + datetime.timedelta(seconds=x), "version": round_,
            "deleted": round_ == N // KEYS and key < 10}


def expected() -> list[tuple]:
    last: dict[int, dict] = {}
    for x in range(1, N + 1):
        last[x % KEYS] = change(x)
    return sorted(tuple(r[c] for c in SCHEMA.names if c != "deleted")
                  for r in last.values() if not r["deleted"])


def expected_appended() -> list[tuple]:
    return sorted((x, REGIONS[x % 3], x / 2) for x in range(1, N + 1))


def catalog(tmp: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
            "warehouse": f"file://{tmp}/warehouse"}


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    """The four tables, written by one Lockgate job."""
    tmp = tmp_path_factory.mktemp("readers")
    merge: dict[str, Any] = {"mode": "merge", "key": "id", "delete_column": "deleted",
                             "schema": SCHEMA, "partition_by": ["region"]}
    p = Pipeline("readers", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")))
    numbers = p.source(SequenceSource(1, N, rate=200), uid="numbers")
    changes = numbers.map(change, uid="changes").key_by(lambda r: r["id"]) \
        .reduce(lambda a, b: b if b["version"] > a["version"] else a, uid="latest")
    changes.sink(DeltaSink(str(tmp / "delta_merged"), **merge), uid="delta-merged")
    changes.sink(IcebergSink("lake.merged", catalog(tmp), **merge), uid="iceberg-merged")
    rows = numbers.map(lambda x: {"x": x, "region": REGIONS[x % 3], "half": x / 2}, uid="rows")
    rows.sink(DeltaSink(str(tmp / "delta_appended"), schema=APPEND), uid="delta-appended")
    rows.sink(IcebergSink("lake.appended", catalog(tmp), schema=APPEND), uid="iceberg-appended")
    result = p.run(launcher="local")
    assert result.status == "finished" and len(result.completed_checkpoints) > 2
    return tmp


def iceberg(tmp: Path, name: str) -> Any:
    from pyiceberg.catalog import load_catalog
    return load_catalog("lockgate", **catalog(tmp)).load_table(f"lake.{name}")


def rows_of(table: pa.Table, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in table.select(columns).to_pylist())


MERGED = [c for c in SCHEMA.names if c != "deleted"]


def check(merged: pa.Table, appended: pa.Table) -> None:
    """A reader's two tables: the expected rows and the written types."""
    assert rows_of(merged, MERGED) == expected()
    assert rows_of(appended, APPEND.names) == expected_appended()
    for name in MERGED:
        assert logical(merged.schema.field(name).type) == logical(SCHEMA.field(name).type), \
            (name, merged.schema.field(name).type)


def logical(t: pa.DataType) -> Any:
    """The type as a reader may spell it: a string (large or not), a UTC
    timestamp (``UTC`` or ``Etc/UTC``) with its unit, or the type itself."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_timestamp(t):
        return ("timestamp", t.unit, "UTC" if t.tz in ("UTC", "Etc/UTC", "+00:00") else t.tz)
    return t


# ---------------------------------------------------------------- DuckDB


@pytest.fixture(scope="module")
def duckdb_con() -> Any:
    """A DuckDB connection with the delta, avro and iceberg extensions loaded
    from their PyPI packages (DuckDB's own signed builds; no download)."""
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    version = con.sql("PRAGMA version").fetchone()[0]
    for name in ("avro", "delta", "iceberg"):  # iceberg needs avro
        module = importlib.import_module(f"duckdb_extension_{name}")
        path = Path(module.__file__).parent / "extensions" / version / f"{name}.duckdb_extension"
        assert path.exists(), f"duckdb-extension-{name} does not match DuckDB {version}"
        con.execute(f"LOAD '{path}'")
    yield con
    con.close()


def duck(con: Any, sql: str) -> pa.Table:
    """The result of ``sql`` as an Arrow table."""
    result = con.sql(sql).arrow()
    return result.read_all() if isinstance(result, pa.RecordBatchReader) else result


def test_duckdb_reads_the_delta_tables(tables, duckdb_con):
    check(duck(duckdb_con, f"SELECT * FROM delta_scan('{tables}/delta_merged')"),
          duck(duckdb_con, f"SELECT * FROM delta_scan('{tables}/delta_appended')"))


def test_duckdb_reads_the_iceberg_tables(tables, duckdb_con):
    def scan(name: str) -> pa.Table:
        location = iceberg(tables, name).metadata_location
        return duck(duckdb_con, f"SELECT * FROM iceberg_scan('{location}')")

    check(scan("merged"), scan("appended"))


# ---------------------------------------------------------------- Polars


def test_polars_reads_the_delta_and_iceberg_tables(tables, monkeypatch):
    pl = pytest.importorskip("polars")
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    check(pl.read_delta(str(tables / "delta_merged")).to_arrow(),
          pl.read_delta(str(tables / "delta_appended")).to_arrow())
    check(pl.scan_iceberg(iceberg(tables, "merged")).collect().to_arrow(),
          pl.scan_iceberg(iceberg(tables, "appended")).collect().to_arrow())


# ---------------------------------------------------------------- Spark


@pytest.fixture(scope="module")
def spark() -> Any:
    from tests.integration.spark_session import fresh_spark_session

    session = fresh_spark_session(2, "lakehouse-readers",
                                  **{"spark.sql.session.timeZone": "UTC"})
    yield session
    session.stop()


def spark_rows(df: Any, columns: list[str]) -> pa.Table:
    """A Spark DataFrame's rows as an Arrow table of ``columns``."""
    table: pa.Table = df.select(*columns).toArrow()
    return table


def test_spark_reads_the_delta_tables_data_files(tables, spark):
    """The data files the Delta log names as current, partition values from
    their folders: the table, since it has no deletion vectors and no column
    mapping (checked)."""
    got = {}
    for name, columns in (("delta_merged", MERGED), ("delta_appended", APPEND.names)):
        table = deltalake.DeltaTable(str(tables / name))
        protocol = table.protocol()
        assert protocol.min_reader_version == 1, protocol  # no DVs, no column mapping
        assert "delta.columnMapping.mode" not in table.metadata().configuration
        files = table.file_uris()
        df = spark.read.option("basePath", str(tables / name)).parquet(*files)
        got[name] = spark_rows(df, columns)
    assert rows_of(got["delta_merged"], MERGED) == expected()
    assert rows_of(got["delta_appended"], APPEND.names) == expected_appended()


def test_spark_reads_the_iceberg_tables_data_files(tables, spark):
    """The data files an Iceberg scan of the current snapshot plans: the
    table, since the merges wrote no delete files (checked)."""
    got = {}
    for name, columns in (("merged", MERGED), ("appended", APPEND.names)):
        tasks = list(iceberg(tables, name).scan().plan_files())
        assert tasks and not any(t.delete_files for t in tasks)
        df = spark.read.parquet(*[t.file.file_path for t in tasks])
        got[name] = spark_rows(df, columns)
    assert rows_of(got["merged"], MERGED) == expected()
    assert rows_of(got["appended"], APPEND.names) == expected_appended()
