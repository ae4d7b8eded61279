"""The Arrow path in whole jobs: the example as a user runs it, a rescale
through savepoints (keyed Arrow state and Parquet positions dealt out again),
and a Spark DataFrame read as record batches on the Spark launcher."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, SequenceSource
from tests.fault.arrow_sums_job import build, check_output, write_input
from tests.fixtures import committed_lines, start_and_await
from tests.integration.arrow_diagnosis import check_current, diagnose, latest_per_user
from tests.integration.spark_session import fresh_spark_session
from tests.integration.test_examples import run_example


@pytest.mark.parametrize("way", ["python", "lockgate run"])
def test_arrow_example(tmp_path, way):
    n = 30_000
    out = run_example(way, "arrow_sums.py", [str(n)], tmp_path)
    if way == "python":
        assert "guarantee exactly_once" in out.stdout, out.stdout
    seen = sorted(p.name for p in (tmp_path / "out").iterdir())  # as read, hidden ones too
    table = pq.read_table(tmp_path / "out")
    current = latest_per_user(table)
    wrong = check_current(current, n)
    assert wrong is None, (f"read {seen}: user {wrong} (orders, total) = {current.get(wrong)}\n"
                           + diagnose(tmp_path, out.stdout, wrong))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_arrow_state_and_positions_rescale_through_savepoints(tmp_path: Path, monkeypatch,
                                                              backend: str):
    """2 -> 3 -> 2 tasks, each hop stopped with a savepoint while the input is
    half read: the copy holds every row once, each key's aggregates are exact;
    with the state on either backend."""
    monkeypatch.setenv("LOCKGATE_STATE_BACKEND", backend)
    n, keys = 60_000, 7
    write_input(tmp_path / "in", n)

    def job(parallelism: int, held: bool = True) -> Pipeline:
        # held: each task of a hop reads at most 7,500 rows (and a batch),
        # so no hop can end before its stop, however slow the machine (at
        # most 42,000 of 60,000 in all); the last job reads the rest
        return build(str(tmp_path / "in"), parallelism, keys, str(tmp_path / "out"),
                     str(tmp_path / "copy"), str(tmp_path / "chk"), 0.2, 12_000, 500,
                     held=7_500 if held else None)

    savepoint = None
    for parallelism in (2, 3):
        client = start_and_await(job(parallelism), launcher="local", from_savepoint=savepoint,
                                 until=lambda pr: pr.records_read > 5_000)
        result = client.stop(str(tmp_path / "savepoints"))
        assert result.status == "stopped", result
        savepoint = result.savepoint
    final = job(2, held=False).run(launcher="local", from_savepoint=savepoint)
    assert final.status == "finished", final
    check_output(tmp_path / "out", tmp_path / "copy", n, keys, in_commit_order=False)


def test_dataframe_read_as_record_batches_on_spark(tmp_path: Path):
    spark = fresh_spark_session(4, "arrow-dataframe")
    try:
        n, keys = 20_000, 9
        df = spark.range(1, n + 1, numPartitions=4).withColumnRenamed("id", "x")
        p = Pipeline("arrow-df", parallelism=2,
                     checkpoint=CheckpointConfig(interval=0.5, storage=str(tmp_path / "chk")))
        (p.source_arrow(df, uid="numbers", batch_rows=3000)
           .map_arrow(lambda b: b.append_column("k", pc.remainder(b["x"], keys)), uid="keys")
           .key_by_column("k")
           .aggregate_arrow(total=("x", "sum"), n=("x", "count"), uid="sums")
           .sink(FileSink(str(tmp_path / "out"), format="parquet"), uid="out"))
        result = p.run(launcher="spark", spark=spark)
        assert result.status == "finished" and result.records_in == n, result
        got = pq.read_table(tmp_path / "out").group_by("k").aggregate(
            [("total", "max"), ("n", "max")])
        final = dict(zip(got.column("k").to_pylist(),
                         zip(got.column("n_max").to_pylist(), got.column("total_max").to_pylist(),
                             strict=True), strict=True))
        assert final == {k: (len(range(k or keys, n + 1, keys)), sum(range(k or keys, n + 1, keys)))
                         for k in range(keys)}
    finally:
        spark.stop()


def test_rows_to_arrow_and_back(tmp_path: Path):
    """Rows become batches (``to_arrow``), are aggregated, and go to a JSONL
    sink as they are (the sink takes their rows) and through ``to_rows``
    into a row operator: both outputs exact, on the local launcher."""
    n, keys = 30_000, 5
    p = Pipeline("rows-arrow-rows", parallelism=2, batch_size=256,
                 checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp_path / "chk")))
    sums = (p.source(SequenceSource(1, n), uid="numbers")
              .map(lambda x: {"k": x % keys, "x": x}, uid="dicts")
              .to_arrow(uid="batches")
              .key_by_column("k")
              .aggregate_arrow(total=("x", "sum"), n=("x", "count"), uid="sums"))
    sums.sink(FileSink(str(tmp_path / "direct"), format="jsonl"), uid="direct")
    (sums.to_rows(uid="rows")
         .map(lambda r: [r["k"], r["n"], r["total"]], uid="triples")
         .sink(FileSink(str(tmp_path / "triples"), format="jsonl"), uid="triples-out"))
    result = p.run(launcher="local")
    assert result.status == "finished", result
    want = {k: (len(range(k or keys, n + 1, keys)), sum(range(k or keys, n + 1, keys)))
            for k in range(keys)}
    direct: dict[int, tuple[int, int]] = {}
    for r in committed_lines(tmp_path / "direct"):
        direct[r["k"]] = max(direct.get(r["k"], (0, 0)), (r["n"], r["total"]))
    triples: dict[int, tuple[int, int]] = {}
    for k, count, total in committed_lines(tmp_path / "triples"):
        triples[k] = max(triples.get(k, (0, 0)), (count, total))
    assert direct == want and triples == want
