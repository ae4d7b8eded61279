"""Keyed state as Spark DataFrames: read it from a checkpoint or savepoint,
and bootstrap a savepoint from a DataFrame (Flink's State Processor API).

Reading::

    from lockgate.spark import read_state
    df = read_state(spark, "chk/sums-1a2b3c4d/chk-12", uid="sums", state_name="reduce")
    df.show()   # key | state | value

Writing (a savepoint a job starts from, ``Pipeline.run(from_savepoint=path)``)::

    from lockgate.spark import write_savepoint
    write_savepoint(spark, balances, "savepoints/bootstrap", uid="sums",
                    state_name="reduce", key="account", max_parallelism=128)

State names: the built-in ``reduce`` keeps its running value in the value
state ``"reduce"``; a ``KeyedProcessFunction``'s states are named by its state
descriptors (``ValueStateDescriptor("count")`` -> ``"count"``). Sources and
sinks hold operator state (read positions, pending transactions), not keyed
state: ``read_state`` lists what an operator has.

Nothing here unpickles: state is decoded with Lockgate's msgpack serializer
(:class:`lockgate.state.serde.StateSerializer` without pickle), and a
checkpoint of a job that opted in to pickle is refused where it holds pickled
values.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lockgate import fs
from lockgate.checkpoint import storage
from lockgate.checkpoint.kinds import CheckpointKind, OperatorStateMode
from lockgate.checkpoint.metadata import CheckpointMetadata, OperatorMetadata, StateHandle
from lockgate.connectors.dataframe import materialize_dataframe
from lockgate.errors import CheckpointCorruptError, LockgateError
from lockgate.spark.schema import Sig, converter, merge_signatures, spark_type, value_signature
from lockgate.state.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    check_parallelism,
    key_group_for_key,
    task_for_key_group,
)
from lockgate.state.serde import StateSerializationError, StateSerializer

__all__ = [
    "StateNotFoundError",
    "read_state",
    "write_savepoint",
]

BUILTIN_STATE_NAMES = {"reduce": "reduce"}
"""Operator kind -> the name of its keyed state (built-in operators)."""
_UID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_BOOTSTRAP_INPUT = ".bootstrap-input"


class StateNotFoundError(LockgateError, LookupError):
    """The checkpoint has no such operator uid or state name."""


def _identity(v: Any) -> Any:
    return v


# ------------------------------------------------------------------ reading


def _load_metadata(path: str) -> tuple[str, CheckpointMetadata]:
    chk = fs.absolute(path)
    if not fs.exists(fs.join(chk, storage.METADATA)):
        shown = fs.redact(chk)
        if not fs.is_dir(chk):
            raise CheckpointCorruptError(
                f"{shown} does not exist; give a completed checkpoint folder (chk-N) or a "
                "savepoint folder")
        latest = storage.latest_completed(chk)
        if latest is not None:
            raise CheckpointCorruptError(
                f"{shown} is a job's checkpoint folder, not a checkpoint (it has no "
                f"{storage.METADATA}); read one of its completed checkpoints, e.g. "
                f"{fs.redact(latest)}")
        raise CheckpointCorruptError(
            f"{shown} has no {storage.METADATA}: it is not a completed checkpoint or a "
            "savepoint (a checkpoint without it never completed); give a chk-N folder that "
            f"has {storage.METADATA}, or a savepoint folder")
    return chk, storage.read_metadata(chk)


def _state_names(op: OperatorMetadata) -> dict[str, str]:
    names: dict[str, str] = {}
    for handle in op.subtasks:
        if handle:
            names.update(handle.states)
    return names


def _read_entries(chk: str, state_name: str,
                  handles: Iterable[StateHandle]) -> Iterator[list[Any]]:
    """``(key, value)`` of ``state_name`` in the given state files (an executor
    runs this): size and CRC-32 checked, decoded without pickle."""
    serializer = StateSerializer(allow_pickle=False)
    for handle in handles:
        data = storage.read_state_file(chk, handle)
        base = handle.keyed_offset
        for offset, length in handle.key_groups.values():
            start = base + offset
            try:
                _, content = serializer.loads(data[start:start + length])
            except StateSerializationError as e:
                raise StateSerializationError(
                    f"state file {handle.file}: {e}. read_state never unpickles: read it "
                    "in a job with Pipeline(allow_pickle=True) if you trust it") from None
            yield from content.get(state_name, ())  # [key, value] pairs


def _signatures(rows: Iterable[list[Any]]) -> Iterator[tuple[Sig, Sig]]:
    ks: Sig = "null"
    vs: Sig = "null"
    for k, v in rows:
        ks = merge_signatures(ks, value_signature(k))
        vs = merge_signatures(vs, value_signature(v))
    yield ks, vs


def _to_row(state_name: str, key_conv: Callable[[Any], Any],
            value_conv: Callable[[Any], Any], kv: list[Any]) -> tuple[Any, str, Any]:
    return key_conv(kv[0]), state_name, value_conv(kv[1])


def read_state(spark: Any, path: str, uid: str, state_name: str) -> Any:
    """The keyed state ``state_name`` of operator ``uid`` in the completed
    checkpoint or savepoint folder ``path``, as a DataFrame with the columns
    ``key``, ``state`` (the state name) and ``value``.

    A column is typed when all its values fit one Spark type: ``int`` ->
    bigint, ``float`` -> double, ``str``, ``bytes``, ``bool``, ``date``,
    ``datetime`` -> timestamp, lists -> arrays, dicts with the same string keys
    -> structs (with varying keys -> maps), other dicts -> maps. Otherwise
    (mixed types, tuples, sets, decimals, ints beyond 64 bits) the column is
    JSON text (:func:`lockgate.spark.schema.to_json_text`). List state gives
    a list per key, map state a dict per key.

    The state files are read by Spark tasks (one per state file), which must
    reach ``path``; the DataFrame reads them whenever it is evaluated (twice:
    once to find the types, once for the rows): ``cache()`` it if the
    checkpoint may be deleted meanwhile by retention (savepoints never are).
    """
    chk, meta = _load_metadata(path)
    operators = meta.operators
    if uid not in operators:
        raise StateNotFoundError(
            f"{fs.redact(chk)} has no state of operator uid {uid!r}; its operator uids: "
            f"{sorted(operators)}")
    op = operators[uid]
    names = _state_names(op)
    if state_name not in names:
        if not names:
            raise StateNotFoundError(
                f"operator {uid!r} has no keyed state in {fs.redact(chk)} (sources and sinks "
                "hold operator state only: read positions, pending transactions); give the "
                "uid of a reduce or process operator")
        raise StateNotFoundError(
            f"operator {uid!r} has no state named {state_name!r} in {fs.redact(chk)}; its "
            f"states: {sorted(names)} (reduce keeps its value in 'reduce'; a "
            "KeyedProcessFunction's states are named by its state descriptors)")
    if any(h.incremental is not None for h in op.subtasks if h):
        raise StateNotFoundError(
            f"{fs.redact(chk)} is an incremental checkpoint of the RocksDB state backend: "
            f"the state of {uid!r} is in RocksDB's files, not in key-group blocks; take a "
            "savepoint of the job (savepoints are canonical) and read that")
    storage.verify_files(chk, ((uid, h) for h in op.subtasks if h))
    handles = [h for h in op.subtasks if h and h.key_groups]
    sc = spark.sparkContext
    rdd = sc.parallelize(handles, max(1, len(handles))).mapPartitions(
        functools.partial(_read_entries, chk, state_name))
    ks: Sig = "null"
    vs: Sig = "null"
    try:
        signatures = rdd.mapPartitions(_signatures).collect()
    except Exception as e:
        message = _executor_error(e)
        if message is None:
            raise
        raise StateSerializationError(message) from None
    for k_sig, v_sig in signatures:
        ks, vs = merge_signatures(ks, k_sig), merge_signatures(vs, v_sig)
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("key", spark_type(ks), True),
        T.StructField("state", T.StringType(), False),
        T.StructField("value", spark_type(vs), True),
    ])
    rows = rdd.map(functools.partial(_to_row, state_name, converter(ks), converter(vs)))
    return spark.createDataFrame(rows, schema)


# ------------------------------------------------------------------ writing


def _column(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row[name]


def _keyed_entries(folder: str, key_fn: Callable[[dict[str, Any]], Any],
                   value_fn: Callable[[dict[str, Any]], Any], max_parallelism: int,
                   parallelism: int, files: Iterable[str]
                   ) -> Iterator[tuple[int, tuple[int, bytes, bytes]]]:
    """``(subtask, (key group, key bytes, value bytes))`` of every row of the
    materialized files (an executor runs this), hashed as the runtime does."""
    import pyarrow.parquet as pq

    dumps = StateSerializer(allow_pickle=False).dumps
    for name in files:
        location = fs.join(folder, name)
        local = fs.local_path(location)
        if local is not None:
            table = pq.read_table(local)
        else:
            filesystem, p = fs.resolve(location)
            table = pq.read_table(p, filesystem=filesystem)
        for row in table.to_pylist():
            value = value_fn(row)
            if value is None:  # a ValueState of None is no state
                continue
            key = key_fn(row)
            kg = key_group_for_key(key, max_parallelism)
            try:
                kb, vb = dumps(key), dumps(value)
            except StateSerializationError as e:
                raise LockgateError(f"write_savepoint: row {row!r}: {e}") from None
            yield task_for_key_group(kg, parallelism, max_parallelism), (kg, kb, vb)


def _write_subtask(path: str, uid: str, state_name: str, index: int,
                   entries: Iterable[tuple[int, tuple[int, bytes, bytes]]]
                   ) -> Iterator[tuple[int, StateHandle]]:
    """Write subtask ``index``'s state file as the runtime does (one block per
    key group, ascending) and yield its handle (an executor runs this)."""
    serializer = StateSerializer(allow_pickle=False)
    groups: dict[int, dict[bytes, bytes]] = {}
    for _, (kg, kb, vb) in entries:
        group = groups.setdefault(kg, {})
        if kb in group:
            raise LockgateError(
                f"write_savepoint: key {serializer.loads(kb)!r} occurs in more than one row, "
                f"but a value state holds one value per key; aggregate the DataFrame by key "
                "first (groupBy)")
        group[kb] = vb
    if not groups:
        return
    name = f"{uid}-{index}.state"
    offsets: dict[int, tuple[int, int]] = {}

    def write(out: storage.ChecksumWriter) -> None:
        pos = 0
        for kg in sorted(groups):
            entries = [[serializer.loads(kb), serializer.loads(vb)]
                       for kb, vb in sorted(groups[kg].items())]
            blob = serializer.dumps([kg, {state_name: entries}])
            out.write(blob)
            offsets[kg] = (pos, len(blob))
            pos += len(blob)

    size, crc = storage.write_state_file(path, name, write)
    yield index, StateHandle(name, size, crc, 0, offsets, {state_name: "value"})


def _executor_error(e: Exception) -> str | None:
    """The LockgateError message a Spark task failed with, if any."""
    for line in str(e).splitlines():
        m = _EXECUTOR_ERROR_RE.match(line.strip())
        if m:
            return m.group(1)
    return None


_EXECUTOR_ERROR_RE = re.compile(r"^lockgate\.[\w.]+Error: (.*)$")


def write_savepoint(spark: Any, df: Any, path: str, uid: str, state_name: str, *,
                    key: str | Callable[[dict[str, Any]], Any],
                    value: str | Callable[[dict[str, Any]], Any] | None = None,
                    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
                    parallelism: int = 1) -> str:
    """Write a new savepoint folder ``path`` holding the value state
    ``state_name`` of the keyed operator ``uid``: one entry per row of ``df``.

    Args:
        spark: the SparkSession (its tasks write the state files).
        df: the rows; each is seen as the ``dict`` a
            :meth:`~lockgate.Pipeline.source_dataframe` record would be.
        path: the savepoint folder to create (must not exist, or be empty).
        uid: the operator's uid in the job that will start from it.
        state_name: the state's name (``"reduce"`` for a ``reduce``; a
            ``ValueStateDescriptor``'s name for a ``KeyedProcessFunction``).
        key: a column name, or a function of the row: the key, exactly as the
            job's ``key_by`` selector returns it (same value and type: it is
            hashed into a key group as the runtime does).
        value: a column name, a function of the row, or ``None`` for the whole
            row (a dict). Rows whose value is ``None`` are skipped. A key may
            occur once.
        max_parallelism: must equal the job's ``Pipeline(max_parallelism=...)``.
        parallelism: the number of state files (the savepoint restores at any
            parallelism).

    Returns the savepoint folder, for ``Pipeline.run(from_savepoint=...)``.
    The other operators of the job start empty (a source from its beginning).
    """
    if not _UID_RE.match(uid):
        raise LockgateError(f"uid {uid!r} may only contain letters, digits, '_', '-' and '.'")
    if not isinstance(state_name, str) or not state_name:
        raise LockgateError("write_savepoint: state_name must be a non-empty string")
    try:
        check_parallelism(parallelism, max_parallelism)
    except ValueError as e:
        raise LockgateError(f"write_savepoint: {e}") from None
    for what, spec in (("key", key), ("value", value)):
        if isinstance(spec, str) and spec not in df.columns:
            raise LockgateError(
                f"write_savepoint: {what} column {spec!r} is not a column of the DataFrame "
                f"(its columns: {df.columns})")
    key_fn = _column(key) if isinstance(key, str) else key
    value_fn = (_identity if value is None else _column(value) if isinstance(value, str)
                else value)
    target = fs.absolute(path)
    if fs.exists(target) and (not fs.is_dir(target) or fs.listdir(target)):
        raise LockgateError(
            f"{fs.redact(target)} already exists; a savepoint is never overwritten: give a "
            "new folder")
    fs.makedirs(target)
    # Step 1. The rows, as the DataFrame source would see them.
    staging = fs.join(target, _BOOTSTRAP_INPUT)
    files = materialize_dataframe(df, staging)
    # Step 2. Hash, group by subtask, write one state file per subtask.
    sc = spark.sparkContext
    try:
        handles = dict(
            sc.parallelize(files, max(1, len(files)))
            .mapPartitions(functools.partial(_keyed_entries, staging, key_fn, value_fn,
                                             max_parallelism, parallelism))
            .partitionBy(parallelism, _identity)
            .mapPartitionsWithIndex(functools.partial(_write_subtask, target, uid, state_name))
            .collect())
    except Exception as e:
        message = _executor_error(e)
        if message is None:
            raise
        raise LockgateError(message) from None
    finally:
        fs.rmtree(staging)
    # Step 3. _metadata, last: now the savepoint exists.
    metadata = CheckpointMetadata(
        job_id=f"bootstrap-{uid}", checkpoint_id=0, kind=CheckpointKind.SAVEPOINT,
        timestamp=time.time(), final=False, max_parallelism=max_parallelism,
        operators={uid: OperatorMetadata(parallelism, OperatorStateMode.SPLIT,
                                         [handles.get(i) for i in range(parallelism)])})
    storage.write_metadata(target, metadata)
    return target
