"""Several files read by one task under event time: a watermark per file.

Two JSONL files whose event times overlap (the second 8 s behind the first,
bound 10 s) are read by one task: the task reads them interleaved and emits
the smallest of the unfinished files' watermarks, so no record is late.
Read one file after the other under one watermark, about half the records
were late. The Arrow path (Parquet files as record batches) reads its files
in turn the same way and names the file of every batch.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from lockgate import (
    CheckpointConfig,
    OutputTag,
    Pipeline,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from lockgate.connectors import FileSink, FileSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.parquet import ArrowSource
from tests.fixtures import committed_lines

N = 10_005
"""Records per file (10 ms apart)."""
LATE = OutputTag("late")


def _write_files(folder: Path) -> list[dict]:
    folder.mkdir()
    records = []
    for name, start in (("a.jsonl", 8_000), ("b.jsonl", 0)):
        rows = [{"file": name, "ts": start + 10 * i} for i in range(N)]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        records += rows
    return records


def test_two_overlapping_files_one_task_no_record_late(tmp_path: Path) -> None:
    records = _write_files(tmp_path / "in")
    p = Pipeline("two-files", parallelism=1, batch_size=100,
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp_path / "chk")))
    windowed = (p.source(FileSource(str(tmp_path / "in")), uid="files",
                         watermarks=WatermarkStrategy(lambda r: r["ts"], 10_000, interval=0))
                .key_by(lambda r: r["file"])
                .window(TumblingEventTimeWindows.of(1_000))
                .side_output_late_data(LATE)
                .reduce(lambda a, b: {**a, "n": a.get("n", 1) + b.get("n", 1)}, uid="counts"))
    windowed.sink(FileSink(str(tmp_path / "out"), format="jsonl"), uid="out")
    windowed.side_output(LATE).sink(FileSink(str(tmp_path / "late"), format="jsonl"),
                                    uid="late-out")
    result = p.run(launcher="local")
    assert result.status == "finished", result.failures
    late = committed_lines(tmp_path / "late")
    assert late == [], f"{len(late)} of {len(records)} records went to the late output"
    got = Counter()
    for w in committed_lines(tmp_path / "out"):
        got[w["file"]] += w.get("n", 1)
    assert got == Counter({"a.jsonl": N, "b.jsonl": N})


def test_arrow_reads_the_files_of_a_task_in_turn(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    folder.mkdir()
    for name, start in (("a.parquet", 8_000), ("b.parquet", 0)):
        pq.write_table(pa.table({"ts": [start + 10 * i for i in range(1_000)]}),
                       folder / name, row_group_size=100)
    source = ArrowSource(FileSource(str(folder), format="parquet"), batch_rows=100)
    reader = source.create_reader(TaskInfo("job", "files", 0, 1, 128, 0))
    reader.restore(None)
    seen = []
    while (batch := reader.poll(100)) is not None:
        if len(batch):
            seen.append(reader.last_split)
            assert reader.last_split in ("a.parquet", "b.parquet")
    reader.close()
    assert seen[:4] == ["a.parquet", "b.parquet", "a.parquet", "b.parquet"], seen
    assert Counter(seen) == {"a.parquet": 10, "b.parquet": 10}
    assert reader.unfinished_splits() == []
