"""PySpark interop on real Spark (local mode, one session for the module): a
DataFrame as a source, Parquet output read by Spark while the job runs, keyed
state read as a DataFrame, and a savepoint bootstrapped from a DataFrame —
each checked against the same computation in Spark SQL."""

from __future__ import annotations

import os
import pickle
import queue
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, FixedDelayRestart, Pipeline
from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata, StateHandle
from lockgate.connectors import FileSink, SequenceSource
from lockgate.connectors import dataframe as dataframe_source
from lockgate.errors import (
    CheckpointCorruptError,
    LockgateError,
    PipelineDefinitionError,
)
from lockgate.spark import StateNotFoundError, read_state, write_savepoint
from lockgate.spark.schema import merge_signatures, to_json_text, value_signature
from lockgate.state.serde import StateSerializationError, StateSerializer
from tests.fixtures import check_running_sums, hidden_files
from tests.integration.spark_session import fresh_spark_session

SLOTS = 6  # a job at parallelism 2 has 4 tasks: 2 slots stay free for Spark reads
N = 20_000
KEYS = 5
PARTITIONS = 4


@pytest.fixture(scope="module")
def spark():
    session = fresh_spark_session(SLOTS, "lockgate-interop", log_level="OFF",  # quiet errors
                                  **{"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def numbers(spark):
    """x = 1..N over 4 partitions, key k = x % KEYS (the fault suite's sums)."""
    return spark.range(1, N + 1, numPartitions=PARTITIONS).selectExpr(
        f"id % {KEYS} AS k", "id AS x")


def _sums_pipeline(source_df, out: Path, chk: Path, parallelism: int = 2) -> Pipeline:
    p = Pipeline("df-sums", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(chk)),
                 restart=FixedDelayRestart(max_attempts=3, delay_s=0.0))
    (p.source_dataframe(source_df, uid="numbers")
       .map(lambda r: {"k": r["k"], "v": r["x"]}, uid="pairs")
       .key_by(lambda r: r["k"])
       .reduce(lambda a, b: {"k": a["k"], "v": a["v"] + b["v"]}, uid="sums")
       .sink(FileSink(str(out), format="parquet"), uid="out"))
    return p


def _sql_sums(df) -> dict[int, int]:
    return {r["k"]: r["total"] for r in df.groupBy("k").sum("x")
            .withColumnRenamed("sum(x)", "total").collect()}


@pytest.fixture(scope="module")
def sums_run(spark, numbers, tmp_path_factory):
    """(a)'s job, run once on the spark launcher: (result, output folder)."""
    tmp = tmp_path_factory.mktemp("sums")
    p = _sums_pipeline(numbers, tmp / "out", tmp / "chk")
    result = p.run(launcher="spark", spark=spark)
    return result, tmp / "out"


# ---------------------------------------------------------------- (a) source


def test_dataframe_source_to_parquet_matches_spark_sql(spark, numbers, sums_run) -> None:
    result, out = sums_run
    assert result.status == "finished" and result.restarts == 0
    assert (result.records_in, result.records_out) == (N, N)
    # the DataFrame was materialized once, a file per Spark partition
    inputs = Path(result.latest_checkpoint).parent / "inputs" / "numbers"
    assert sorted(os.listdir(inputs)) == (
        [dataframe_source.MARKER] + [f"part-{i:05d}.parquet" for i in range(PARTITIONS)])
    # Spark reads every running sum back, with exact types
    got = spark.read.parquet(str(out))
    assert dict(got.dtypes) == {"k": "bigint", "v": "bigint"}
    rows = got.collect()
    check_running_sums([[r.k, r.v] for r in rows], N, KEYS)
    # the last running sum per key is SQL's sum per key
    last = {r["k"]: r["last"] for r in got.groupBy("k").max("v")
            .withColumnRenamed("max(v)", "last").collect()}
    assert last == _sql_sums(numbers)
    assert hidden_files(out) == []


def test_spark_part_files_get_deterministic_names() -> None:
    spark_names = ["_SUCCESS", ".part-00003-ab12-c000.snappy.parquet.crc",
                   "part-00003-ab12-c000.snappy.parquet", "part-00000-ab12-c000.snappy.parquet"]
    assert dataframe_source.plan_part_names(spark_names) == [
        ("part-00000-ab12-c000.snappy.parquet", "part-00000.parquet"),
        ("part-00003-ab12-c000.snappy.parquet", "part-00003.parquet")]
    # a partition written as several files (maxRecordsPerFile): name order = row order
    assert [d for _, d in dataframe_source.plan_part_names(
        ["part-00001-x-c001.parquet", "part-00001-x-c000.parquet", "part-00000-x-c000.parquet"])
    ] == ["part-00000-c000.parquet", "part-00001-c000.parquet", "part-00001-c001.parquet"]
    with pytest.raises(LockgateError, match="unexpected file 'k=1'"):
        dataframe_source.plan_part_names(["k=1"])


def test_source_dataframe_takes_a_table_and_refuses_what_cannot_work(spark, numbers) -> None:
    numbers.createOrReplaceTempView("interop_numbers")
    source = dataframe_source.DataFrameSource("interop_numbers", spark=spark)
    assert source._df.count() == N and "interop_numbers" in repr(source)
    assert pickle.loads(pickle.dumps(source))._df is None  # tasks get the path only
    with pytest.raises(PipelineDefinitionError, match="occur more than once"):
        dataframe_source.DataFrameSource(numbers.select("k", "k")).validate()
    with pytest.raises(PipelineDefinitionError, match="not a Spark DataFrame"):
        Pipeline("nope").source_dataframe([1, 2, 3])


# ------------------------------------------------- (b) reading while it runs


def test_spark_reads_only_committed_output_while_the_job_runs(spark, tmp_path: Path) -> None:
    n, out = 60_000, tmp_path / "out"
    p = Pipeline("live", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.25, storage=str(tmp_path / "chk")))
    (p.source(SequenceSource(1, n, rate=20_000), uid="numbers")
       .map(lambda x: {"k": x % KEYS, "v": x}, uid="pairs")
       .key_by(lambda r: r["k"])
       .reduce(lambda a, b: {"k": a["k"], "v": a["v"] + b["v"]}, uid="sums")
       .sink(FileSink(str(out), format="parquet"), uid="out"))
    completed: queue.Queue[int] = queue.Queue()
    client = p.start(launcher="spark", spark=spark,
                     on_progress=lambda pr: completed.put(pr.checkpoints_completed))
    snapshots: list[list[tuple[int, int]]] = []
    while True:
        try:
            completed.get(timeout=1.0)
        except queue.Empty:
            if client.status()["status"] not in ("created", "running"):
                break
            continue
        while not completed.empty():  # read once for a burst of checkpoints
            completed.get_nowait()
        df = spark.read.schema("k long, v long").parquet(str(out))
        files = [f.rsplit("/", 1)[-1] for f in df.inputFiles()]
        assert all(f.startswith("part-") and f.endswith(".parquet") for f in files), files
        snapshots.append([(r.k, r.v) for r in df.collect()])
    result = client.result(timeout=60)
    assert result.status == "finished" and result.records_in == n
    final = [(r.k, r.v) for r in spark.read.parquet(str(out)).collect()]
    check_running_sums([list(r) for r in final], n, KEYS)
    # while running, Spark saw a growing prefix of each key's committed sums
    by_key: dict[int, list[int]] = defaultdict(list)
    for k, v in final:
        by_key[k].append(v)
    for k in by_key:
        by_key[k].sort()
    seen = [len(s) for s in snapshots]
    assert seen == sorted(seen), "a later read saw fewer records"
    assert sum(0 < c < n for c in seen) >= 2, f"too few reads while running: {seen}"
    for snap in snapshots:
        mine: dict[int, list[int]] = defaultdict(list)
        for k, v in snap:
            mine[k].append(v)
        for k, sums in mine.items():
            assert sorted(sums) == by_key[k][:len(sums)], f"key {k}: not a committed prefix"


# ------------------------------------------------------------ (c) read_state


def test_read_state_equals_spark_sql(spark, numbers, sums_run) -> None:
    result, _ = sums_run
    state = read_state(spark, result.latest_checkpoint, uid="sums", state_name="reduce")
    assert state.schema.simpleString() == (
        "struct<key:bigint,state:string,value:struct<k:bigint,v:bigint>>")
    rows = state.collect()
    assert {r.state for r in rows} == {"reduce"}
    assert {r.key: r.value.v for r in rows} == _sql_sums(numbers)
    assert all(r.key == r.value.k for r in rows)
    # the same comparison as a Spark query: nothing differs either way
    expected = numbers.groupBy("k").sum("x").toDF("key", "v")
    got = state.select("key", "value.v")
    assert got.exceptAll(expected).count() == 0 and expected.exceptAll(got).count() == 0


def test_state_values_are_typed_or_json_text() -> None:
    sig = "null"
    for v in ({"a": 1, "b": "x"}, {"a": 2, "b": None}):
        sig = merge_signatures(sig, value_signature(v))
    assert sig == ("struct", (("a", "long"), ("b", "string")))
    assert merge_signatures(value_signature({"a": 1}), value_signature({"b": 2})) == (
        "map", "string", "long")
    assert merge_signatures(value_signature([1, None]), value_signature([])) == ("array", "long")
    assert merge_signatures(value_signature(1), value_signature(1.5)) == "json"
    assert value_signature((1, 2)) == "json" and value_signature(1 << 64) == "json"
    assert to_json_text((1, "a", {2: b"\x00"})) == '[1, "a", [[2, "AA=="]]]'
    assert to_json_text({3, 1, 2}) == "[1, 2, 3]"


# ------------------------------------------------------- (d) write_savepoint


def test_bootstrapped_savepoint_resumes_into_the_expected_sums(
        spark, numbers, tmp_path: Path, monkeypatch) -> None:
    """Initial sums per key written as a savepoint (3 state files); a job at
    parallelism 2 on the local launcher starts from it, loses a task once,
    and replays the same materialized input: every committed running sum
    starts from the bootstrapped value."""
    base = {k: 1_000_000 * (k + 1) for k in range(KEYS)}
    initial = spark.createDataFrame([(k, v) for k, v in base.items()], "k long, v long")
    sp = write_savepoint(spark, initial, str(tmp_path / "bootstrap"), uid="sums",
                         state_name="reduce", key="k", parallelism=3)
    meta = storage.read_metadata(sp)
    assert meta.kind == "savepoint" and meta.operators["sums"].parallelism == 3
    assert not os.path.exists(os.path.join(sp, ".bootstrap-input"))
    back = read_state(spark, sp, "sums", "reduce").collect()
    assert {r.key: (r.value.k, r.value.v) for r in back} == {k: (k, v) for k, v in base.items()}

    calls: list[str] = []
    original = dataframe_source.materialize_dataframe

    def counting(df, folder):
        calls.append(folder)
        return original(df, folder)

    monkeypatch.setattr(dataframe_source, "materialize_dataframe", counting)
    out = tmp_path / "out"
    p = _sums_pipeline(numbers, out, tmp_path / "chk")
    result = p.run(launcher="local", from_savepoint=sp,
                   fault_injection=[{"point": "batch", "task": 0, "attempt": 0, "count": 3}])
    assert result.status == "finished" and result.restarts == 1
    assert len(calls) == 1, "a restart materialized the DataFrame again"
    rows = [(r.k, r.v) for r in spark.read.parquet(str(out)).collect()]
    check_running_sums([[k, v - base[k]] for k, v in rows], N, KEYS)
    last: dict[int, int] = {}
    for k, v in rows:
        last[k] = max(last.get(k, v), v)
    assert last == {k: base[k] + s for k, s in _sql_sums(numbers).items()}


def test_write_savepoint_refuses_duplicate_keys_and_existing_folders(
        spark, tmp_path: Path) -> None:
    dupes = spark.createDataFrame([(1, 10), (1, 20)], "k long, v long")
    with pytest.raises(LockgateError, match="occurs in more than one row.*groupBy"):
        write_savepoint(spark, dupes, str(tmp_path / "sp"), "sums", "reduce", key="k")
    with pytest.raises(LockgateError, match="'nope' is not a column"):
        write_savepoint(spark, dupes, str(tmp_path / "sp2"), "sums", "reduce", key="nope")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(LockgateError, match="already exists"):
        write_savepoint(spark, dupes, str(tmp_path / "full"), "sums", "reduce", key="k")


# ------------------------------------------------------- (e) read_state errors


def test_read_state_errors_name_the_problem_and_the_fix(spark, sums_run, tmp_path) -> None:
    result, _ = sums_run
    chk = result.latest_checkpoint
    with pytest.raises(StateNotFoundError) as info:
        read_state(spark, chk, "no-such-op", "reduce")
    assert "'no-such-op'" in str(info.value)
    assert "['numbers', 'out', 'pairs', 'sums']" in str(info.value)
    with pytest.raises(StateNotFoundError) as info:
        read_state(spark, chk, "sums", "count")
    assert "'count'" in str(info.value) and "['reduce']" in str(info.value)
    with pytest.raises(StateNotFoundError, match="no keyed state"):
        read_state(spark, chk, "numbers", "reduce")
    # a folder without _metadata: a job's folder, an incomplete copy, nothing
    with pytest.raises(CheckpointCorruptError, match="job's checkpoint folder.*chk-"):
        read_state(spark, str(Path(chk).parent), "sums", "reduce")
    broken = tmp_path / "chk-9"
    shutil.copytree(chk, broken)
    (broken / storage.METADATA).unlink()
    with pytest.raises(CheckpointCorruptError, match="has no _metadata.*never completed"):
        read_state(spark, str(broken), "sums", "reduce")
    with pytest.raises(CheckpointCorruptError, match="does not exist"):
        read_state(spark, str(tmp_path / "missing"), "sums", "reduce")


def test_read_state_never_unpickles(spark, tmp_path: Path) -> None:
    """State of a job that opted in to pickle is refused, not executed."""
    sp = tmp_path / "pickled"
    sp.mkdir()
    blob = StateSerializer(allow_pickle=True).dumps([7, {"reduce": [[1, _Opaque()]]}])
    size, crc = storage.write_state_file(str(sp), "sums-0.state", lambda out: out.write(blob))
    handle = StateHandle("sums-0.state", size, crc, 0, {7: (0, len(blob))}, {"reduce": "value"})
    storage.write_metadata(str(sp), CheckpointMetadata(
        job_id="pickled", checkpoint_id=1, kind=CheckpointKind.SAVEPOINT, timestamp=0.0,
        final=False, max_parallelism=128,
        operators={"sums": OperatorMetadata(1, OperatorStateMode.SPLIT, [handle])}))
    with pytest.raises(StateSerializationError, match="pickled.*never unpickles"):
        read_state(spark, str(sp), "sums", "reduce")


class _Opaque:
    """Any object only pickle can store."""
