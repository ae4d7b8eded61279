"""Every source deals its splits out again when a savepoint is restored at
another parallelism: p=2 -> 1 -> 3, each hop stopped with a savepoint while
the source is half read, every task of every hop reading, and the committed
running sums exact across the hops."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lockgate import CheckpointConfig, Pipeline
from lockgate.connectors import FileSink, FileSource, SequenceSource
from lockgate.connectors.dataframe import DataFrameSource
from lockgate.connectors.sequence import deal_splits
from tests.fault.held_source import HeldDataFrame, HeldFiles, HeldSequence
from tests.fixtures import (
    check_exact_sums,
    check_running_sums,
    committed_lines,
    operator_state,
    start_and_await,
)
from tests.integration.spark_session import fresh_spark_session

KEYS = 5
HOPS = (2, 1, 3)


def throttle(x):
    time.sleep(0.001)  # ~1,000 records/s a task: every hop stops part of the way
    return x


def build(tmp: Path, parallelism: int, source, key_of) -> Pipeline:
    p = Pipeline("rescale", parallelism=parallelism, batch_size=64,
                 checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")))
    (p.source(source, uid="numbers")
       .map(throttle, uid="slow")
       .map(lambda r: (key_of(r) % KEYS, key_of(r)), uid="pairs")
       .key_by(lambda kv: kv[0])
       .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
       .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
    return p


def source_entries(savepoint: str) -> list[list[dict]]:
    """The source's state entries per subtask of a savepoint."""
    return operator_state(savepoint, "numbers")


def hop(tmp: Path, parallelism: int, source, key_of, savepoint: str | None,
        done=None, drain: bool = False) -> str:
    """Run one hop until a checkpoint completed (or ``done()``), then stop with
    a savepoint (the next hop's restore commits what it pre-committed; a
    drain commits it at once); return it."""
    client = start_and_await(build(tmp, parallelism, source, key_of), launcher="local",
                             from_savepoint=savepoint)
    deadline = time.monotonic() + 120
    while done is not None and not done() and time.monotonic() < deadline:
        time.sleep(0.1)  # the committed output is polled: files, no event
    result = client.stop(str(tmp / "savepoints"), drain=drain)
    assert result.status == ("finished" if drain else "stopped"), result
    return result.savepoint


def ahead(x: int, splits: list[dict]) -> bool:
    return any(x >= s["next"] and (s["end"] is None or x <= s["end"])
               and (x - s["next"]) % s["step"] == 0 for s in splits)


def test_unbounded_sequence_scaled_2_1_3_reads_everything_once(tmp_path: Path) -> None:
    source = SequenceSource(1)
    savepoint = None
    for p in HOPS:
        before = ([s for entries in source_entries(savepoint) for s in entries]
                  if savepoint else None)
        # the last hop drains: its sinks commit everything it read
        savepoint = hop(tmp_path, p, source, lambda x: x, savepoint, drain=p == HOPS[-1])
        after = source_entries(savepoint)
        # every task of this hop read: its splits moved on from where it was dealt them
        for i in range(p):
            dealt = (deal_splits(before, i, p) if before
                     else [source.splits(p)[i]])
            assert dealt, f"task {i} of {p} got no split"
            moved = {s["split"]: s["next"] for s in after[i]}
            assert all(moved[s["split"]] > s["next"] for s in dealt), \
                f"task {i} of {p} did not read all its splits"
    left = [s for entries in source_entries(savepoint) for s in entries]
    top = max(s["next"] for s in left)
    read = [x for x in range(1, top) if not ahead(x, left)]
    assert len(read) > 1_000
    check_exact_sums(tmp_path / "out", 0, KEYS, inputs=read)


def test_bounded_sequence_scaled_2_1_3_is_exact(tmp_path: Path) -> None:
    n = 8_000
    # the hops read a held sequence: none can end before its stop, however
    # slow the machine; the last job reads the rest with the plain source
    held = HeldSequence(1, n)
    savepoint = None
    for p in HOPS:
        savepoint = hop(tmp_path, p, held, lambda x: x, savepoint)
        assert any(source_entries(savepoint)[i] for i in range(p))
    final = build(tmp_path, 2, SequenceSource(1, n), lambda x: x).run(
        launcher="local", from_savepoint=savepoint)
    assert final.status == "finished"
    check_running_sums(committed_lines(tmp_path / "out"), n, KEYS)


def write_files(folder: Path, first: int, files: int, per_file: int) -> int:
    """JSONL files of records ``{"i": n}``, numbered from ``first``; return the next."""
    folder.mkdir(exist_ok=True)
    n = first
    for _ in range(files):
        name = f"part-{n:07d}.jsonl"
        lines = [json.dumps({"i": i}) for i in range(n, n + per_file)]
        (folder / f".{name}").write_text("\n".join(lines) + "\n")
        (folder / f".{name}").rename(folder / name)  # visible at once, whole
        n += per_file
    return n


@pytest.mark.parametrize("watch", [False, True], ids=["bounded", "watching"])
def test_file_source_scaled_2_1_3_is_exact(tmp_path: Path, watch: bool) -> None:
    folder = tmp_path / "in"
    nxt = write_files(folder, 1, 40, 200)
    source = FileSource(str(folder), format="jsonl", watch=watch, poll_interval=0.1)
    # bounded: each task of a hop reads at most 600 records, so no hop can
    # end before its stop (at most 3,600 of 8,000 in all); the last job reads
    # the rest with the plain source
    held = source if watch else HeldFiles(str(folder), format="jsonl", most=600)
    savepoint = None
    for p in HOPS:
        savepoint = hop(tmp_path, p, held, lambda r: r["i"], savepoint)
        if watch:  # files keep arriving while the job runs at every parallelism
            nxt = write_files(folder, nxt, 4, 200)
    n = nxt - 1
    if watch:
        savepoint = hop(tmp_path, 2, source, lambda r: r["i"], savepoint,
                        done=lambda: len(committed_lines(tmp_path / "out")) >= n)
    else:
        final = build(tmp_path, 2, source, lambda r: r["i"]).run(launcher="local",
                                                                 from_savepoint=savepoint)
        assert final.status == "finished"
    check_running_sums(committed_lines(tmp_path / "out"), n, KEYS)


def test_dataframe_source_scaled_2_1_3_is_exact(tmp_path: Path) -> None:
    spark = fresh_spark_session(2, "source-rescale")
    try:
        n = 8_000
        df = spark.range(1, n + 1, numPartitions=6).withColumnRenamed("id", "i")

        def with_df(tmp: Path, parallelism: int, held: bool = True):
            # held: each task of a hop reads at most 600 rows, so no hop can
            # end before its stop (at most 3,600 of 8,000 in all)
            p = Pipeline("rescale", parallelism=parallelism, batch_size=64,
                         checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk")))
            (p.source(HeldDataFrame(df, most=600) if held else DataFrameSource(df),
                      uid="numbers")
               .map(throttle, uid="slow")
               .map(lambda r: (r["i"] % KEYS, r["i"]), uid="pairs")
               .key_by(lambda kv: kv[0])
               .reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sums")
               .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
            return p

        savepoint = None
        for p in HOPS:
            client = start_and_await(with_df(tmp_path, p), launcher="local",
                                     from_savepoint=savepoint)
            result = client.stop(str(tmp_path / "savepoints"))
            assert result.status == "stopped", result
            savepoint = result.savepoint
        final = with_df(tmp_path, 2, held=False).run(launcher="local",
                                                     from_savepoint=savepoint)
        assert final.status == "finished"
        check_running_sums(committed_lines(tmp_path / "out"), n, KEYS)
    finally:
        spark.stop()
