"""The Arrow path's parts, each against the row path or a plain-Python
reference: key-group routing, the aggregate operator's merge and state,
the IPC frame codec, the Parquet batch reader's positions, the file sink's
Parquet batches."""

from __future__ import annotations

import io
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lockgate import Pipeline
from lockgate.api.arrow import ArrowAggregate, ColumnKey
from lockgate.api.plan import OperatorKind
from lockgate.connectors import FileSource
from lockgate.connectors.base import TaskInfo
from lockgate.connectors.formats import ParquetFormat
from lockgate.connectors.parquet import ArrowSource
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.protocol import Batch, ProtocolError
from lockgate.runtime import wire
from lockgate.runtime.arrow_ops import (
    LUT_LIMIT,
    ArrowAggregateOperator,
    KeyRouter,
    split_by_target,
)
from lockgate.runtime.arrow_wire import decode_arrow, encode_arrow
from lockgate.state.keygroups import KeyGroupAssigner, key_group_for_key
from lockgate.state.serde import StateSerializer

M = 128


def _row_targets(keys: list, n: int) -> list[int]:
    return [key_group_for_key(k, M) * n // M for k in keys]


@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("keys", [
    list(range(-500, 500)) * 3,  # small ints: the lookup table
    [random.Random(1).randrange(-2**63, 2**63) for _ in range(2000)],  # sparse: dictionary
    [f"user-{i % 37}" for i in range(1000)],
    [None, 1, None, 2, 3] * 10,
    [0, 2**40, 5, 2**40 + 1],
])
def test_rows_go_to_the_key_group_the_row_path_gives(keys, n):
    router = KeyRouter(M, n)
    arr = pa.array(keys)
    assert router.targets(arr).tolist() == _row_targets(keys, n)
    # a second batch with new keys, some beyond the table's range: still the same
    more = [k + LUT_LIMIT * 2 if isinstance(k, int) else k for k in keys[:50]] + keys[:50]
    assert router.targets(pa.array(more)).tolist() == _row_targets(more, n)
    assert KeyGroupAssigner(M).route(keys, n) == _row_targets(keys, n)


def test_split_by_target_keeps_every_row_once_in_order():
    batch = pa.record_batch({"x": pa.array(range(1000))})
    for n in (1, 2, 4, 9):
        targets = np.array([random.Random(n).randrange(n) for _ in range(1000)], dtype=np.int32)
        parts = split_by_target(batch, targets, n)
        for i, part in parts:
            xs = part.column("x").to_pylist()
            assert xs == [x for x in range(1000) if targets[x] == i]
        assert sorted(x for _, p in parts for x in p.column("x").to_pylist()) == list(range(1000))


def _aggregate(task: int = 0, parallelism: int = 1) -> ArrowAggregateOperator:
    plan = ArrowAggregate("k", (("total", "v", "sum"), ("n", "v", "count"), ("lo", "v", "min"),
                                ("hi", "v", "max"), ("avg", "v", "mean")))
    spec = OperatorSpec("sums", OperatorKind.ARROW_AGGREGATE, plan, ColumnKey("k"))
    op = ArrowAggregateOperator(spec, TaskInfo("job", "sums", task, parallelism, M, 0))
    op.open(StateSerializer())
    return op


def _reference(rows: list[tuple]) -> dict:
    seen: dict = {}
    for k, v in rows:
        seen.setdefault(k, [])
        if v is not None:
            seen[k].append(v)
    return {k: {"total": sum(vs) if vs else None, "n": len(vs), "lo": min(vs, default=None),
                "hi": max(vs, default=None), "avg": sum(vs) / len(vs) if vs else None}
            for k, vs in seen.items()}


def test_aggregate_merges_batches_like_a_python_reference_nulls_included():
    rng = random.Random(3)
    op = _aggregate()
    rows: list[tuple] = []
    last: dict = {}
    for b in range(30):
        batch = [(rng.choice(["a", "b", "c", None]), None if rng.random() < 0.2 else
                  rng.randrange(-1000, 1000)) for _ in range(rng.randrange(1, 60))]
        if b == 7:
            batch = [("only-nulls", None), ("only-nulls", None)]
        rows += batch
        out = op.process(pa.record_batch({"k": [k for k, _ in batch],
                                          "v": pa.array([v for _, v in batch], pa.int64())}))
        emitted = out.to_pylist()
        # one row per key of the batch, with its aggregates over all it saw so far
        assert sorted((r["k"] is None, r["k"] or "") for r in emitted) == \
            sorted((k is None, k or "") for k in {k for k, _ in batch})
        for r in emitted:
            last[r["k"]] = {c: r[c] for c in ("total", "n", "lo", "hi", "avg")}
        ref = _reference(rows)
        for k, agg in last.items():
            want = ref[k]
            assert {c: agg[c] for c in ("total", "n", "lo", "hi")} == \
                {c: want[c] for c in ("total", "n", "lo", "hi")}, k
            assert (agg["avg"] is None) == (want["avg"] is None)
            if want["avg"] is not None:
                assert agg["avg"] == pytest.approx(want["avg"])
    assert last["only-nulls"] == {"total": None, "n": 0, "lo": None, "hi": None, "avg": None}


def test_aggregate_state_is_one_tuple_per_key_and_survives_a_snapshot():
    op = _aggregate()
    op.process(pa.record_batch({"k": [1, 2, 1], "v": [10, 20, 30]}))
    snap = op.snapshot(1).keyed
    assert snap is not None
    values = op.backend.raw("aggregate_arrow")  # type: ignore[union-attr]
    # slots: v sum, v count, v min, v max (mean reads the sum and the count)
    assert values == {1: (40, 2, 10, 30), 2: (20, 1, 20, 20)}
    op.process(pa.record_batch({"k": [1], "v": [5]}))
    assert values[1] == (45, 3, 5, 30)
    restored = _aggregate()
    restored.backend.raw("aggregate_arrow").update({1: (40, 2, 10, 30)})  # type: ignore[union-attr]
    out = restored.process(pa.record_batch({"k": [1], "v": [5]})).to_pylist()
    assert out == [{"k": 1, "total": 45, "n": 3, "lo": 5, "hi": 30, "avg": 15.0}]


def test_aggregate_api_checks_its_arguments():
    p = Pipeline("x")
    keyed = p.source_arrow(FileSource("/tmp", format="parquet")).key_by_column("k")
    with pytest.raises(PipelineDefinitionError, match="how must be one of"):
        keyed.aggregate_arrow(total=("v", "median"))
    with pytest.raises(PipelineDefinitionError, match="at least one"):
        keyed.aggregate_arrow()
    with pytest.raises(PipelineDefinitionError, match="hide the key"):
        keyed.aggregate_arrow(k=("v", "sum"))
    with pytest.raises(PipelineDefinitionError, match="reads Parquet"):
        p.source_arrow(FileSource("/tmp", format="jsonl"))


def test_ipc_frames_round_trip_and_reject_garbage():
    a = pa.record_batch({"x": pa.array([1, 2, None]), "s": ["a", None, "c"]})
    b = pa.record_batch({"x": pa.array([4]), "s": ["d"]})
    got = wire.decode_element(wire.Frame.ARROW_BATCH, encode_arrow([a, b]))
    assert isinstance(got, Batch) and got.records.equals(pa.concat_batches([a, b]))
    assert decode_arrow(encode_arrow([a.slice(0, 0)])).num_rows == 0
    payload = encode_arrow([a])
    for bad in (b"", b"not arrow", payload[: len(payload) // 2], payload[:-9] + b"\xff" * 9):
        with pytest.raises(ProtocolError):
            decode_arrow(bad)


def _parquet_input(tmp_path, n: int = 1000) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"x": pa.array(range(i, n, 3), pa.int64())}),
                       folder / f"f{i}.parquet", row_group_size=70)
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), folder / "f3.parquet")


def _read_all(reader, stop_after: int | None = None) -> list[int]:
    xs: list[int] = []
    while (b := reader.poll(1024)) is not None:
        if len(b):
            assert isinstance(b, pa.RecordBatch)
            xs += b.column("x").to_pylist()
            if stop_after is not None and len(xs) >= stop_after:
                break
    return xs


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_parquet_batches_resume_exactly_from_a_snapshot(tmp_path, parallelism):
    """Rows read before a snapshot plus rows read after restoring it, by
    every task: each input row once, at any parallelism (union state)."""
    _parquet_input(tmp_path)
    source = ArrowSource(FileSource(str(tmp_path / "in"), format="parquet"), batch_rows=64)
    before: list[int] = []
    entries: list = []
    for t in range(2):
        r = source.create_reader(TaskInfo("j", "numbers", t, 2, M, 0))
        r.restore(None)
        before += _read_all(r, stop_after=150 + 40 * t)
        entries += r.snapshot_state(1)
        r.close()
    after: list[int] = []
    for t in range(parallelism):
        r = source.create_reader(TaskInfo("j", "numbers", t, parallelism, M, 1))
        r.restore(entries)
        after += _read_all(r)
    assert sorted(before + after) == list(range(1000))
    assert all(e["offset"] >= 0 for e in entries)


def test_parquet_batches_keep_the_row_readers_positions(tmp_path):
    """The same snapshot entries whether the files are read as rows or batches."""
    _parquet_input(tmp_path)
    rows_reader = FileSource(str(tmp_path / "in"), format="parquet").create_reader(
        TaskInfo("j", "numbers", 0, 1, M, 0))
    rows_reader.restore(None)
    rows_reader.poll(200)
    rows_reader.poll(200)
    batch_reader = ArrowSource(FileSource(str(tmp_path / "in"), format="parquet"),
                               batch_rows=1000).create_reader(TaskInfo("j", "numbers", 0, 1, M, 0))
    batch_reader.restore(rows_reader.snapshot_state(1))
    rest = _read_all(batch_reader)
    assert len(rest) == 1000 - 400 and len(set(rest)) == len(rest)


def test_parquet_format_writes_batches_without_rows_and_unifies_schemas():
    f = io.BytesIO()
    a = pa.record_batch({"k": [1, 2], "v": [1.0, 2.0]})
    b = pa.record_batch({"k": [3], "v": pa.array([None], pa.float64())})
    ParquetFormat().write_batches(f, [a, b], [])
    assert pq.read_table(io.BytesIO(f.getvalue())).to_pylist() == \
        [{"k": 1, "v": 1.0}, {"k": 2, "v": 2.0}, {"k": 3, "v": None}]
    f = io.BytesIO()
    ParquetFormat().write_batches(f, [a, pa.record_batch({"k": [4]})], [])
    assert pq.read_table(io.BytesIO(f.getvalue())).column("k").to_pylist() == [1, 2, 4]


def test_filter_and_map_steps():
    from lockgate.api.arrow import ArrowStep
    from lockgate.runtime.arrow_ops import ArrowStepOperator

    def op(step):
        spec = OperatorSpec("s", OperatorKind.ARROW, step)
        return ArrowStepOperator(spec, TaskInfo("j", "s", 0, 1, M, 0))

    batch = pa.record_batch({"x": [1, 5, None, 9]})
    assert op(ArrowStep("filter", lambda b: pc.greater(b["x"], 2))).process(batch) \
        .column("x").to_pylist() == [5, 9]
    assert op(ArrowStep("filter", lambda b: np.array([True, False, True, False]))) \
        .process(batch).column("x").to_pylist() == [1, None]
    doubled = op(ArrowStep("map", lambda b: pa.table({"y": pc.multiply(b["x"], 2)})))
    assert doubled.process(batch).column("y").to_pylist() == [2, 10, None, 18]
    with pytest.raises(TypeError, match="must return a pyarrow.RecordBatch"):
        op(ArrowStep("map", lambda b: [1])).process(batch)
    assert op(ArrowStep("to_rows")).process(batch)[1] == {"x": 5}
    back = op(ArrowStep("to_arrow")).process([{"x": 1}, {"x": 2}])
    assert back.column("x").to_pylist() == [1, 2]
    assert op(ArrowStep("to_arrow")).process([1, 2]).column("value").to_pylist() == [1, 2]


def test_the_numpy_path_and_arrows_group_by_agree():
    """Integer keys without nulls take numpy's path (a table of slots,
    ``np.add.at``); the same batches through Arrow's group-by give the same
    rows and state, also once a sum might overflow (the group-by then)."""
    rng = random.Random(9)
    fast, slow = _aggregate(), _aggregate()
    slow._partials_by_table = lambda batch: None  # type: ignore[method-assign]
    for i in range(20):
        size = rng.randrange(1, 3000)
        ks = [rng.randrange(-50, 50) for _ in range(size)]
        vs = [rng.randrange(-10**6, 10**6) for _ in range(size)]
        if i == 13:
            vs[0] = 2**62  # sum might overflow int64 in the batch: not numpy's path
        batch = pa.record_batch({"k": pa.array(ks, pa.int64()), "v": pa.array(vs, pa.int64())})
        if i != 13:
            assert fast._partials_by_table(batch) is not None
        a, b = fast.process(batch), slow.process(batch)
        key = lambda r: r["k"]
        assert sorted(a.to_pylist(), key=key) == sorted(b.to_pylist(), key=key)
    assert fast.backend.raw("aggregate_arrow") == slow.backend.raw("aggregate_arrow")  # type: ignore[union-attr]


def test_integer_sums_near_the_limit_are_exact_and_an_overflow_fails():
    """Arrow's group-by wraps int64 sums; the operator does not: sums that
    might overflow are added exactly, and a real overflow fails the batch."""
    op = _aggregate()
    big = 2**62
    out = op.process(pa.record_batch({"k": pa.array(["a", "a", "b", "b", "b"]),
                                      "v": pa.array([big, -big, big, big - 7, -big],
                                                    pa.int64())}))
    assert {r["k"]: r["total"] for r in out.to_pylist()} == {"a": 0, "b": big - 7}
    out = op.process(pa.record_batch({"k": pa.array([3, 3, -1]),
                                      "v": pa.array([-big, -big, -5], pa.int64())}))
    assert {r["k"]: r["total"] for r in out.to_pylist()} == {3: -2 * big, -1: -5}
    with pytest.raises((pa.ArrowInvalid, OverflowError)):
        op.process(pa.record_batch({"k": pa.array(["x", "x"]),
                                    "v": pa.array([big, big], pa.int64())}))
    with pytest.raises((pa.ArrowInvalid, OverflowError)):  # in the merge with the state
        op.process(pa.record_batch({"k": pa.array(["b", "b"]),
                                    "v": pa.array([big, 10], pa.int64())}))
